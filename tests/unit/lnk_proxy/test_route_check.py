"""The route judgement as a table: each kind of route the kernel can give for the dialed
address, and the link it leaves by; plus the real kernel's answers for this machine's own
loopback (the only routes a unit test can rely on)."""

from __future__ import annotations

import ipaddress
import sys

import pytest

from lnk_proxy import netlink
from lnk_proxy.netlink import LinkAnswer, RouteAnswer
from lnk_proxy.policy import Rule
from lnk_proxy.route_check import RouteChecker, judge_route

ADDRESS = ipaddress.ip_address("10.70.0.2")
UNICAST = RouteAnswer(netlink.RTN_UNICAST, 3, gateway=False)
VIA = RouteAnswer(netlink.RTN_UNICAST, 3, gateway=True)


def link(name: str = "eth0", kind: str = "", flags: int = 0x1043, **extra: object) -> LinkAnswer:
    master = extra.get("master")
    port_kind = str(extra.get("port_kind", ""))
    return LinkAnswer(3, name, flags, kind, master if isinstance(master, int) else None, port_kind)


CASES = [
    (
        "local",
        RouteAnswer(netlink.RTN_LOCAL, 1, False),
        link("lo", flags=0x49),
        Rule.NEVER_THIS_MACHINE,
    ),
    (
        "anycast",
        RouteAnswer(netlink.RTN_ANYCAST, 1, False),
        link("lo", flags=0x49),
        Rule.NEVER_THIS_MACHINE,
    ),
    ("broadcast", RouteAnswer(netlink.RTN_BROADCAST, 3, False), link(), Rule.NEVER_THIS_MACHINE),
    ("multicast", RouteAnswer(netlink.RTN_MULTICAST, 3, False), link(), Rule.NEVER_THIS_MACHINE),
    ("blackhole", RouteAnswer(6, None, False), None, Rule.NO_ROUTE),
    ("throw", RouteAnswer(9, None, False), None, Rule.NO_ROUTE),
    ("unicast_no_link", RouteAnswer(netlink.RTN_UNICAST, None, False), None, Rule.NO_ROUTE),
    ("unicast_out_of_lo", UNICAST, link("lo", flags=0x49), Rule.NEVER_THIS_MACHINE),
    ("lo_via_gateway", VIA, link("lo", flags=0x49), Rule.NEVER_THIS_MACHINE),
    ("bridge", UNICAST, link("mynet", "bridge"), Rule.NEVER_LOCAL_NETWORK),
    ("openvswitch", UNICAST, link("ovsbr", "openvswitch"), Rule.NEVER_LOCAL_NETWORK),
    ("macvlan", UNICAST, link("mv0", "macvlan"), Rule.NEVER_LOCAL_NETWORK),
    ("macvtap", UNICAST, link("macvtap0", "macvtap"), Rule.NEVER_LOCAL_NETWORK),
    ("ipvlan", UNICAST, link("ipv0", "ipvlan"), Rule.NEVER_LOCAL_NETWORK),
    (
        "bridge_port",
        UNICAST,
        link("vport0", "veth", master=2, port_kind="bridge"),
        Rule.NEVER_LOCAL_NETWORK,
    ),
    (
        "ovs_port",
        UNICAST,
        link("tap0", "tun", master=2, port_kind="openvswitch"),
        Rule.NEVER_LOCAL_NETWORK,
    ),
    ("calico_routed_veth", UNICAST, link("cali12ab", "veth"), Rule.NEVER_LOCAL_NETWORK),
    ("vboxnet_by_name", UNICAST, link("vboxnet0"), Rule.NEVER_LOCAL_NETWORK),
    ("uplink", UNICAST, link("eth0"), None),
    ("veth", UNICAST, link("lnkn1pr", "veth"), None),
    ("vrf_port", UNICAST, link("eth1", master=9, port_kind="vrf"), None),
    ("wireguard", UNICAST, link("wg0", "wireguard"), None),
    ("uplink_bridge_via_gateway", VIA, link("br0", "bridge"), None),
]


@pytest.mark.parametrize(
    ("route", "out", "rule"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_judge_route(route: RouteAnswer, out: LinkAnswer | None, rule: Rule | None) -> None:
    refused = judge_route(ADDRESS, route, out)
    assert (refused.rule if refused else None) == rule
    if refused is not None:
        assert str(ADDRESS) in refused.reason


@pytest.mark.parametrize("address", ["127.0.0.1", "127.3.4.5", "::1"])
def test_the_kernel_routes_loopback_here(address: str) -> None:
    with RouteChecker() as checker:
        refused = checker.check(ipaddress.ip_address(address))
    assert refused is not None and refused.rule == Rule.NEVER_THIS_MACHINE
    assert "local" in refused.reason


class _Scripted(RouteChecker):
    """The kernel's answers scripted, and counted: only the netlink I/O is replaced."""

    def __init__(self, route: RouteAnswer | Exception, found: LinkAnswer) -> None:
        super().__init__()
        self.route = route
        self.found = found
        self.asked = 0

    def _route(self, address: object) -> RouteAnswer:
        self.asked += 1
        if isinstance(self.route, Exception):
            raise self.route
        return self.route

    def _link(self, index: int) -> LinkAnswer:
        return self.found


def test_a_kept_verdict_is_used_until_a_change_then_the_kernel_is_asked_again() -> None:
    with _Scripted(UNICAST, link()) as checker:
        assert checker.check(ADDRESS) is None
        assert checker.check(ADDRESS) is None
        assert checker.asked == 1  # kept: no second netlink round trip
        # The attack: the address is made local after it was judged (`ip addr add ... dev lo`).
        checker.route = RouteAnswer(netlink.RTN_LOCAL, 1, False)
        checker.invalidate()  # what the server does when the change message is queued
        refused = checker.check(ADDRESS)
        assert refused is not None and refused.rule == Rule.NEVER_THIS_MACHINE
        assert checker.asked == 2


def test_no_route_is_the_kernels_answer_and_kept_but_a_failed_read_is_never_kept() -> None:
    gone = netlink.NetlinkError(101, "Network is unreachable")
    with _Scripted(gone, link()) as checker:
        assert checker.check(ADDRESS) == checker.check(ADDRESS)
        assert checker.asked == 1
    with _Scripted(TimeoutError("netlink wedged"), link()) as checker:
        first = checker.check(ADDRESS)
        assert first is not None and first.rule == Rule.NO_ROUTE
        checker.route = UNICAST
        assert checker.check(ADDRESS) is None  # asked again, not the kept failure
        assert checker.asked == 2


def test_kept_verdicts_are_bounded() -> None:
    from lnk_proxy.route_check import MAX_KEPT_VERDICTS

    with _Scripted(UNICAST, link()) as checker:
        for n in range(MAX_KEPT_VERDICTS + 1):
            checker.check(ipaddress.ip_address(0x0A000000 + n))
        assert len(checker._verdicts) <= MAX_KEPT_VERDICTS


def test_a_routing_rule_change_counts_as_a_change() -> None:
    # `ip rule add` changes which table answers: the kept verdicts must be dropped.
    assert netlink.CHANGE_GROUPS & 0x80 and netlink.CHANGE_GROUPS & (1 << 18)
    for kind in (netlink.RTM_NEWRULE, netlink.RTM_DELRULE):
        message = (16).to_bytes(4, sys.byteorder) + kind.to_bytes(2, sys.byteorder) + bytes(10)
        assert netlink.is_change_message(message)
