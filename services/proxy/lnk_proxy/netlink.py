"""Route netlink (`NETLINK_ROUTE`) as the proxy speaks it: encode an `RTM_GETROUTE` or
`RTM_GETLINK` request, decode the kernel's one answer. Pure: bytes in, values out; no socket.

The wire format (linux/netlink.h, linux/rtnetlink.h, linux/if_link.h), host byte order:

    nlmsghdr  u32 len, u16 type, u16 flags, u32 seq, u32 pid                       16 bytes
    rtmsg     u8 family, dst_len, src_len, tos, table, protocol, scope, type; u32 flags  12
    ifinfomsg u8 family, pad; u16 type; i32 index; u32 flags, change                16 bytes
    rtattr    u16 len (header included), u16 type, then the value; padded to 4 bytes
    nlmsgerr  i32 -errno, then the request's nlmsghdr

`encode_route_request(seq, address)` asks what `ip route get ADDRESS` asks (no source, no
interface, no mark: the kernel routes it as a socket of the asking process would be, its uid
included); `decode_route(data, seq)` reads the answer's type and output interface;
`encode_link_request` / `decode_link` do the same for one interface by index (its flags, name,
kind, and the kind of the master it is a port of). An error answer is `NetlinkError` with the
kernel's errno; anything malformed is `ValueError` (a truncated or overlong attribute, a wrong
sequence number, a message of another type), never a partial answer.

Does NOT: dump tables (`NLM_F_DUMP`), follow multipath routes past the one the kernel picked,
or read any attribute but those named here; everything else in an answer is skipped by its
length.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass

from lnk_shared.addresses import IPAddress

__all__ = [
    "CHANGE_GROUPS",
    "RTN_LOCAL",
    "RTN_UNICAST",
    "LinkAnswer",
    "NetlinkError",
    "RouteAnswer",
    "decode_link",
    "decode_route",
    "encode_link_request",
    "encode_route_request",
    "is_change_message",
]

_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_RTMSG = struct.Struct("=BBBBBBBBI")
_IFINFO = struct.Struct("=BxHiII")
_ATTR = struct.Struct("=HH")
_ERROR = struct.Struct("=i")

NLM_F_REQUEST = 0x1
NLMSG_ERROR = 2
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_NEWADDR, RTM_DELADDR = 20, 21
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RTM_NEWRULE, RTM_DELRULE = 32, 33
RTA_DST, RTA_OIF, RTA_GATEWAY = 1, 4, 5
IFLA_IFNAME, IFLA_MASTER, IFLA_LINKINFO = 3, 10, 18
IFLA_INFO_KIND, IFLA_INFO_SLAVE_KIND = 1, 4
NLA_TYPE_MASK = 0x3FFF  # the top two bits are the nested and byte-order flags
AF_INET, AF_INET6 = 2, 10

# Route types (rtm_type): what the kernel does with a packet to that address.
RTN_UNICAST, RTN_LOCAL, RTN_BROADCAST, RTN_ANYCAST, RTN_MULTICAST = 1, 2, 3, 4, 5

# Multicast groups whose messages mean "this machine's links, addresses, routes or routing
# rules changed": RTMGRP_LINK, RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE, RTMGRP_IPV4_RULE,
# RTMGRP_IPV6_IFADDR, RTMGRP_IPV6_ROUTE, and RTNLGRP_IPV6_RULE (group 19: bit 1 << 18). The
# rules matter because `route_check` keeps the kernel's answer per address until a change.
CHANGE_GROUPS = 0x1 | 0x10 | 0x40 | 0x80 | 0x100 | 0x400 | (1 << 18)
_CHANGE_TYPES = frozenset(
    {
        *(RTM_NEWLINK, RTM_DELLINK, RTM_NEWADDR, RTM_DELADDR),
        *(RTM_NEWROUTE, RTM_DELROUTE, RTM_NEWRULE, RTM_DELRULE),
    }
)
MAX_IFNAME = 16  # IFNAMSIZ, the terminating NUL included
MAX_KIND = 64  # kinds are short words (bridge, openvswitch, macvlan); longer is malformed


class NetlinkError(OSError):
    """The kernel answered with an error (errno set): for a route, no route to that address."""


@dataclass(frozen=True)
class RouteAnswer:
    type: int  # RTN_*
    oif: int | None  # the output interface's index; None for a route with none
    gateway: bool  # the route goes through a gateway (not on-link)


@dataclass(frozen=True)
class LinkAnswer:
    index: int
    name: str
    flags: int  # IFF_* (IFF_LOOPBACK = 0x8)
    kind: str  # IFLA_INFO_KIND: "bridge", "veth", "openvswitch", ...; "" for a physical one
    master: int | None  # the index of the device it is a port of
    port_kind: str  # IFLA_INFO_SLAVE_KIND: "bridge" for a bridge's port, "" for none


def _align(length: int) -> int:
    return (length + 3) & ~3


def _attr(kind: int, value: bytes) -> bytes:
    length = _ATTR.size + len(value)
    return _ATTR.pack(length, kind) + value + b"\0" * (_align(length) - length)


def _message(kind: int, seq: int, body: bytes) -> bytes:
    return _HEADER.pack(_HEADER.size + len(body), kind, NLM_F_REQUEST, seq, 0) + body


def encode_route_request(seq: int, address: IPAddress) -> bytes:
    """`RTM_GETROUTE` for exactly `address` (a host route: dst_len 32 or 128)."""
    family = AF_INET if address.version == 4 else AF_INET6
    rtmsg = _RTMSG.pack(family, address.max_prefixlen, 0, 0, 0, 0, 0, 0, 0)
    return _message(RTM_GETROUTE, seq, rtmsg + _attr(RTA_DST, address.packed))


def encode_link_request(seq: int, index: int) -> bytes:
    """`RTM_GETLINK` for the interface with index `index`."""
    if index <= 0:
        raise ValueError(f"not an interface index: {index}")
    return _message(RTM_GETLINK, seq, _IFINFO.pack(0, 0, index, 0, 0))


def _attributes(data: bytes, start: int, end: int) -> dict[int, bytes]:
    """type -> value of every attribute in data[start:end] (the last of a repeated type)."""
    found: dict[int, bytes] = {}
    at = start
    while at < end:
        if end - at < _ATTR.size:
            raise ValueError(f"a truncated attribute header at byte {at}")
        length, kind = _ATTR.unpack_from(data, at)
        if length < _ATTR.size or at + length > end:
            raise ValueError(f"an attribute of length {length} at byte {at} overruns its message")
        found[kind & NLA_TYPE_MASK] = data[at + _ATTR.size : at + length]
        at += _align(length)
    return found


def _one_message(data: bytes, seq: int, expected: int) -> tuple[int, int]:
    """(start, end) of the body of the one answer in `data`; NetlinkError for an error answer."""
    if len(data) < _HEADER.size:
        raise ValueError(f"an answer of {len(data)} bytes is shorter than a netlink header")
    length, kind, _, answer_seq, _ = _HEADER.unpack_from(data, 0)
    if length < _HEADER.size or length > len(data):
        raise ValueError(f"a message length of {length} in an answer of {len(data)} bytes")
    if answer_seq != seq:
        raise ValueError(f"the answer to request {answer_seq}, not {seq}")
    if kind == NLMSG_ERROR:
        if length < _HEADER.size + _ERROR.size:
            raise ValueError("a truncated error answer")
        (code,) = _ERROR.unpack_from(data, _HEADER.size)
        if code == 0:
            raise ValueError("an acknowledgement where an answer was expected")
        number = -code
        name = errno.errorcode.get(number, str(number))
        raise NetlinkError(number, f"{os.strerror(number)} ({name})")
    if kind != expected:
        raise ValueError(f"a message of type {kind} where {expected} was expected")
    return _HEADER.size, length


def decode_route(data: bytes, seq: int) -> RouteAnswer:
    """The kernel's answer to `encode_route_request(seq, ...)`."""
    start, end = _one_message(data, seq, RTM_NEWROUTE)
    if end - start < _RTMSG.size:
        raise ValueError("a route answer shorter than its rtmsg")
    route_type = _RTMSG.unpack_from(data, start)[7]
    attrs = _attributes(data, start + _RTMSG.size, end)
    oif = attrs.get(RTA_OIF)
    if oif is not None and len(oif) != 4:
        raise ValueError(f"an output interface of {len(oif)} bytes")
    index = struct.unpack("=I", oif)[0] if oif is not None else None
    return RouteAnswer(route_type, index, RTA_GATEWAY in attrs)


