"""lnk_proxy.hosted_grant: a CONNECT to a hosted rule's provider is refused whatever it is
spelled as, by name and by every address its host resolved to, and each rule keeps its own
record of the response ids it was given."""

from __future__ import annotations

import ipaddress

import pytest

from lnk_proxy.hosted_grant import MAX_PROVIDER_ADDRESSES, HostedGrant, hosted_placeholder
from lnk_proxy.http_request import RequestRefused, parse_request_head
from lnk_shared.spec import Origin
from lnk_shared.spec_models import parse_model_table

ORIGIN = Origin("spec.toml", "models[0]", 1)
CLAUDE = parse_model_table({"kind": "anthropic", "models": ["claude-x"], "secret": "c"}, ORIGIN)
GPT = parse_model_table({"kind": "openai", "models": ["gpt-x"], "secret": "o"}, ORIGIN)
LOCAL = parse_model_table({"kind": "ollama", "models": ["llama3.2:3b"]}, ORIGIN)


def _connect(target: str) -> bytes:
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()


@pytest.mark.parametrize(
    "target",
    [
        "api.anthropic.com:443",
        "API.Anthropic.COM:443",
        "api.anthropic.com.:443",
        "api.openai.com:443",
        "api.openai.com:8443",
    ],
)
def test_a_connect_to_a_providers_host_is_refused(target: str) -> None:
    grant = HostedGrant((CLAUDE, GPT, LOCAL))
    with pytest.raises(RequestRefused) as caught:
        grant.refuse_connect(parse_request_head(_connect(target)))
    assert caught.value.rule == "model-plain-http-only"


def test_other_hosts_and_local_rules_are_not_the_grants() -> None:
    grant = HostedGrant((CLAUDE, LOCAL))
    assert grant.rules == (CLAUDE,)
    grant.refuse_connect(parse_request_head(_connect("api.openai.com:443")))
    assert grant.rule_for_host("api.openai.com") is None
    assert grant.rule_for_host("bad host") is None
    assert HostedGrant().rule_for_host("api.anthropic.com") is None


def test_each_rule_keeps_its_own_ids_and_its_placeholder_names_its_secret() -> None:
    grant = HostedGrant((CLAUDE, GPT))
    grant.issued(GPT).learn("resp_1")
    assert "resp_1" in grant.issued(GPT) and "resp_1" not in grant.issued(CLAUDE)
    assert "resp_1" not in HostedGrant((GPT,)).issued(GPT)  # another sandbox's grant
    assert hosted_placeholder(GPT) == "lnk-secret-o"


def _plain(target: str) -> bytes:
    return f"GET http://{target}/v1/models HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()


def test_a_plain_request_to_a_providers_host_on_another_port_is_refused() -> None:
    grant = HostedGrant((CLAUDE,))
    with pytest.raises(RequestRefused) as caught:
        grant.refuse_connect(parse_request_head(_plain("api.anthropic.com:8080")))
    assert caught.value.rule == "model-plain-http-only"
    assert "served on http:80" in caught.value.reason
    grant.refuse_connect(parse_request_head(_plain("api.anthropic.com")))  # its rule's way in


PROVIDER = ("198.18.0.3", "2001:db8::3")


@pytest.mark.parametrize(
    "address",
    [
        "198.18.0.3",
        "::ffff:198.18.0.3",  # the same IPv4 written as IPv6
        "64:ff9b::c612:3",  # and as NAT64
        "2001:db8::3",
    ],
)
def test_a_tunnel_to_an_address_the_providers_host_resolved_to_is_refused(address: str) -> None:
    grant = HostedGrant((CLAUDE, GPT))
    grant.learn(CLAUDE, [ipaddress.ip_address(a) for a in PROVIDER])
    with pytest.raises(RequestRefused) as caught:
        grant.refuse_tunnel_to(ipaddress.ip_address(address))
    assert caught.value.rule == "model-plain-http-only"
    assert "api.anthropic.com" in caught.value.reason
    assert "http://127.0.0.1:4001" in caught.value.reason  # the hint to the plain endpoint


@pytest.mark.parametrize("address", ["198.18.0.4", "2001:db8::4", "::ffff:198.18.0.4"])
def test_a_tunnel_to_another_address_is_the_policys(address: str) -> None:
    grant = HostedGrant((CLAUDE,))
    grant.learn(CLAUDE, [ipaddress.ip_address(a) for a in PROVIDER])
    grant.refuse_tunnel_to(ipaddress.ip_address(address))


def test_an_address_is_known_only_once_learned_for_every_rule_and_the_oldest_go_first() -> None:
    grant = HostedGrant((CLAUDE, GPT))
    assert not grant.knows_addresses()
    grant.learn(CLAUDE, [ipaddress.ip_address("198.18.0.3")])
    assert not grant.knows_addresses()  # GPT's host: none yet
    grant.learn(GPT, [ipaddress.ip_address("198.18.0.5")])
    assert grant.knows_addresses()
    assert HostedGrant((LOCAL,)).knows_addresses()  # no hosted rule: nothing to know
    many = [ipaddress.ip_address(0x0A000000 + i) for i in range(MAX_PROVIDER_ADDRESSES)]
    grant.learn(CLAUDE, many)
    grant.refuse_tunnel_to(ipaddress.ip_address("198.18.0.3"))  # pushed out: the oldest
    with pytest.raises(RequestRefused):
        grant.refuse_tunnel_to(many[-1])
