"""The plan's probes for a `[[models]]` rule: per local rule, one admin route of its kind asked
of its port inside the sandbox (expected refused, judged by the proxy's log for exactly that
URL), its inference reported allowed without a call, and a `[localhost]` grant of the runtime's
own port reported as a known gap; a hosted rule gets none (it is refused at launch)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from lnk_cli.check.plan import ALLOWED, KNOWN_GAP, REFUSED
from lnk_cli.check.plan_models import ADMIN_PROBES, model_probes
from lnk_proxy.http_request import RequestRefused
from lnk_proxy.model_routes import judge_model_route
from lnk_shared.grants import Grants
from lnk_shared.spec import Origin
from lnk_shared.spec_models import LOCAL_KINDS, ModelRule, parse_model_table


def _rule(kind: str, **extra: object) -> ModelRule:
    return parse_model_table({"kind": kind, "models": ["m"], **extra}, Origin("t", "models"))


def _grants(*rules: ModelRule, ports: tuple[int, ...] = ()) -> Grants:
    return cast(Grants, SimpleNamespace(spec=SimpleNamespace(models=rules, ports=ports)))


def test_an_ollama_rule_tries_a_pull_and_reports_its_inference_allowed() -> None:
    probes = model_probes(_grants(_rule("ollama")))
    assert [(p.id, p.expected) for p in probes] == [
        ("model:ollama:11434:admin", REFUSED),
        ("model:ollama:11434:inference", ALLOWED),
    ]
    assert probes[0].step == {
        "id": "model:ollama:11434:admin",
        "kind": "proxy",
        "method": "GET",
        "target": "127.0.0.1:11434",
        "verb": "POST",
        "path": "/api/pull",
    }
    assert [(e.kind, e.value) for e in probes[0].evidence] == [
        ("wire", "http://127.0.0.1:11434/api/pull")
    ]
    assert probes[1].step is None


def test_a_localhost_grant_of_the_runtimes_port_is_the_other_door() -> None:
    rule = _rule("ollama", port=11500)
    probes = model_probes(_grants(rule, ports=(11434,)))
    door = probes[-1]
    assert (door.id, door.expected) == ("model:ollama:11500:localhost-port", KNOWN_GAP)
    assert door.step is not None and door.step["port"] == 11434
    lan = _rule("ollama", port=11500, upstream="http://192.168.1.9:11434")
    assert len(model_probes(_grants(lan, ports=(11434,)))) == 2  # not this machine's port


@pytest.mark.parametrize("kind", LOCAL_KINDS)
def test_each_kinds_admin_probe_is_one_its_table_refuses(kind: str) -> None:
    verb, path = ADMIN_PROBES[kind]
    with pytest.raises(RequestRefused) as raised:
        judge_model_route(_rule(kind), verb, path)
    assert raised.value.rule == "model-admin"


def test_a_hosted_rule_gets_no_probe_here() -> None:
    hosted = parse_model_table(
        {"kind": "openai", "models": ["gpt-5"], "secret": "k"}, Origin("t", "models")
    )
    assert model_probes(_grants(hosted)) == []