def _text(value: bytes | None, limit: int, what: str) -> str:
    if value is None:
        return ""
    text = value.split(b"\0", 1)[0]
    if len(text) >= limit:
        raise ValueError(f"{what} of {len(text)} bytes (at most {limit - 1})")
    return text.decode("ascii", errors="replace")


def decode_link(data: bytes, seq: int) -> LinkAnswer:
    """The kernel's answer to `encode_link_request(seq, ...)`."""
    start, end = _one_message(data, seq, RTM_NEWLINK)
    if end - start < _IFINFO.size:
        raise ValueError("a link answer shorter than its ifinfomsg")
    _, _, index, flags, _ = _IFINFO.unpack_from(data, start)
    attrs = _attributes(data, start + _IFINFO.size, end)
    info = attrs.get(IFLA_LINKINFO)
    nested = _attributes(info, 0, len(info)) if info is not None else {}
    master = attrs.get(IFLA_MASTER)
    if master is not None and len(master) != 4:
        raise ValueError(f"a master index of {len(master)} bytes")
    master_index = struct.unpack("=I", master)[0] if master is not None else 0
    return LinkAnswer(
        index=index,
        name=_text(attrs.get(IFLA_IFNAME), MAX_IFNAME, "an interface name"),
        flags=flags,
        kind=_text(nested.get(IFLA_INFO_KIND), MAX_KIND, "a link kind"),
        master=master_index or None,
        port_kind=_text(nested.get(IFLA_INFO_SLAVE_KIND), MAX_KIND, "a port kind"),
    )


def is_change_message(data: bytes) -> bool:
    """Whether a datagram from the change groups holds a link, address or route change (a
    truncated one counts: the caller reads the machine again rather than miss a change)."""
    at = 0
    while at + _HEADER.size <= len(data):
        length, kind, _, _, _ = _HEADER.unpack_from(data, at)
        if kind in _CHANGE_TYPES or length < _HEADER.size:
            return True
        at += _align(length)
    return at != len(data)
