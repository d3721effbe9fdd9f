"""The plan's probes for a `[[models]]` rule: per local rule, one admin route of its kind asked
of its port inside the sandbox (expected refused, judged by the proxy's log for exactly that
URL), its inference reported allowed without a call, and a `[localhost]` grant of the runtime's
own port reported as a known gap; each listing route of its kind asked, its answer read for a
model the rule does not allow (`not_allowed`, read with the keys the proxy cuts); a hosted rule
gets none here (`plan_hosted`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from lnk_cli.check.plan import ALLOWED, KNOWN_GAP, REFUSED
from lnk_cli.check.plan_models import ADMIN_PROBES, LISTINGS, model_probes, not_allowed
from lnk_proxy import model_listings
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
    probes = model_probes(_grants(_rule("ollama")))[3:]  # after its three listings
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
    assert len(model_probes(_grants(lan, ports=(11434,)))) == 5  # not this machine's port


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


def test_each_kind_asks_every_listing_the_proxy_cuts() -> None:
    for kind in LOCAL_KINDS:
        asked = {
            p.step["path"]
            for p in model_probes(_grants(_rule(kind)))
            if p.step and p.step["kind"] == "model_listing"
        }
        cut = {path for (k, path) in model_listings.LISTINGS if k == kind}
        assert asked == cut, kind
        for path in asked:  # each an allowed route (a refused one would prove nothing)
            judge_model_route(_rule(kind), "GET", path)


def test_the_listing_keys_are_the_proxys() -> None:
    for (kind, path), keys in model_listings.LISTINGS.items():
        naming = {k: v for k, v in keys.items() if v}  # `object` names no model
        assert LISTINGS[kind][path] == naming, (kind, path)


def test_a_listing_probe_step_and_its_evidence() -> None:
    rule = _rule("llamacpp", port=8090)
    probe = next(p for p in model_probes(_grants(rule)) if p.id.endswith(":listing:models"))
    assert probe.id == "model:llamacpp:8090:listing:models"
    assert probe.expected == REFUSED
    assert probe.step == {
        "id": "model:llamacpp:8090:listing:models",
        "kind": "model_listing",
        "target": "127.0.0.1:8090",
        "path": "/models",
    }
    assert [(e.kind, e.value, e.path) for e in probe.evidence] == [("listing", rule, "/models")]


_TAGS = '{"models": [{"name": "m", "model": "m"}, {"name": "bait:7b", "model": "bait:7b"}]}'


@pytest.mark.parametrize(
    ("path", "answer", "named"),
    [
        ("/api/tags", _TAGS, ["bait:7b"]),
        ("/api/tags", '{"models": [{"name": "m", "model": "m"}]}', []),  # cut: nothing else
        ("/api/tags", '{"models": [{"name": "m", "model": "other"}]}', ["other"]),  # either field
        ("/api/ps", '{"models": [{"model": "x1"}, {"name": "x2"}, "x3", 4]}', ["x1", "x2"]),
        ("/v1/models", '{"object": "list", "data": [{"id": "m"}, {"id": "z"}]}', ["z"]),
        ("/v1/models", '{"data": [{"id": "z"}], "models": [{"name": "y"}]}', ["z"]),  # its keys
        ("/api/tags", '{"models": [{"name": "b"}, {"name": "a"}, {"name": "b"}]}', ["a", "b"]),
        ("/api/tags", "403 refused", []),  # not JSON: it told the sandbox nothing
        ("/api/tags", '["m", "z"]', []),
        ("/api/tags", '{"models": "z"}', []),
        ("/api/tags", "", []),
        ("/api/tags", None, []),  # a hostile answer's data, not even text
        ("/api/tags", 7, []),
    ],
)
def test_not_allowed_reads_a_listing_with_its_kinds_keys(
    path: str, answer: object, named: list[str]
) -> None:
    assert not_allowed(_rule("ollama"), path, answer) == named


def test_not_allowed_takes_the_rules_prefixes() -> None:
    rule = parse_model_table({"kind": "vllm", "models": ["qwen*"]}, Origin("t", "models"))
    answer = '{"data": [{"id": "qwen2.5"}, {"id": "llama3"}]}'
    assert not_allowed(rule, "/v1/models", answer) == ["llama3"]
