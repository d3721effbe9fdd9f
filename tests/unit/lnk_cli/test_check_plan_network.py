"""The plan's probes of the network (plan_network.py): host mode, the proxy's targets for listed
and unlisted hosts, and the addresses the kernel routes to this machine."""

from __future__ import annotations

from typing import Any

from lnk_cli.check.plan import ALLOWED, KNOWN_GAP, REFUSED

PlanKit = Any  # conftest.PlanKit: a temp home with bait, its grants and its plan


def test_host_network_expects_a_route_and_asks_no_proxy(plan: PlanKit) -> None:
    wanted = plan.expected(plan.probes(plan.grants("--network-mode=host")))
    assert wanted["internet:direct"] == ALLOWED
    assert wanted["server:127.0.0.1"] == REFUSED  # host mode does not grant this machine
    assert not any(i.startswith("proxy:") for i in wanted)


def test_behind_the_proxy_listed_hosts_are_allowed_and_the_rest_asked(plan: PlanKit) -> None:
    grants = plan.grants(
        "--internet-host=www.example.com",
        "--internet-host=*.example.org",
        "--lan-host=10.1.2.3",
        "--lan-host=10.9.0.0/16",
        "--port=8080",
    )
    probes = plan.probes(grants)
    wanted = plan.expected(probes)
    assert wanted["internet-host:www.example.com"] == ALLOWED
    assert wanted["lan-host:10.1.2.3"] == ALLOWED
    assert wanted["port:8080"] == KNOWN_GAP
    not_tried = {p.id for p in probes if p.step is None}
    assert not_tried == {"internet-host:*.example.org", "lan-host:10.9.0.0/16"}
    for ident in ("proxy:tunnel-1.1.1.1", "proxy:get-1.1.1.1", "proxy:mapped-1.1.1.1"):
        assert wanted[ident] == REFUSED
    machine = [i for i in wanted if i.startswith("proxy:machine:")]
    assert len(machine) >= 13 and {wanted[i] for i in machine} == {REFUSED}
    assert wanted["proxy:unlisted"] == REFUSED


def test_internet_star_is_never_asked_for_an_unlisted_host(plan: PlanKit) -> None:
    probes = plan.probes(plan.grants("--internet-host=*"))
    unlisted = next(p for p in probes if p.id == "proxy:unlisted")
    assert (unlisted.step, unlisted.expected) == (None, ALLOWED)


def test_addresses_the_kernel_routes_here_are_asked_even_when_lan_lists_them(plan: PlanKit) -> None:
    plan.bait.local_routed = ["10.61.0.2", "fd62::2"]  # a prefix on lo, an IPv6 local route
    for flags in ((), ("--lan-host=10.61.0.0/24", "--lan-host=fd62::/64")):
        grants = plan.grants("--internet-host=www.example.com", *flags)
        probes = {p.id: p for p in plan.probes(grants)}
        port = plan.bait.server.port if plan.bait.server else 0
        for target in (f"10.61.0.2:{port}", f"[fd62::2]:{port}"):
            probe = probes[f"proxy:local-route:{target}"]
            assert probe.expected == REFUSED
            assert probe.step is not None
            assert (probe.step["method"], probe.step["target"]) == ("CONNECT", target)
