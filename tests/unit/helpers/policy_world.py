"""The proxy policy's test world (tests/unit/lnk_proxy/test_policy*.py): a machine with a
public uplink, a LAN address and guests' bridges; grants made as a spec file makes them; a
resolver that remembers what it was asked; both judging steps as the proxy runs them; and every
spelling of one IPv4 address."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import pytest

from lnk_proxy.policy import (
    MachineView,
    ProxyGrants,
    Refused,
    Rule,
    Verdict,
    judge_addresses,
    judge_target,
)
from lnk_shared.addresses import IPAddress, IPNetwork
from lnk_shared.grants import Grants, ResolvedSpec
from lnk_shared.spec import Origin, SpecBuilder

ip = ipaddress.ip_address
net = ipaddress.ip_network
R = Rule

# A machine with a public uplink, its own LAN address, and docker, podman and libvirt bridges.
LOCAL_ADDRESSES: frozenset[IPAddress] = frozenset(
    {
        ip("81.2.69.160"),  # public uplink
        ip("2a01:4f8:c17:1::10"),
        ip("192.168.1.10"),  # this machine on the LAN
        ip("172.17.0.1"),  # docker0
        ip("192.168.122.1"),  # virbr0
    }
)
LOCAL_NETWORKS: tuple[IPNetwork, ...] = (
    net("81.2.69.128/26"),
    net("172.17.0.0/16"),  # docker0
    net("10.88.0.0/16"),  # podman
    net("192.168.122.0/24"),  # libvirt
    net("fd00:dead:beef::/64"),  # a ULA bridge
)
MACHINE = MachineView(LOCAL_ADDRESSES, LOCAL_NETWORKS)
TEST_MACHINE = MachineView(LOCAL_ADDRESSES, LOCAL_NETWORKS, (net("198.18.0.0/15"),))
TM = TEST_MACHINE

PUBLIC = "93.184.215.14"
PUBLIC_2 = "151.101.0.223"


def grants(internet: Sequence[str] = (), lan: Sequence[str] = ()) -> ProxyGrants:
    """Grants as a spec file makes them: through SpecBuilder, the resolved spec and Grants."""
    builder = SpecBuilder(source="test")
    for text in internet:
        builder.add_internet(text, Origin("test", "internet.hosts"))
    for text in lan:
        builder.add_lan(text, Origin("test", "lan.hosts"))
    spec = builder.build()
    resolved = ResolvedSpec(
        source="test",
        read=(),
        write=(),
        commands=(),
        commands_any=False,
        internet_any=spec.internet_any,
        internet=spec.internet,
        network_host=False,
        lan_any=spec.lan_any,
        lan=spec.lan,
        browser=(),
        ports=(),
        with_fds=(),
    )
    return ProxyGrants.from_grants(Grants(spec=resolved, hidden=(), read_only_inside=()))


class Resolver:
    """A DNS answer table that remembers every name it was asked."""

    def __init__(self, table: dict[str, Sequence[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    def __call__(self, name: str) -> tuple[IPAddress, ...]:
        self.asked.append(name)
        return tuple(ip(text) for text in self.table.get(name, ()))


def decide(
    g: ProxyGrants,
    host: str,
    port: int = 443,
    answer: Sequence[str] = (),
    machine: MachineView = MACHINE,
    resolver: Resolver | None = None,
) -> Verdict:
    """Both steps, as the proxy runs them: judge, resolve only an accepted name, judge again."""
    resolve = resolver or Resolver({})
    target = judge_target(g, host, port)
    if isinstance(target, Refused):
        return target
    if target.literal is not None:
        return judge_addresses(g, target, (target.literal,), machine)
    addresses = resolve(target.host) if resolver else tuple(ip(a) for a in answer)
    return judge_addresses(g, target, addresses, machine)


def outcome(verdict: Verdict) -> tuple[str, Rule, IPAddress | None]:
    return (type(verdict).__name__, verdict.rule, getattr(verdict, "address", None))


# ---- spellings of one IPv4 address ---------------------------------------------------------


def _v6(value: int) -> str:
    return f"[{ipaddress.IPv6Address(value)}]"


def spellings(address: ipaddress.IPv4Address, *, nat64_local: bool = True) -> list[str]:
    """Every way a URL host (WHATWG, inet_aton) or an IPv6 form can name `address`."""
    n = int(address)
    o = [int(part) for part in str(address).split(".")]
    forms = [
        str(address),
        f"{address}.",
        str(n),
        hex(n),
        f"0X{n:X}",
        f"0{n:o}",
        ".".join(hex(part) for part in o),
        ".".join(f"0{part:o}" for part in o),
        f"{o[0]}.{o[1]}.{n & 0xFFFF}",
        f"{o[0]}.{n & 0xFFFFFF}",
        f"{hex(o[0])}.{o[1]}.0{o[2]:o}.{o[3]}",
        f"[::ffff:{address}]",
        _v6(0xFFFF << 32 | n),  # mapped, hex groups: [::ffff:7f00:1]
        f"::ffff:{address}",  # unbracketed
        f"[::ffff:0:{address}]",  # SIIT translated
        f"[64:ff9b::{address}]",  # NAT64 well-known
        _v6(0x2002 << 112 | n << 80 | 1),  # 6to4
        _v6(0x20010000 << 96 | 0x4136E378 << 64 | 0x800063BF << 32 | (~n & 0xFFFFFFFF)),  # Teredo
    ]
    if n > 1:
        forms.append(f"[::{address}]")  # compatible (:: and ::1 are not)
    if nat64_local:
        forms.append(f"[64:ff9b:1::{address}]")
    return forms


def spelled(text: str) -> list[object]:
    address = ipaddress.IPv4Address(text)
    return [pytest.param(form, id=form) for form in spellings(address)]


# Grants the tests judge against, as spec files would write them.
EVERYTHING = grants(internet=["*"], lan=["*"])
WILD = grants(internet=["*.example.com", "api.example.org:443"], lan=["nas.home.arpa"])
NET = grants(internet=["*.example.com", "example.com"])
INTERNET_ANY = grants(internet=["*"])
LAN_ANY = grants(lan=["*"])
LAN_NAME = grants(lan=["nas.home.arpa", "100.64.0.7"])
GOOGLE = grants(internet=["*.google.internal"])
INTERNET_AND_RANGE = grants(internet=["*"], lan=["10.0.0.0/8"])
