"""The second judgement of "this machine": where the kernel would send a packet to the exact
address about to be dialed. The first, pure one (`policy.judge_addresses`) judged the address
by its class and the machine view; this one asks the kernel's routing, at dial time, in the
proxy's own network namespace, as `ip route get ADDRESS` does (one `RTM_GETROUTE`, then one
`RTM_GETLINK` for the interface it leaves by).

`judge_route(route, link)` is the pure decision, table-tested; `RouteChecker` only moves the
netlink bytes (`netlink`). Refused:
- a route that delivers here: `local` (an address on any interface, every address of a prefix
  on `lo`, an AnyIP `local` route), `anycast` (IPv6's own subnet-router anycast), `broadcast`,
  `multicast`: `never-this-machine`;
- any other non-unicast route (unreachable, blackhole, prohibit, throw) and no route at all:
  `no-route` (nothing would be reached; refused before a dial rather than a 502);
- a unicast route out of the loopback interface: `never-this-machine`;
- an on-link route out of a guests' link: a bridge (`bridge`, Open vSwitch), a macvlan,
  macvtap, ipvlan or ipvtap (guests share the parent's wire), a port of a bridge, or an
  interface named like a container or VM manager's (`machine.GUEST_PREFIXES`: Calico's routed
  veths, VirtualBox, VMware), whatever address it has: `never-local-network`.

Security limitations: this does NOT
- see a change between the check and the dial (microseconds apart, both in this process);
- see firewall rules, DNAT, policy routing on marks the dial does not carry, or where a
  gateway sends the packet next: a route through a gateway (the uplink's router, even when the
  uplink is a bridge) is judged by the packet's first hop only, so a guest that is itself a
  gateway for a route is not recognized;
- recognize a guest behind a tun/tap, VPN or routed veth that carries none of the names or
  kinds above: its peer is judged by its address class (and must be listed in `[lan]`).
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import sys

from lnk_proxy import netlink
from lnk_proxy.machine import GUEST_PREFIXES
from lnk_proxy.netlink import LinkAnswer, NetlinkError, RouteAnswer
from lnk_proxy.policy import Refused, Rule
from lnk_shared.addresses import IPAddress
from lnk_shared.errors import StateError

__all__ = [
    "GUEST_LINK_KINDS",
    "GUEST_PORT_KINDS",
    "ROUTE_TIMEOUT_S",
    "RouteChecker",
    "judge_route",
]

# Link kinds whose on-link neighbours are this machine's guests, not the LAN.
GUEST_LINK_KINDS = frozenset({"bridge", "openvswitch", "macvlan", "macvtap", "ipvlan", "ipvtap"})
GUEST_PORT_KINDS = frozenset({"bridge", "openvswitch"})  # a port of one of these
IFF_LOOPBACK = 0x8
_HERE = {
    netlink.RTN_LOCAL: "local",
    netlink.RTN_BROADCAST: "broadcast",
    netlink.RTN_ANYCAST: "anycast",
    netlink.RTN_MULTICAST: "multicast",
}
# The kernel answers a route or link query while the request is being sent (no I/O, only the
# routing lock): a second is far beyond it and bounds a wedged netlink.
ROUTE_TIMEOUT_S = 1.0
RECEIVE_SIZE = 32 * 1024  # one answer is a few hundred bytes; a link's with stats ~1.5 KiB
SEQ_WRAP = 2**32
MAX_KEPT_LINKS = 1024  # interfaces whose answer is kept; a host with more asks again
# Addresses whose verdict is kept until the next change: a sandbox's working set of origins is
# tens; past this (a scan of many addresses) the kept ones are forgotten and asked again.
MAX_KEPT_VERDICTS = 4096


def judge_route(address: IPAddress, route: RouteAnswer, link: LinkAnswer | None) -> Refused | None:
    """Refused when the kernel's route for `address` leads to this machine or its guests;
    `link` is the route's output interface (None when the route has none)."""
    here = _HERE.get(route.type)
    if here is not None:
        return Refused(Rule.NEVER_THIS_MACHINE, f"{address} is routed to this machine ({here})")
    if route.type != netlink.RTN_UNICAST:
        return Refused(Rule.NO_ROUTE, f"{address} has no route out (route type {route.type})")
    if link is None:
        return Refused(Rule.NO_ROUTE, f"{address} is routed through no interface")
    if link.flags & IFF_LOOPBACK:
        return Refused(Rule.NEVER_THIS_MACHINE, f"{address} is routed out of {link.name}")
    if route.gateway:
        return None  # the first hop is a router, not a neighbour on this link
    guest = (
        link.kind in GUEST_LINK_KINDS
        or (link.master is not None and link.port_kind in GUEST_PORT_KINDS)
        or link.name.startswith(GUEST_PREFIXES)
    )
    if guest:
        what = f"{link.kind or 'port'} {link.name}"
        return Refused(Rule.NEVER_LOCAL_NETWORK, f"{address} is on guests' link {what}")
    return None


