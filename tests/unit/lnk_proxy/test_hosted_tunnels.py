"""lnk_proxy.hosted_tunnels: while a hosted model rule is granted, a tunnel the policy allowed
is refused when its address is one the provider's host resolves to (the name as the sandbox's
resolver answers it, a real `UnsafeTableResolver` over a file), with the rule named and the
hint to the plain endpoint; another address keeps its tunnel; no known address refuses every
tunnel; the test-only switch lets it through."""

from __future__ import annotations

import asyncio
import ipaddress
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lnk_proxy.hosted_grant import HostedGrant
from lnk_proxy.hosted_tunnels import TunnelRefusal, judge_tunnel
from lnk_proxy.policy import Allowed, Rule
from lnk_proxy.resolver import AnswerCache, Resolver, UnsafeTableResolver
from lnk_shared.spec import Origin
from lnk_shared.spec_models import parse_model_table

ORIGIN = Origin("spec.toml", "models[0]", 1)
CLAUDE = parse_model_table({"kind": "anthropic", "models": ["claude-x"], "secret": "c"}, ORIGIN)
GPT = parse_model_table({"kind": "openai", "models": ["gpt-x"], "secret": "o"}, ORIGIN)


@dataclass
class _Owner:
    hosted: HostedGrant
    resolver: Resolver | None
    answers: AnswerCache = field(default_factory=AnswerCache)


@dataclass
class _Config:
    unsafe_hosted_tunnel_by_address: bool = False


def _table(tmp_path: Path, table: dict[str, list[str]]) -> UnsafeTableResolver:
    path = tmp_path / "dns.json"
    path.write_text(json.dumps(table))
    return UnsafeTableResolver(path)


def _allowed(address: str) -> Allowed:
    return Allowed(ipaddress.ip_address(address), 443, Rule.ALLOWED_INTERNET, "'*'")


def _judge(owner: _Owner, address: str, unsafe: bool = False) -> Allowed | TunnelRefusal:
    return asyncio.run(judge_tunnel(owner, _allowed(address), _Config(unsafe)))


TABLE = {"api.anthropic.com": ["198.18.0.3"], "api.openai.com": ["198.18.0.5", "2001:db8::5"]}


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("198.18.0.3", "api.anthropic.com"),  # its literal, or another name answering it
        ("::ffff:198.18.0.3", "api.anthropic.com"),
        ("2001:db8::5", "api.openai.com"),
    ],
)
def test_a_tunnel_to_a_providers_address_is_refused_naming_the_rule(
    tmp_path: Path, address: str, host: str
) -> None:
    owner = _Owner(HostedGrant((CLAUDE, GPT)), _table(tmp_path, TABLE))
    verdict = _judge(owner, address)
    assert isinstance(verdict, TunnelRefusal)
    assert verdict.rule == "model-plain-http-only"
    assert host in verdict.reason and "call its base URL" in verdict.reason


def test_a_tunnel_elsewhere_keeps_its_verdict(tmp_path: Path) -> None:
    owner = _Owner(HostedGrant((CLAUDE, GPT)), _table(tmp_path, TABLE))
    allowed = _allowed("198.18.0.9")
    assert asyncio.run(judge_tunnel(owner, allowed, _Config())) is allowed


def test_an_address_the_provider_answered_once_stays_refused(tmp_path: Path) -> None:
    resolver = _table(tmp_path, TABLE)
    owner = _Owner(HostedGrant((CLAUDE,)), resolver)
    assert isinstance(_judge(owner, "198.18.0.9"), Allowed)  # learns 198.18.0.3
    resolver.path.write_text(json.dumps({"api.anthropic.com": ["198.18.0.4"]}))  # rotated
    assert isinstance(_judge(owner, "198.18.0.3"), TunnelRefusal)
    assert isinstance(_judge(owner, "198.18.0.4"), TunnelRefusal)


def test_no_address_known_for_a_providers_host_refuses_every_tunnel(tmp_path: Path) -> None:
    owner = _Owner(HostedGrant((CLAUDE, GPT)), _table(tmp_path, {"api.openai.com": ["1.1.1.1"]}))
    verdict = _judge(owner, "198.18.0.9")
    assert isinstance(verdict, TunnelRefusal) and "no address known" in verdict.reason


def test_without_a_hosted_rule_nothing_is_looked_up(tmp_path: Path) -> None:
    owner = _Owner(HostedGrant(()), None)  # a lookup would fail on the missing resolver
    assert isinstance(_judge(owner, "198.18.0.3"), Allowed)


def test_the_unsafe_switch_lets_a_providers_address_through_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    owner = _Owner(HostedGrant((CLAUDE,)), _table(tmp_path, TABLE))
    assert isinstance(_judge(owner, "198.18.0.3", unsafe=True), Allowed)
    assert "unsafe_hosted_tunnel_by_address" in caplog.text
