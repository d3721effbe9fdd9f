"""The route netlink codec, on answers the kernel gave (`netlink_captured.txt`) and on the
malformed ones a broken or hostile peer could send: each decodes to exactly what `ip route get`
and `ip -d link show` printed, or fails whole."""

from __future__ import annotations

import errno
import ipaddress
import struct
from pathlib import Path

import pytest

from lnk_proxy import netlink
from lnk_proxy.netlink import LinkAnswer, NetlinkError, RouteAnswer

CAPTURED = Path(__file__).with_name("netlink_captured.txt")


def captured() -> dict[tuple[str, str], tuple[int, bytes]]:
    rows = {}
    for line in CAPTURED.read_text(encoding="ascii").splitlines():
        if line.startswith("#"):
            continue
        kind, address, seq, data = line.split()
        rows[(kind, address)] = (int(seq), bytes.fromhex(data))
    return rows


ANSWERS = captured()

ROUTES = [
    ("10.61.0.7", RouteAnswer(netlink.RTN_LOCAL, 1, gateway=False)),  # a lo prefix
    ("fd62::5", RouteAnswer(netlink.RTN_LOCAL, 1, gateway=False)),  # an IPv6 local route
    ("10.63.0.2", RouteAnswer(netlink.RTN_UNICAST, 2, gateway=False)),  # on a bridge
    ("10.64.0.2", RouteAnswer(netlink.RTN_UNICAST, 4, gateway=False)),  # on a veth
    ("10.65.0.3", RouteAnswer(netlink.RTN_UNICAST, 4, gateway=True)),  # via a gateway
    ("10.66.0.2", RouteAnswer(netlink.RTN_UNICAST, 7, gateway=False)),  # on a macvlan
    ("10.68.0.2", RouteAnswer(netlink.RTN_UNICAST, 6, gateway=False)),  # out of a bridge port
]


@pytest.mark.parametrize(("address", "expected"), ROUTES, ids=[r[0] for r in ROUTES])
def test_captured_route_answers(address: str, expected: RouteAnswer) -> None:
    seq, data = ANSWERS[("R", address)]
    assert netlink.decode_route(data, seq) == expected


LINKS = [
    ("10.61.0.7", LinkAnswer(1, "lo", 0x10049, "", None, "")),
    ("10.63.0.2", LinkAnswer(2, "br-guests", 0x11043, "bridge", None, "")),
    ("10.64.0.2", LinkAnswer(4, "up0", 0x11043, "veth", None, "")),
    ("10.66.0.2", LinkAnswer(7, "mv0", 0x11043, "macvlan", None, "")),
    ("10.68.0.2", LinkAnswer(6, "vport0", 0x11043, "veth", 2, "bridge")),
]


@pytest.mark.parametrize(("address", "expected"), LINKS, ids=[r[1].name for r in LINKS])
def test_captured_link_answers(address: str, expected: LinkAnswer) -> None:
    seq, data = ANSWERS[("L", address)]
    assert netlink.decode_link(data, seq) == expected


@pytest.mark.parametrize(
    ("address", "number"),
    [("10.67.0.1", errno.EHOSTUNREACH), ("8.8.8.8", errno.ENETUNREACH)],
    ids=["unreachable_route", "no_route"],
)
def test_captured_errors_carry_the_kernels_errno(address: str, number: int) -> None:
    seq, data = ANSWERS[("R", address)]
    with pytest.raises(NetlinkError) as caught:
        netlink.decode_route(data, seq)
    assert caught.value.errno == number


def test_the_route_request_is_what_ip_route_get_sends() -> None:
    # nlmsghdr(len 36, RTM_GETROUTE, NLM_F_REQUEST, seq 7, pid 0), rtmsg(AF_INET, /32), RTA_DST
    expected = bytes.fromhex("240000001a0001000700000000000000")
    expected += bytes.fromhex("022000000000000000000000080001000a3d0007")
    assert netlink.encode_route_request(7, ipaddress.ip_address("10.61.0.7")) == expected
    v6 = netlink.encode_route_request(8, ipaddress.ip_address("fd62::5"))
    assert len(v6) == 16 + 12 + 4 + 16 and v6[16:18] == bytes([10, 128])
    assert v6[-16:] == ipaddress.ip_address("fd62::5").packed


