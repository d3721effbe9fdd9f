"""Proxy policy: every rule refuses its attack and allows its neighbour, in every spelling."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lnk_proxy import policy
from lnk_proxy.policy import (
    Allowed,
    MachineView,
    ProxyGrants,
    Refused,
    Rule,
    Target,
    Verdict,
    judge_addresses,
    judge_target,
)
from lnk_shared.addresses import NEVER_CLASSES, IPAddress, IPNetwork
from lnk_shared.grants import Grants, ResolvedSpec
from lnk_shared.spec import LanEntry, Origin, SpecBuilder

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


EVERYTHING = grants(internet=["*"], lan=["*"])


@pytest.mark.parametrize("host", [*spelled("127.0.0.1"), "[::1]", "::1", "localhost"])
def test_loopback_in_every_spelling_is_refused(host: str) -> None:
    verdict = decide(EVERYTHING, host, answer=[PUBLIC])
    assert isinstance(verdict, Refused)
    assert verdict.rule in (R.NEVER_LOOPBACK, R.NEVER_THIS_MACHINE)


@pytest.mark.parametrize("host", spelled("169.254.169.254"))
def test_metadata_address_in_every_spelling_is_refused(host: str) -> None:
    g = grants(internet=["*"], lan=["*", "10.0.0.0/8"])
    assert decide(g, host).rule is R.NEVER_METADATA


@pytest.mark.parametrize("host", spelled("10.0.0.1"))
def test_listed_lan_address_in_every_spelling_is_dialed_as_itself(host: str) -> None:
    verdict = decide(grants(lan=["10.0.0.0/8"]), host, port=5432)
    assert verdict == Allowed(ip("10.0.0.1"), 5432, R.ALLOWED_LAN, verdict.reason)


@pytest.mark.parametrize("host", spelled("10.0.0.1"))
def test_unlisted_lan_address_in_every_spelling_is_refused(host: str) -> None:
    assert decide(grants(internet=["*"], lan=["10.1.0.0/16"]), host).rule is R.LITERAL_NOT_ALLOWED


# ---- step 1: the target, before any lookup -------------------------------------------------

WILD = grants(internet=["*.example.com", "api.example.org:443"], lan=["nas.home.arpa"])
NET = grants(internet=["*.example.com", "example.com"])
INTERNET_ANY = grants(internet=["*"])
LAN_ANY = grants(lan=["*"])
LAN_NAME = grants(lan=["nas.home.arpa", "100.64.0.7"])
GOOGLE = grants(internet=["*.google.internal"])
INTERNET_AND_RANGE = grants(internet=["*"], lan=["10.0.0.0/8"])
FULLWIDTH_LOOPBACK = "\uff11\uff12\uff17.\uff10.\uff10.\uff11"
FULLWIDTH_LOCALHOST = "\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54"

# grants, host, port, the rule (a refusal) or the lists matched (internet, lan).
TARGETS = [
    # Malformed hosts.
    pytest.param(EVERYTHING, "", 443, R.BAD_HOST, id="empty"),
    pytest.param(EVERYTHING, "exa mple.com", 443, R.BAD_HOST, id="space"),
    pytest.param(EVERYTHING, "a..example.com", 443, R.BAD_HOST, id="empty-label"),
    pytest.param(EVERYTHING, "-a.example.com", 443, R.BAD_HOST, id="leading-hyphen"),
    pytest.param(EVERYTHING, "_a.example.com", 443, R.BAD_HOST, id="underscore"),
    pytest.param(EVERYTHING, "a@example.com", 443, R.BAD_HOST, id="userinfo"),
    pytest.param(EVERYTHING, "exa%6dple.com", 443, R.BAD_HOST, id="percent"),
    pytest.param(EVERYTHING, "example.com\x00.evil", 443, R.BAD_HOST, id="nul"),
    pytest.param(EVERYTHING, "example.com\r\nHost: x", 443, R.BAD_HOST, id="crlf"),
    pytest.param(EVERYTHING, "a" * 64 + ".com", 443, R.BAD_HOST, id="long-label"),
    pytest.param(EVERYTHING, "a." * 200 + "com", 443, R.BAD_HOST, id="long-name"),
    pytest.param(EVERYTHING, "256.0.0.1", 443, R.BAD_HOST, id="ipv4-out-of-range"),
    pytest.param(EVERYTHING, "1.2.3.4.5", 443, R.BAD_HOST, id="five-parts"),
    pytest.param(EVERYTHING, "08", 443, R.BAD_HOST, id="bad-octal"),
    pytest.param(EVERYTHING, "example.123", 443, R.BAD_HOST, id="numeric-last-label"),
    pytest.param(EVERYTHING, "[::1", 443, R.BAD_HOST, id="unbalanced-bracket"),
    pytest.param(EVERYTHING, "[::1]:80", 443, R.BAD_HOST, id="port-in-host"),
    pytest.param(EVERYTHING, FULLWIDTH_LOOPBACK, 443, R.BAD_HOST, id="fullwidth-digits"),
    # Ports.
    pytest.param(EVERYTHING, "example.com", 0, R.BAD_PORT, id="port-zero"),
    pytest.param(EVERYTHING, "example.com", 65536, R.BAD_PORT, id="port-too-big"),
    pytest.param(EVERYTHING, "example.com", 65535, (True, True), id="port-max"),
    # Names never resolved, whatever is listed.
    pytest.param(EVERYTHING, "localhost", 80, R.NEVER_THIS_MACHINE, id="localhost"),
    pytest.param(EVERYTHING, "LocalHost.", 80, R.NEVER_THIS_MACHINE, id="localhost-spelled"),
    pytest.param(EVERYTHING, "api.localhost", 80, R.NEVER_THIS_MACHINE, id="sub-localhost"),
    pytest.param(EVERYTHING, FULLWIDTH_LOCALHOST, 80, R.NEVER_THIS_MACHINE, id="fullwidth-lh"),
    pytest.param(EVERYTHING, "localhost.localdomain", 80, R.NEVER_THIS_MACHINE, id="localdomain"),
    pytest.param(EVERYTHING, "ip6-localhost", 80, R.NEVER_THIS_MACHINE, id="ip6-localhost"),
    pytest.param(EVERYTHING, "localhost.example.com", 80, (True, True), id="localhost-label-ok"),
    pytest.param(EVERYTHING, "metadata.google.internal", 80, R.NEVER_METADATA, id="gcp"),
    pytest.param(EVERYTHING, "METADATA.Google.Internal.", 80, R.NEVER_METADATA, id="gcp-spelled"),
    pytest.param(GOOGLE, "metadata.google.internal", 80, R.NEVER_METADATA, id="gcp-listed"),
    pytest.param(EVERYTHING, "metadata", 80, R.NEVER_METADATA, id="gcp-short"),
    pytest.param(EVERYTHING, "metadata.goog", 80, R.NEVER_METADATA, id="gcp-goog"),
    pytest.param(EVERYTHING, "instance-data.ec2.internal", 80, R.NEVER_METADATA, id="aws"),
    pytest.param(EVERYTHING, "metadata.example.com", 80, (True, True), id="metadata-label-ok"),
    # Wildcards on label boundaries, normalized names.
    pytest.param(WILD, "a.example.com", 443, (True, False), id="wildcard-one-label"),
    pytest.param(WILD, "a.b.example.com", 443, (True, False), id="wildcard-two-labels"),
    pytest.param(WILD, "A.Example.COM.", 80, (True, False), id="case-and-root-dot"),
    pytest.param(WILD, "b\u00fccher.example.com", 443, (True, False), id="idna-unicode"),
    pytest.param(WILD, "xn--bcher-kva.example.com", 443, (True, False), id="idna-ascii"),
    pytest.param(WILD, "example.com", 443, R.NOT_LISTED, id="wildcard-not-apex"),
    pytest.param(WILD, "badexample.com", 443, R.NOT_LISTED, id="wildcard-not-suffix"),
    pytest.param(WILD, "example.com.evil.net", 443, R.NOT_LISTED, id="wildcard-not-prefix"),
    pytest.param(WILD, "a-example.com", 443, R.NOT_LISTED, id="wildcard-not-hyphen"),
    pytest.param(WILD, "api.example.org", 443, (True, False), id="listed-port"),
    pytest.param(WILD, "api.example.org", 80, R.NOT_LISTED, id="other-port"),
    pytest.param(WILD, "x.api.example.org", 443, R.NOT_LISTED, id="exact-not-below"),
    pytest.param(WILD, "NAS.home.arpa.", 22, (False, True), id="lan-name-any-port"),
    pytest.param(WILD, "x.nas.home.arpa", 22, R.NOT_LISTED, id="lan-name-exact"),
    pytest.param(LAN_ANY, "printer.home.arpa", 631, (False, True), id="lan-any"),
    # An IP literal is not a name on a list.
    pytest.param(INTERNET_ANY, PUBLIC, 443, R.LITERAL_NOT_ALLOWED, id="literal-internet-any"),
    pytest.param(NET, PUBLIC, 443, R.LITERAL_NOT_ALLOWED, id="literal-not-a-listed-name"),
    pytest.param(LAN_NAME, "10.0.0.5", 22, R.LITERAL_NOT_ALLOWED, id="literal-not-a-lan-name"),
    pytest.param(INTERNET_ANY, "[2606:4700::1111]", 443, R.LITERAL_NOT_ALLOWED, id="public-v6"),
    pytest.param(LAN_ANY, "8.8.8.8", 53, R.LITERAL_NOT_ALLOWED, id="lan-any-public"),
    pytest.param(LAN_ANY, "100.64.0.7", 80, R.LITERAL_NOT_ALLOWED, id="lan-any-cgnat"),
    pytest.param(LAN_ANY, "192.0.2.1", 80, R.LITERAL_NOT_ALLOWED, id="lan-any-special"),
    pytest.param(LAN_ANY, "224.0.0.1", 80, R.LITERAL_NOT_ALLOWED, id="multicast"),
    pytest.param(LAN_ANY, "255.255.255.255", 80, R.LITERAL_NOT_ALLOWED, id="broadcast"),
    pytest.param(EVERYTHING, "0.0.0.0", 80, R.NEVER_THIS_MACHINE, id="unspecified"),
    pytest.param(EVERYTHING, "0", 80, R.NEVER_THIS_MACHINE, id="unspecified-zero"),
    pytest.param(EVERYTHING, "[::]", 80, R.NEVER_THIS_MACHINE, id="unspecified-v6"),
    pytest.param(EVERYTHING, "169.254.1.1", 80, R.NEVER_LINK_LOCAL, id="link-local"),
    pytest.param(EVERYTHING, "[fe80::1]", 80, R.NEVER_LINK_LOCAL, id="link-local-v6"),
    pytest.param(EVERYTHING, "fe80::1%eth0", 80, R.NEVER_LINK_LOCAL, id="link-local-zone"),
    pytest.param(EVERYTHING, "[fe80::1%eth0]", 80, R.NEVER_LINK_LOCAL, id="link-local-zone-br"),
    pytest.param(EVERYTHING, "[fd00:ec2::254]", 80, R.NEVER_METADATA, id="aws-imds-v6"),
    pytest.param(EVERYTHING, "168.63.129.16", 80, R.NEVER_METADATA, id="azure-wireserver"),
    pytest.param(EVERYTHING, "100.100.100.200", 80, R.NEVER_METADATA, id="alibaba-in-cgnat"),
]


@pytest.mark.parametrize(("g", "host", "port", "expected"), TARGETS)
def test_target(g: ProxyGrants, host: str, port: int, expected: Rule | tuple[bool, bool]) -> None:
    target = judge_target(g, host, port)
    if isinstance(expected, Rule):
        assert isinstance(target, Refused), target
        assert target.rule is expected
    else:
        assert isinstance(target, Target), target
        assert (target.internet, target.lan) == expected
        assert target.literal is None
        assert target.port == port


# ---- port 22: reached through [internet] only by an entry that names it ---------------------

SSH = grants(internet=["git.example.com:22", "*.forge.example:22", "www.example.com"])
SSH_AND_ANY = grants(internet=["*", "git.example.com:22"])
BARE = grants(internet=["git.example.com", "*.example.net"])
SSH_LAN = grants(internet=["git.example.com"], lan=["git.example.com", "nas.home.arpa"])

# grants, host, port, the refusal or the lists matched (internet, lan)
SSH_TARGETS = [
    pytest.param(SSH, "git.example.com", 22, (True, False), id="listed-with-22"),
    pytest.param(SSH, "GIT.Example.com.", 22, (True, False), id="listed-spelled"),
    pytest.param(SSH, "a.forge.example", 22, (True, False), id="wildcard-with-22"),
    pytest.param(SSH, "forge.example", 22, R.NOT_LISTED, id="wildcard-not-apex"),
    pytest.param(SSH, "git.example.com", 443, R.NOT_LISTED, id="22-only-opens-22"),
    pytest.param(SSH, "www.example.com", 22, R.PORT_NOT_LISTED, id="bare-name-not-22"),
    pytest.param(SSH, "www.example.com", 443, (True, False), id="bare-name-other-ports"),
    pytest.param(SSH, "other.example.com", 22, R.NOT_LISTED, id="unlisted-host"),
    pytest.param(BARE, "git.example.com", 22, R.PORT_NOT_LISTED, id="bare-name"),
    pytest.param(BARE, "a.example.net", 22, R.PORT_NOT_LISTED, id="bare-wildcard"),
    pytest.param(BARE, "git.example.com", 2222, (True, False), id="bare-other-high-port"),
    pytest.param(INTERNET_ANY, "git.example.com", 22, R.PORT_NOT_LISTED, id="star-not-22"),
    pytest.param(INTERNET_ANY, "git.example.com", 443, (True, False), id="star-other-ports"),
    pytest.param(SSH_AND_ANY, "git.example.com", 22, (True, False), id="star-and-listed-22"),
    pytest.param(SSH_AND_ANY, "www.example.com", 22, R.PORT_NOT_LISTED, id="star-beside-22"),
    pytest.param(SSH_AND_ANY, "www.example.com", 443, (True, False), id="star-beside-443"),
    # [lan] keeps every port (the seed's LAN): port 22 of a LAN name, private addresses only
    pytest.param(SSH_LAN, "nas.home.arpa", 22, (False, True), id="lan-name-22"),
    pytest.param(SSH_LAN, "git.example.com", 22, (False, True), id="internet-bare-lan-22"),
    pytest.param(LAN_ANY, "printer.home.arpa", 22, (False, True), id="lan-any-22"),
    pytest.param(EVERYTHING, "git.example.com", 22, (False, True), id="everything-lan-only"),
]


@pytest.mark.parametrize(("g", "host", "port", "expected"), SSH_TARGETS)
def test_port_22_only_where_listed(
    g: ProxyGrants, host: str, port: int, expected: Rule | tuple[bool, bool]
) -> None:
    test_target(g, host, port, expected)


def test_a_name_on_22_of_a_star_spec_is_refused_before_any_lookup() -> None:
    resolver = Resolver({"git.example.com": [PUBLIC]})
    verdict = decide(INTERNET_ANY, "git.example.com", 22, resolver=resolver)
    assert isinstance(verdict, Refused) and verdict.rule is R.PORT_NOT_LISTED
    assert "'git.example.com:22'" in verdict.reason  # the log says what to list
    assert resolver.asked == []


def test_internet_bare_and_lan_on_22_reaches_only_a_private_answer() -> None:
    public = decide(SSH_LAN, "git.example.com", 22, answer=[PUBLIC])
    assert isinstance(public, Refused) and public.rule is R.LAN_NOT_PRIVATE
    private = decide(SSH_LAN, "git.example.com", 22, answer=["10.1.2.3"])
    assert isinstance(private, Allowed) and private.rule is R.ALLOWED_LAN


def test_a_listed_22_reaches_its_public_address() -> None:
    verdict = decide(SSH, "git.example.com", 22, answer=[PUBLIC])
    assert outcome(verdict) == ("Allowed", R.ALLOWED_INTERNET, ip(PUBLIC))


def test_names_are_normalized_before_they_are_resolved() -> None:
    target = judge_target(WILD, "B\u00dcCHER.Example.com.", 443)
    assert isinstance(target, Target)
    assert target.host == "xn--bcher-kva.example.com"


@pytest.mark.parametrize(
    "host", ["localhost", "metadata.google.internal", "example.com", "nope.example.org", "a b"]
)
def test_a_refused_name_is_never_sent_to_the_resolver(host: str) -> None:
    resolver = Resolver({host: [PUBLIC]})
    verdict = decide(grants(internet=["*.example.com"]), host, resolver=resolver)
    assert isinstance(verdict, Refused)
    assert resolver.asked == []


def test_an_accepted_name_is_resolved_once() -> None:
    resolver = Resolver({"www.example.com": [PUBLIC]})
    verdict = decide(grants(internet=["*.example.com"]), "WWW.example.com", resolver=resolver)
    assert isinstance(verdict, Allowed)
    assert resolver.asked == ["www.example.com"]


@pytest.mark.parametrize(
    "host", ["example.com", "www.example.com", "nas.home.arpa", PUBLIC, "10.0.0.1", "[fd12::1]"]
)
def test_empty_grants_refuse_everything(host: str) -> None:
    resolver = Resolver({host: [PUBLIC]})
    verdict = decide(ProxyGrants(), host, resolver=resolver)
    assert verdict.rule in (R.NOT_LISTED, R.LITERAL_NOT_ALLOWED)
    assert resolver.asked == []


# ---- step 2: the resolver's answer ---------------------------------------------------------

W = "www.example.com"
NAS = "nas.home.arpa"


def case(
    g: ProxyGrants,
    host: str,
    answer: list[str],
    rule: Rule,
    dialed: str | None = None,
    *,
    id: str,
    machine: MachineView = MACHINE,
) -> object:
    return pytest.param(g, host, answer, machine, rule, dialed, id=id)


# grants, host, answer, the rule, the address dialed when allowed (machine: MACHINE unless said).
ANSWERS = [
    case(NET, W, [PUBLIC], R.ALLOWED_INTERNET, PUBLIC, id="public"),
    case(NET, W, ["2606:4700::1111"], R.ALLOWED_INTERNET, "2606:4700::1111", id="public-v6"),
    case(NET, W, [PUBLIC, PUBLIC_2], R.ALLOWED_INTERNET, PUBLIC, id="first-of-two"),
    case(NET, W, ["2002:5db8:d70e::1"], R.ALLOWED_INTERNET, PUBLIC, id="6to4-dialed-as-ipv4"),
    case(NET, W, [f"::ffff:{PUBLIC}"], R.ALLOWED_INTERNET, PUBLIC, id="mapped-dialed-as-ipv4"),
    case(NET, W, ["64:ff9b:1::5db8:d70e"], R.INTERNET_NOT_PUBLIC, id="nat64-local-use"),
    case(NET, W, ["10.0.0.5"], R.INTERNET_NOT_PUBLIC, id="internet-name-to-private"),
    case(NET, W, ["::ffff:10.0.0.5"], R.INTERNET_NOT_PUBLIC, id="internet-name-to-mapped-private"),
    case(NET, W, ["fd12::5"], R.INTERNET_NOT_PUBLIC, id="internet-name-to-ula"),
    case(NET, W, ["100.64.0.1"], R.INTERNET_NOT_PUBLIC, id="internet-name-to-cgnat"),
    case(NET, W, ["127.0.0.1"], R.NEVER_LOOPBACK, id="rebind-to-loopback"),
    case(NET, W, ["64:ff9b::7f00:1"], R.NEVER_LOOPBACK, id="rebind-to-nat64-loopback"),
    case(NET, W, ["::1"], R.NEVER_LOOPBACK, id="rebind-to-v6-loopback"),
    case(NET, W, ["0.0.0.0"], R.NEVER_THIS_MACHINE, id="rebind-to-unspecified"),
    case(NET, W, ["81.2.69.160"], R.NEVER_THIS_MACHINE, id="rebind-to-own-public-address"),
    case(NET, W, ["81.2.69.161"], R.NEVER_LOCAL_NETWORK, id="rebind-to-own-uplink-subnet"),
    case(NET, W, ["2a01:4f8:c17:1::10"], R.NEVER_THIS_MACHINE, id="rebind-to-own-v6"),
    case(NET, W, ["172.17.0.1"], R.NEVER_THIS_MACHINE, id="rebind-to-docker-bridge-address"),
    case(NET, W, ["172.17.0.2"], R.NEVER_LOCAL_NETWORK, id="rebind-to-container"),
    case(NET, W, ["169.254.169.254"], R.NEVER_METADATA, id="rebind-to-metadata"),
    case(NET, W, ["169.254.7.7"], R.NEVER_LINK_LOCAL, id="rebind-to-link-local"),
    case(NET, W, ["192.0.2.1"], R.INTERNET_NOT_PUBLIC, id="documentation-range"),
    case(NET, W, ["224.0.0.251"], R.INTERNET_NOT_PUBLIC, id="multicast"),
    case(NET, W, ["198.18.0.5"], R.INTERNET_NOT_PUBLIC, id="benchmark-range-not-public"),
    case(NET, W, ["198.18.0.5"], R.ALLOWED_INTERNET, "198.18.0.5", id="unsafe-public", machine=TM),
    case(NET, W, ["127.0.0.1"], R.NEVER_LOOPBACK, id="unsafe-keeps-loopback", machine=TM),
    case(NET, W, ["10.0.0.5"], R.INTERNET_NOT_PUBLIC, id="unsafe-keeps-private", machine=TM),
    # One refused address refuses the whole answer, whatever its place.
    case(NET, W, [PUBLIC, "10.0.0.5"], R.INTERNET_NOT_PUBLIC, id="mixed-public-first"),
    case(NET, W, ["10.0.0.5", PUBLIC], R.INTERNET_NOT_PUBLIC, id="mixed-private-first"),
    case(NET, W, [PUBLIC, "10.0.0.5", "127.0.0.1"], R.NEVER_LOOPBACK, id="mixed-never-first"),
    case(NET, W, [], R.NO_ADDRESS, id="no-address"),
    # An answer past the judged maximum is refused whole, its unjudged tail never dialed.
    case(NET, W, [f"81.2.70.{i}" for i in range(1, 65)], R.ALLOWED_INTERNET, "81.2.70.1", id="64"),
    case(NET, W, [f"81.2.70.{i}" for i in range(1, 66)], R.ANSWER_TOO_LONG, id="answer-65"),
    # [lan]: private only; CGNAT by exact address.
    case(LAN_ANY, NAS, ["192.168.1.20"], R.ALLOWED_LAN, "192.168.1.20", id="lan-any-private"),
    case(LAN_ANY, NAS, ["fd12:3456::1"], R.ALLOWED_LAN, "fd12:3456::1", id="lan-any-ula"),
    case(LAN_ANY, W, [PUBLIC], R.LAN_NOT_PRIVATE, id="lan-any-name-resolving-public"),
    case(LAN_ANY, NAS, ["192.168.1.20", PUBLIC], R.LAN_NOT_PRIVATE, id="lan-any-mixed"),
    case(LAN_ANY, NAS, ["100.64.0.1"], R.LAN_NOT_PRIVATE, id="lan-any-not-cgnat"),
    case(LAN_ANY, NAS, ["192.168.1.10"], R.NEVER_THIS_MACHINE, id="lan-name-to-this-machine"),
    case(LAN_ANY, NAS, ["192.168.122.5"], R.NEVER_LOCAL_NETWORK, id="lan-name-to-libvirt-guest"),
    case(LAN_ANY, NAS, ["10.88.0.5"], R.NEVER_LOCAL_NETWORK, id="lan-name-to-podman"),
    case(LAN_ANY, NAS, ["fd00:dead:beef::5"], R.NEVER_LOCAL_NETWORK, id="lan-name-to-ula-bridge"),
    case(LAN_ANY, NAS, ["fd00:ec2::254"], R.NEVER_METADATA, id="lan-name-to-aws-imds-v6"),
    case(LAN_NAME, NAS, ["10.0.0.5"], R.ALLOWED_LAN, "10.0.0.5", id="lan-name-private"),
    case(LAN_NAME, NAS, ["8.8.8.8"], R.LAN_NOT_PRIVATE, id="lan-name-public"),
    case(LAN_NAME, NAS, ["100.64.0.7"], R.ALLOWED_LAN, "100.64.0.7", id="lan-name-listed-cgnat"),
    case(LAN_NAME, NAS, ["100.64.0.8"], R.LAN_NOT_PRIVATE, id="lan-name-unlisted-cgnat"),
    # Both lists: each address needs one that allows it.
    case(EVERYTHING, W, [PUBLIC], R.ALLOWED_INTERNET, PUBLIC, id="both-public"),
    case(EVERYTHING, NAS, ["10.0.0.5"], R.ALLOWED_LAN, "10.0.0.5", id="both-private"),
    case(EVERYTHING, NAS, ["100.64.0.1"], R.INTERNET_NOT_PUBLIC, id="both-cgnat"),
    case(EVERYTHING, NAS, [PUBLIC, "127.0.0.1"], R.NEVER_LOOPBACK, id="both-never"),
    # A listed LAN range does not open it to an [internet] name.
    case(INTERNET_AND_RANGE, W, ["10.0.0.5"], R.INTERNET_NOT_PUBLIC, id="internet-into-lan-range"),
]


@pytest.mark.parametrize(("g", "host", "answer", "machine", "rule", "dialed"), ANSWERS)
def test_answer(
    g: ProxyGrants,
    host: str,
    answer: list[str],
    machine: MachineView,
    rule: Rule,
    dialed: str | None,
) -> None:
    verdict = decide(g, host, 443, answer, machine)
    assert verdict.rule is rule, verdict.reason
    if dialed is None:
        assert isinstance(verdict, Refused)
    else:
        assert verdict == Allowed(ip(dialed), 443, rule, verdict.reason)


# [lan] entries, literal host, port, the rule.
LITERALS = [
    pytest.param(["10.0.0.0/24"], "10.0.0.5", 22, R.ALLOWED_LAN, id="in-range-ssh"),
    pytest.param(["10.0.0.0/24"], "10.0.0.5", 8080, R.ALLOWED_LAN, id="in-range-any-port"),
    pytest.param(["10.0.0.0/24"], "10.0.1.5", 22, R.LITERAL_NOT_ALLOWED, id="out-of-range"),
    pytest.param(["192.168.1.20"], "192.168.1.20", 80, R.ALLOWED_LAN, id="exact"),
    pytest.param(["192.168.1.20"], "192.168.1.21", 80, R.LITERAL_NOT_ALLOWED, id="exact-next"),
    pytest.param(["::ffff:192.168.1.20"], "192.168.1.20", 80, R.ALLOWED_LAN, id="mapped-listed"),
    pytest.param(["fd12::/64"], "[fd12::5]", 80, R.ALLOWED_LAN, id="ula-range"),
    pytest.param(["100.64.0.7"], "100.64.0.7", 80, R.ALLOWED_LAN, id="cgnat-exact"),
    pytest.param(["100.64.0.7"], "100.64.0.8", 80, R.LITERAL_NOT_ALLOWED, id="cgnat-next"),
    pytest.param(["*"], "172.20.0.5", 80, R.ALLOWED_LAN, id="lan-any-private"),
    pytest.param(["*"], "172.17.0.5", 80, R.NEVER_LOCAL_NETWORK, id="lan-any-docker"),
    pytest.param(["192.168.1.0/24"], "192.168.1.10", 80, R.NEVER_THIS_MACHINE, id="own-lan-ip"),
    pytest.param(["172.16.0.0/12"], "172.17.0.1", 80, R.NEVER_THIS_MACHINE, id="docker0"),
    pytest.param(["172.16.0.0/12"], "[::ffff:ac11:2]", 80, R.NEVER_LOCAL_NETWORK, id="mapped-ct"),
]


@pytest.mark.parametrize(("lan", "host", "port", "rule"), LITERALS)
def test_lan_literal(lan: list[str], host: str, port: int, rule: Rule) -> None:
    verdict = decide(grants(lan=lan), host, port)
    assert verdict.rule is rule, verdict.reason
    assert isinstance(verdict, Allowed) == (rule is R.ALLOWED_LAN)


def test_a_literal_is_judged_on_itself_not_on_an_answer() -> None:
    g = grants(lan=["10.0.0.0/8"])
    target = judge_target(g, "10.0.0.5", 80)
    assert isinstance(target, Target)
    assert target.literal == ip("10.0.0.5")
    with pytest.raises(ValueError, match="judged on itself"):
        judge_addresses(g, target, (ip("10.0.0.6"),), MACHINE)


def test_a_verdict_names_the_rule_and_keeps_the_reason_for_the_log() -> None:
    verdict = decide(NET, "www.example.com", answer=["127.0.0.1"])
    assert verdict == Refused(R.NEVER_LOOPBACK, verdict.reason)
    assert "127.0.0.1" in verdict.reason and "www.example.com" in verdict.reason


def test_a_reason_quotes_a_long_host_cut() -> None:
    verdict = judge_target(EVERYTHING, "a" * 10_000, 443)
    assert isinstance(verdict, Refused)
    assert len(verdict.reason) < 400


def test_every_never_class_has_its_rule() -> None:
    assert set(policy._NEVER_RULES) == NEVER_CLASSES
    assert all(rule.value.startswith("never-") for rule in policy._NEVER_RULES.values())


# ---- grants ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param(LanEntry(network=net("8.8.8.0/24")), id="public-range"),
        pytest.param(LanEntry(network=net("100.64.0.0/10")), id="cgnat-range"),
        pytest.param(LanEntry(network=net("169.254.169.254/32")), id="metadata"),
        pytest.param(LanEntry(network=net("::ffff:169.254.169.254/128")), id="mapped-metadata"),
        pytest.param(LanEntry(), id="empty-entry"),
    ],
)
def test_grants_refuse_a_lan_entry_the_spec_would_refuse(entry: LanEntry) -> None:
    with pytest.raises(ValueError, match=r"\[lan\]"):
        ProxyGrants(lan=(entry,))


def test_from_grants_reads_internet_and_lan() -> None:
    g = grants(internet=["pypi.org", "*.pythonhosted.org:443"], lan=["10.0.0.0/8", "nas.home.arpa"])
    assert not g.internet_any and not g.lan_any
    assert sorted(str(p) for p in g.internet) == ["*.pythonhosted.org:443", "pypi.org"]
    assert sorted(str(e) for e in g.lan) == ["10.0.0.0/8", "nas.home.arpa"]
    assert grants(internet=["*"], lan=["*"]) == ProxyGrants(internet_any=True, lan_any=True)


# ---- one address, one verdict, however it is spelled -----------------------------------------

PROPERTY_GRANTS = grants(
    internet=["*"], lan=["10.0.0.0/8", "192.168.1.0/24", "172.16.0.0/12", "100.64.0.7"]
)
INTERESTING = [
    "127.0.0.1", "0.0.0.0", "169.254.169.254", "100.100.100.200", "168.63.129.16", "10.0.0.1",
    "172.17.0.1", "172.17.0.9", "192.168.1.10", "192.168.1.20", "100.64.0.7", "100.64.0.8",
    "198.18.0.5", "81.2.69.160", PUBLIC, "224.0.0.1", "255.255.255.255",
]  # fmt: skip
ADDRESSES = st.one_of(
    st.sampled_from(INTERESTING).map(ipaddress.IPv4Address),
    st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address),
)


def _check(judge: Callable[[str], Verdict], address: ipaddress.IPv4Address, form: str) -> None:
    assert outcome(judge(form)) == outcome(judge(str(address))), form


@given(ADDRESSES, st.data())
def test_every_spelling_of_an_ipv4_literal_gets_one_verdict(
    address: ipaddress.IPv4Address, data: st.DataObject
) -> None:
    form = data.draw(st.sampled_from(spellings(address)))
    _check(lambda host: decide(PROPERTY_GRANTS, host, 80, machine=TEST_MACHINE), address, form)


@given(ADDRESSES, st.data())
def test_every_ipv6_form_of_a_resolved_ipv4_gets_one_verdict(
    address: ipaddress.IPv4Address, data: st.DataObject
) -> None:
    # The local-use NAT64 prefix is left out on purpose: it is never PUBLIC (see addresses).
    forms = [f for f in spellings(address, nat64_local=False) if ":" in f]
    form = data.draw(st.sampled_from(forms))

    def judge(text: str) -> Verdict:
        return decide(EVERYTHING, "www.example.com", 443, [text.strip("[]")], TEST_MACHINE)

    _check(judge, address, form)


def test_the_unsafe_switch_opens_22_as_any_port_and_only_then() -> None:
    unsafe = replace(BARE, unsafe_listed_only_ports_open=True)
    target = judge_target(unsafe, "git.example.com", 22)
    assert isinstance(target, Target) and target.internet
    assert judge_target(unsafe, "other.example.org", 22) == judge_target(
        BARE, "other.example.org", 22
    )
    star = replace(INTERNET_ANY, unsafe_listed_only_ports_open=True)
    assert isinstance(judge_target(star, "git.example.com", 22), Target)
