"""Proxy policy, the resolver's answer: every address of an answer judged (the whole answer
refused if one is), a literal on itself, one verdict for an address however it is spelled."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_world import (
    EVERYTHING,
    INTERNET_AND_RANGE,
    LAN_ANY,
    LAN_NAME,
    MACHINE,
    NET,
    PUBLIC,
    PUBLIC_2,
    TEST_MACHINE,
    TM,
    R,
    decide,
    grants,
    ip,
    outcome,
    spellings,
)

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
from lnk_shared.addresses import NEVER_CLASSES

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
