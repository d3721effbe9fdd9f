"""Proxy policy: every rule refuses its attack and allows its neighbour, in every spelling:
the target before any lookup, port 22, the grants (the resolver's answers:
test_policy_answers.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from policy_world import (
    EVERYTHING,
    GOOGLE,
    INTERNET_ANY,
    LAN_ANY,
    LAN_NAME,
    NET,
    PUBLIC,
    WILD,
    R,
    Resolver,
    decide,
    grants,
    ip,
    net,
    outcome,
    spelled,
)

from lnk_proxy.policy import (
    Allowed,
    ProxyGrants,
    Refused,
    Rule,
    Target,
    judge_target,
)
from lnk_shared.spec import LanEntry


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


def test_the_unsafe_switch_opens_22_as_any_port_and_only_then() -> None:
    unsafe = replace(BARE, unsafe_listed_only_ports_open=True)
    target = judge_target(unsafe, "git.example.com", 22)
    assert isinstance(target, Target) and target.internet
    assert judge_target(unsafe, "other.example.org", 22) == judge_target(
        BARE, "other.example.org", 22
    )
    star = replace(INTERNET_ANY, unsafe_listed_only_ports_open=True)
    assert isinstance(judge_target(star, "git.example.com", 22), Target)