def test_the_link_request_names_one_index() -> None:
    data = netlink.encode_link_request(9, 6)
    assert len(data) == 32 and struct.unpack_from("=HH", data, 4) == (18, 1)
    assert struct.unpack_from("=i", data, 20) == (6,)
    with pytest.raises(ValueError, match="not an interface index"):
        netlink.encode_link_request(9, 0)


def _route_bytes(seq: int = 5) -> bytes:
    return (
        ANSWERS[("R", "10.63.0.2")][1][:8]
        + struct.pack("=I", seq)
        + ANSWERS[("R", "10.63.0.2")][1][12:]
    )


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda d: d[:10], "shorter than a netlink header"),
        (lambda d: struct.pack("=I", 4000) + d[4:], "a message length of 4000"),
        (lambda d: struct.pack("=I", 8) + d[4:], "a message length of 8"),
        (lambda d: d[:4] + struct.pack("=H", 16) + d[6:], "type 16 where 24"),
        (lambda d: d[:8] + struct.pack("=I", 6) + d[12:], "request 6, not 5"),
        (lambda d: struct.pack("=I", 20) + d[4:20], "shorter than its rtmsg"),
        (lambda d: d[:28] + struct.pack("=H", 200) + d[30:], "overruns its message"),
        (lambda d: d[:28] + struct.pack("=H", 2) + d[30:], "of length 2"),
        (lambda d: struct.pack("=I", 30) + d[4:30], "truncated attribute header"),
    ],
    ids=[
        "short",
        "long_length",
        "tiny_length",
        "wrong_type",
        "wrong_seq",
        "no_rtmsg",
        "overrun",
        "zero_attr",
        "half_attr",
    ],
)
def test_malformed_route_answers_fail_whole(mangle: object, message: str) -> None:
    data = mangle(_route_bytes())  # type: ignore[operator]
    with pytest.raises(ValueError, match=message):
        netlink.decode_route(data, 5)


def test_an_acknowledgement_is_not_an_answer() -> None:
    ack = struct.pack("=IHHII", 36, netlink.NLMSG_ERROR, 0, 5, 0) + struct.pack("=i", 0) + bytes(16)
    with pytest.raises(ValueError, match="acknowledgement"):
        netlink.decode_route(ack, 5)


def test_an_overlong_interface_name_fails() -> None:
    seq, data = ANSWERS[("L", "10.63.0.2")]
    name = struct.pack("=HH", 4 + 20, netlink.IFLA_IFNAME) + b"x" * 20
    body = data[16:32] + name
    forged = struct.pack("=IHHII", 16 + len(body), netlink.RTM_NEWLINK, 0, seq, 0) + body
    with pytest.raises(ValueError, match="an interface name of 20 bytes"):
        netlink.decode_link(forged, seq)


@pytest.mark.parametrize(
    ("data", "changed"),
    [
        (struct.pack("=IHHII", 16, netlink.RTM_NEWADDR, 0, 0, 0), True),
        (struct.pack("=IHHII", 16, netlink.RTM_DELROUTE, 0, 0, 0), True),
        (struct.pack("=IHHII", 16, netlink.RTM_NEWLINK, 0, 0, 0), True),
        (struct.pack("=IHHII", 16, 3, 0, 0, 0), False),  # NLMSG_DONE
        (struct.pack("=IHHII", 16, 3, 0, 0, 0)[:9], True),  # truncated: read again
        (struct.pack("=IHHII", 4, 3, 0, 0, 0), True),  # a nonsense length: read again
    ],
    ids=["new_addr", "del_route", "new_link", "other", "truncated", "bad_length"],
)
def test_change_messages(data: bytes, changed: bool) -> None:
    assert netlink.is_change_message(data) is changed
