"""The plan's probes for a hosted `[[models]]` rule: per rule a server tool, a URL fetch, a
CONNECT to the provider and a key of the sandbox's own, each expected refused, each judged by
the proxy's log for exactly its target (and what its refusal must say); never a model the rule
lists (nothing may reach the provider), never the secret."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import pytest

from lnk_cli.check.plan import REFUSED, Evidence
from lnk_cli.check.plan_hosted import NOT_A_MODEL, OTHER_MODELS, OWN_KEY, hosted_probes
from lnk_shared.grants import Grants
from lnk_shared.spec import Origin
from lnk_shared.spec_models import ModelRule, parse_model_table

ORIGIN = Origin("spec.toml", "models[0]", 3)


def _rule(kind: str, models: list[str]) -> ModelRule:
    return parse_model_table({"kind": kind, "models": models, "secret": "key"}, ORIGIN)


def _grants(*rules: ModelRule) -> Grants:
    return cast(Grants, SimpleNamespace(spec=SimpleNamespace(models=rules)))


def _steps(rule: ModelRule) -> dict[str, dict[str, Any]]:
    return {p.id.rpartition(":")[2]: p.step or {} for p in hosted_probes(_grants(rule))}


@pytest.mark.parametrize(
    ("kind", "port", "path", "tool", "key_header"),
    [
        ("anthropic", 4001, "/v1/messages", "web_search_20250305", "x-api-key: "),
        ("openai", 4000, "/v1/responses", "web_search", "Authorization: Bearer "),
    ],
)
def test_a_hosted_rule_gets_four_refused_probes_that_never_name_its_models(
    kind: str, port: int, path: str, tool: str, key_header: str
) -> None:
    rule = _rule(kind, ["claude-x", "gpt-x"])
    probes = hosted_probes(_grants(rule))
    ident = f"model:{kind}:{port}"
    assert [p.id for p in probes] == [
        f"{ident}:server-tool",
        f"{ident}:url-fetch",
        f"{ident}:route",
        f"{ident}:connect",
        f"{ident}:own-key",
    ]
    assert {p.expected for p in probes} == {REFUSED}
    steps = _steps(rule)
    url = f"http://127.0.0.1:{port}{path}"
    for name in ("server-tool", "url-fetch", "own-key"):
        step = steps[name]
        assert (step["target"], step["path"], step["verb"]) == (f"127.0.0.1:{port}", path, "POST")
        assert json.loads(step["body"])["model"] == NOT_A_MODEL
    assert json.loads(steps["server-tool"]["body"])["tools"][0]["type"] == tool
    assert steps["server-tool"]["headers"] == [f"{key_header}lnk-secret-key"]
    assert steps["own-key"]["headers"] == [f"{key_header}{OWN_KEY}"]
    assert "https://" in steps["url-fetch"]["body"]
    assert steps["connect"]["target"] == f"api.{kind}.com:443"
    evidence = {p.id.rpartition(":")[2]: p.evidence for p in probes}
    assert evidence["server-tool"] == (
        Evidence("wire", url),
        Evidence("wire-said", (url, f"removed tool '{tool}'")),
    )
    assert evidence["url-fetch"][1] == Evidence("wire-said", (url, "model-fetch"))
    assert evidence["own-key"][1] == Evidence("wire-said", (url, "model-own-key"))
    files = f"http://127.0.0.1:{port}/v1/files"
    assert steps["route"]["path"] == "/v1/files" and "body" not in steps["route"]
    assert evidence["route"] == (
        Evidence("wire", files),
        Evidence("wire-said", (files, "model-route")),
    )


def test_a_rule_whose_prefix_would_take_the_probes_model_gets_another() -> None:
    rule = _rule("openai", ["lnk-check*"])
    models = {json.loads(s["body"])["model"] for s in _steps(rule).values() if "body" in s}
    assert models == {OTHER_MODELS[0]} and not rule.allows_model(OTHER_MODELS[0])


def test_a_rule_whose_prefixes_take_every_candidate_is_not_tried_but_connect_is() -> None:
    rule = _rule("openai", ["lnk*", "zz*", "0*", "Q*"])
    probes = {p.id.rpartition(":")[2]: p for p in hosted_probes(_grants(rule))}
    assert probes["connect"].step is not None and probes["route"].step is not None
    assert all(probes[n].step is None and probes[n].not_tried for n in ("server-tool", "own-key"))


def test_local_model_rules_get_none_of_these() -> None:
    local = parse_model_table({"kind": "ollama", "models": ["llama3.2:3b"]}, ORIGIN)
    assert hosted_probes(_grants(local)) == []