class RouteChecker:
    """Asks the kernel (one netlink socket, blocking with a bound) and judges the answer.

    The verdict for an address (from the kernel's route and its interface's answer) is kept
    until `invalidate`, as is each interface's answer; the server calls it whenever a netlink
    change message (link, address, route or routing rule) is queued, and it drains them before
    each check: the kernel queues them as the change is made, so a kept answer is never older
    than the last change the kernel reported)."""

    def __init__(self) -> None:
        try:
            self._sock = socket.socket(
                socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE
            )
            self._sock.bind((0, 0))
        except OSError as exc:
            raise StateError(
                f"cannot open a route netlink socket ({exc}): the proxy judges every address "
                "by the kernel's route and refuses to run without it"
            ) from None
        self._sock.settimeout(ROUTE_TIMEOUT_S)
        self._seq = itertools.count(1)
        self._links: dict[int, LinkAnswer] = {}
        self._verdicts: dict[IPAddress, Refused | None] = {}

    def invalidate(self) -> None:
        """A link, address, route or rule changed: forget every kept verdict and interface."""
        self._links.clear()
        self._verdicts.clear()

    def close(self) -> None:
        self._sock.close()

    def check(self, address: IPAddress) -> Refused | None:
        """Refused when the route to `address` leads here or to guests (or cannot be read).
        The kernel's verdict is kept until `invalidate`; a failure to read it never is."""
        if address in self._verdicts:
            return self._verdicts[address]
        verdict, kernel_said = self._ask_kernel(address)
        if kernel_said:
            if len(self._verdicts) >= MAX_KEPT_VERDICTS:
                self._verdicts.clear()
            self._verdicts[address] = verdict
        return verdict

    def _ask_kernel(self, address: IPAddress) -> tuple[Refused | None, bool]:
        """The verdict, and whether it is the kernel's answer (False: it could not be read)."""
        try:
            route = self._route(address)
        except NetlinkError as exc:
            return Refused(Rule.NO_ROUTE, f"{address} has no route: {exc.strerror}"), True
        except (OSError, ValueError) as exc:
            refused = Refused(Rule.NO_ROUTE, f"the route to {address} could not be read: {exc}")
            return refused, False
        link = None
        if route.oif is not None:
            try:
                link = self._link(route.oif)
            except (OSError, ValueError) as exc:  # a link gone meanwhile: fail closed
                reason = f"the interface {route.oif} of {address} is unreadable: {exc}"
                return Refused(Rule.NO_ROUTE, reason), False
        return judge_route(address, route, link), True

    def _ask(self, request: bytes, seq: int) -> bytes:
        self._sock.send(request)
        while True:
            answer = self._sock.recv(RECEIVE_SIZE)
            if len(answer) >= 12 and int.from_bytes(answer[8:12], sys.byteorder) != seq:
                continue  # a late answer to a request that timed out: not ours
            return answer

    def _next_seq(self) -> int:
        return next(self._seq) % SEQ_WRAP or 1

    def _route(self, address: IPAddress) -> RouteAnswer:
        seq = self._next_seq()
        return netlink.decode_route(self._ask(netlink.encode_route_request(seq, address), seq), seq)

    def _link(self, index: int) -> LinkAnswer:
        kept = self._links.get(index)
        if kept is not None:
            return kept
        seq = self._next_seq()
        link = netlink.decode_link(self._ask(netlink.encode_link_request(seq, index), seq), seq)
        if len(self._links) >= MAX_KEPT_LINKS:
            self._links.clear()
        self._links[index] = link
        return link

    def __enter__(self) -> RouteChecker:
        return self

    def __exit__(self, *_: object) -> None:
        with contextlib.suppress(OSError):
            self.close()
