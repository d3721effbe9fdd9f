"""The plan's probes of the network: the bait server on this machine in each address family, an
abstract unix socket outside, a route to the internet, `[localhost]` ports, and through the proxy
(when the spec has one) the internet by address, this machine in every spelling, addresses the
kernel routes here, this machine's networks, an unlisted host, and each host the spec lists.

Off this machine, only hosts the spec names are reached (see `plan`'s docstring)."""

from __future__ import annotations

import ipaddress

from lnk_cli.check.bait import PREFIX
from lnk_cli.check.probe import (
    ALLOWED,
    KNOWN_GAP,
    REFUSED,
    Evidence,
    PlanContext,
    Probe,
    expect,
)
from lnk_shared.grants import Grants

__all__ = ["INTERNET_PROBE", "network_probes", "server_probes"]

INTERNET_PROBE = "1.1.1.1"  # the seed's "http://1.1.1.1": never dialed off this machine
HTTP_PORT = 80
HTTPS_PORT = 443
MAX_NETWORKS = 4  # of this machine's networks, how many get a neighbour asked for


def server_probes(c: PlanContext) -> None:
    server = c.bait.server
    assert server is not None
    port = server.port
    tries = [("127.0.0.1", "127.0.0.1")]
    if any(lis.host == "::1" for lis in server.listeners):
        tries.append(("::1", "::1"))
    tries.append(("::ffff:127.0.0.1", "::ffff:127.0.0.1"))
    for lis in server.listeners:
        if lis.host not in ("127.0.0.1", "::1"):
            tries.append(("machine", lis.host))
    for label, host in tries:
        c.add(
            Probe(
                f"server:{label}",
                f"connect to the bait server at {host} port {port}",
                REFUSED,
                {"kind": "tcp", "host": host, "port": port},
                (Evidence("server"),),
            )
        )
    c.add(
        Probe(
            "abstract-socket",
            "connect to an abstract unix socket outside",
            REFUSED,
            {"kind": "abstract", "name": server.abstract_name},
            (Evidence("abstract"),),
        )
    )


def _machine_forms(address: str | None, port: int) -> list[str]:
    """This machine as a proxy target: loopback in every spelling, IPv4 in IPv6's forms."""
    forms = [
        "127.0.0.1",
        "localhost",
        "[::1]",
        "0.0.0.0",  # noqa: S104 - a target name, nothing binds it
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "[::127.0.0.1]",
        "[64:ff9b::7f00:1]",
        "[2002:7f00:1::]",
        "2130706433",
        "0x7f000001",
        "127.1",
        "0177.0.0.1",
    ]
    if address:
        forms += [address, f"[::ffff:{address}]"]
    return [f"{f}:{port}" for f in forms]


def _lan_covers(grants: Grants, address: ipaddress.IPv4Address) -> bool:
    spec = grants.spec
    return spec.lan_any or any(
        e.network is not None and e.network.version == 4 and address in e.network for e in spec.lan
    )


def _neighbours(c: PlanContext) -> list[str]:
    found = []
    for iface in c.bait.machine:
        net = iface.network
        if net.num_addresses < 4 or iface.ip.is_loopback:
            continue
        other = net.network_address + 1
        if other == iface.ip:
            other += 1
        found.append(str(other))
    return found[:MAX_NETWORKS]


def network_probes(c: PlanContext) -> None:
    spec = c.grants.spec
    c.add(
        Probe(
            "internet:direct",
            f"reach http://{INTERNET_PROBE} directly (a route to it)",
            expect(spec.network_host),
            {"kind": "route", "host": INTERNET_PROBE, "port": HTTP_PORT},
            (Evidence("inside"),),
        )
    )
    server = c.bait.server
    assert server is not None
    if spec.has_proxy:
        _proxy(c, server.port)
    for port in spec.ports:
        c.add(
            Probe(
                f"port:{port}",
                f"reach this machine's port {port} ([localhost] ports)",
                KNOWN_GAP,
                {"kind": "tcp", "host": "127.0.0.1", "port": port},
                (Evidence("inside"),),
            )
        )


def _ask(c: PlanContext, ident: str, target: str, why: str, *, expected: str = REFUSED) -> None:
    """Ask the proxy for `target` (CONNECT host:port, or GET when `ident` says get)."""
    method = "GET" if ":get-" in ident else "CONNECT"
    shown = f"GET http://{target}/" if method == "GET" else f"CONNECT {target}"
    evidence = (Evidence("wire", target), Evidence("server"))
    step = {"kind": "proxy", "method": method, "target": target}
    c.add(Probe(ident, f"{shown} through the proxy ({why})", expected, step, evidence))


def _not_tried(c: PlanContext, ident: str, tried: str, why: str) -> None:
    c.add(Probe(ident, tried, ALLOWED, None, not_tried=why))


def _proxy(c: PlanContext, bait_port: int) -> None:
    spec = c.grants.spec
    direct = f"{INTERNET_PROBE}:{HTTP_PORT}"
    _ask(c, "proxy:tunnel-1.1.1.1", direct, "the internet by address")
    _ask(c, "proxy:get-1.1.1.1", direct, "the internet by address")
    mapped = f"[::ffff:{INTERNET_PROBE}]:{HTTP_PORT}"
    _ask(c, "proxy:mapped-1.1.1.1", mapped, "IPv4 written as IPv6")
    machine = str(c.bait.machine[0].ip) if c.bait.machine else None
    for target in _machine_forms(machine, bait_port):
        _ask(c, f"proxy:machine:{target}", target, "this machine, the bait server's port")
    for address in c.bait.local_routed:  # refused even when [lan] lists it: it is here
        target = f"[{address}]:{bait_port}" if ":" in address else f"{address}:{bait_port}"
        _ask(c, f"proxy:local-route:{target}", target, "an address the kernel routes here")
    for neighbour in _neighbours(c):
        target = f"{neighbour}:{HTTP_PORT}"
        ident = f"proxy:network:{target}"
        if _lan_covers(c.grants, ipaddress.IPv4Address(neighbour)):
            _not_tried(c, ident, f"CONNECT {target}", "[lan] lists it")
        else:
            _ask(c, ident, target, "this machine's network")
    unlisted = f"{PREFIX}{c.nonce}.invalid:{HTTPS_PORT}"
    if spec.internet_any:
        _not_tried(c, "proxy:unlisted", f"CONNECT {unlisted}", "[internet] * lists every host")
    else:
        _ask(c, "proxy:unlisted", unlisted, "a host not listed")
    for host in spec.internet:
        ident = f"internet-host:{host}"
        if host.wildcard:
            _not_tried(c, ident, f"CONNECT {host}", "a wildcard names no one host")
            continue
        target = f"{host.name}:{host.port or HTTPS_PORT}"
        _ask(c, ident, target, "[internet] lists it", expected=ALLOWED)
    for entry in spec.lan:
        ident = f"lan-host:{entry}"
        if entry.network is not None and entry.network.num_addresses > 1:
            _not_tried(c, ident, f"reach {entry}", "a range names no one host")
            continue
        shown = str(entry)
        target = f"[{shown}]:{HTTP_PORT}" if ":" in shown else f"{shown}:{HTTP_PORT}"
        _ask(c, ident, target, "[lan] lists it", expected=ALLOWED)
