"""seccomp rules for `[network] mode = "host"`: the sandbox may dial out, but takes no port.

With the host's network a socket the sandbox listens on is reachable by the host, the LAN and
whatever else routes here, and it holds a port another program may expect. Landlock's
`BIND_TCP` (no port granted: the confiner's policy) refuses `bind()` on TCP sockets, but not
`listen()` on an unbound socket (the kernel then binds a free port on 0.0.0.0 itself), nor any
other protocol. These rules, stacked in the last filter the confiner loads, close that:

- `listen` fails with EPERM on every socket: no TCP (or SCTP, or SMC) socket accepts;
- `socket(AF_INET or AF_INET6, …)` of any type but SOCK_STREAM fails with EPERM: no UDP, ICMP
  "ping" or datagram socket, so nothing receives datagrams on a port (bound, or autobound by a
  first `sendto`);
- `socket` of any family but AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK fails with
  EAFNOSUPPORT: no other protocol (RDS, TIPC, SMC, …) binds a port the rules above do not see.

A spec has no way to list a port to listen on in host mode (`[localhost] ports` serve the
host's ports inside the sandbox's own network, which host mode does not have), so none is.

Security limitations: it does NOT stop
- outgoing TCP connections anywhere, which host mode grants (Landlock's `CONNECT_TCP` is left
  open for it), nor the answers on them;
- DNS over UDP or QUIC from inside (they need datagram sockets; host mode resolves nothing
  either way, since the sandbox has no resolv.conf), nor `ping`;
- netlink: a sandbox in host mode reads the host's addresses and routes (getifaddrs needs it).
"""

from __future__ import annotations

import errno
import socket

__all__ = ["ALLOWED_FAMILIES", "host_net_rules"]

_CMP_GT = 6  # SCMP_CMP_GT: argument > datum_a (unsigned, all 64 bits)
_CMP_MASKED_EQ = 7
_LOW32 = 0xFFFFFFFF
_SOCK_TYPE_MASK = 0xF  # the type's low bits; SOCK_NONBLOCK and SOCK_CLOEXEC sit above them
_MAX_SOCK_TYPE = 0xF

ALLOWED_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK)
_IP_FAMILIES = (socket.AF_INET, socket.AF_INET6)

_Cmp = tuple[int, int, int, int]
_Rules = tuple[tuple[_Cmp, ...], ...]
_ALWAYS: _Rules = ((),)


def _other_families() -> _Rules:
    # The kernel reads the family from the low 32 bits. A value above the largest allowed one
    # (upper bits set count as above: only a false refusal) or any smaller one not allowed.
    top = max(ALLOWED_FAMILIES)
    rules: list[tuple[_Cmp, ...]] = [((0, _CMP_GT, top, 0),)]
    rules += [
        ((0, _CMP_MASKED_EQ, _LOW32, family),)
        for family in range(top)
        if family not in ALLOWED_FAMILIES
    ]
    return tuple(rules)


def _ip_datagrams() -> _Rules:
    return tuple(
        ((0, _CMP_MASKED_EQ, _LOW32, family), (1, _CMP_MASKED_EQ, _SOCK_TYPE_MASK, kind))
        for family in _IP_FAMILIES
        for kind in range(_MAX_SOCK_TYPE + 1)
        if kind != socket.SOCK_STREAM
    )


def host_net_rules() -> tuple[tuple[str, int, _Rules], ...]:
    """(syscall, errno, rules) for a sandbox on the host's network."""
    return (
        ("listen", errno.EPERM, _ALWAYS),
        ("socket", errno.EPERM, _ip_datagrams()),
        ("socket", errno.EAFNOSUPPORT, _other_families()),
    )
