"""The plan's probes for a hosted rule's provider by address: a CONNECT to its host's address
and one to another name for it, each expected refused and judged by the proxy's log; the second
must show the hosted rule's refusal when `[internet]` reaches the name (else the policy's
refusal comes first and proves nothing of it); a probe with nothing to try says why."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from lnk_cli.check.plan import REFUSED, Evidence
from lnk_cli.check.plan_hosted_tunnels import (
    TUNNEL_RULE,
    ProviderNames,
    hosted_tunnel_probes,
    look_up_names,
    look_up_providers,
)
from lnk_shared.grants import Grants
from lnk_shared.hosts import parse_host_pattern
from lnk_shared.spec import Origin
from lnk_shared.spec_models import ModelRule, parse_model_table

ORIGIN = Origin("spec.toml", "models[0]", 3)
CLAUDE = parse_model_table({"kind": "anthropic", "models": ["c"], "secret": "k"}, ORIGIN)
LOCAL = parse_model_table({"kind": "ollama", "models": ["llama3.2:3b"]}, ORIGIN)
FOUND = {"api.anthropic.com": ProviderNames(("198.18.0.3",), ("front.cdn.example",))}
IDENT = "model:anthropic:4001"


def _grants(*rules: ModelRule, internet: tuple[str, ...] = (), any_host: bool = False) -> Grants:
    hosts = tuple(parse_host_pattern(h) for h in internet)
    spec = SimpleNamespace(models=rules, internet=hosts, internet_any=any_host)
    return cast(Grants, SimpleNamespace(spec=spec))


@pytest.mark.parametrize(
    ("internet", "any_host", "said"),
    [
        ((), True, True),  # `*` reaches the name: the hosted rule must be the one refusing
        (("*.cdn.example",), False, True),
        (("front.cdn.example",), False, True),
        (("www.example.com",), False, False),  # not reached: the policy refuses it first
        ((), False, False),
    ],
)
def test_a_hosted_rule_gets_a_connect_by_address_and_by_another_name(
    internet: tuple[str, ...], any_host: bool, said: bool
) -> None:
    probes = hosted_tunnel_probes(
        _grants(CLAUDE, LOCAL, internet=internet, any_host=any_host), FOUND
    )
    assert [p.id for p in probes] == [f"{IDENT}:connect-address", f"{IDENT}:connect-other-name"]
    assert {p.expected for p in probes} == {REFUSED}
    by_address, by_name = probes
    assert by_address.step == {
        "id": f"{IDENT}:connect-address",
        "kind": "proxy",
        "method": "CONNECT",
        "target": "198.18.0.3:443",
    }
    assert by_address.evidence == (Evidence("wire", "198.18.0.3:443"),)
    assert by_name.step is not None and by_name.step["target"] == "front.cdn.example:443"
    expected = [Evidence("wire", "front.cdn.example:443")]
    if said:
        expected.append(Evidence("wire-said", ("front.cdn.example:443", TUNNEL_RULE)))
    assert by_name.evidence == tuple(expected)


def test_an_ipv6_address_is_written_as_a_literal_and_nothing_known_is_not_tried() -> None:
    found = {"api.anthropic.com": ProviderNames(("2001:db8::3",), ())}
    by_address, by_name = hosted_tunnel_probes(_grants(CLAUDE, any_host=True), found)
    assert by_address.step is not None and by_address.step["target"] == "[2001:db8::3]:443"
    assert by_name.step is None and "no other name" in by_name.not_tried
    nothing = hosted_tunnel_probes(_grants(CLAUDE), {})
    assert [p.step for p in nothing] == [None, None]
    assert "no address" in nothing[0].not_tried
    assert hosted_tunnel_probes(_grants(LOCAL), FOUND) == []  # a local rule: none


def test_the_look_up_asks_this_machines_resolver_forward_then_back() -> None:
    found = look_up_names("localhost")  # /etc/hosts: every machine has it
    assert set(found.addresses) & {"127.0.0.1", "::1"}
    assert "localhost" not in found.other_names
    assert all(set(look_up_names(n).addresses) & set(found.addresses) for n in found.other_names)
    assert look_up_names("lnk-check.invalid") == ProviderNames()  # .invalid never resolves
    assert look_up_providers(_grants(LOCAL)) == {}  # a local rule: nothing asked
