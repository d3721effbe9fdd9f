"""The plan's body-bound probes: per model rule (local or hosted), a body nested past the
proxy's scanned depth and one of more values than it parses, posted to an inference route at the
rule's port, naming a model the rule does not list. Judged against the proxy's own readers: each
body is refused by the scan with the words the probe's evidence looks for, and with the scan
skipped (the `unsafe_unbounded_model_bodies` switch) it is still refused, but without them, so
check reports `leaked` and no body is ever forwarded either way."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from lnk_cli.check.plan import REFUSED
from lnk_cli.check.plan_bodies import (
    BODY_SHAPES,
    BOUND_SAID,
    COST_RATIO,
    INFERENCE,
    NESTING,
    PADS,
    body_probes,
)
from lnk_cli.check.plan_hosted import NOT_A_MODEL
from lnk_inside.probes_models import make_body, make_nesting_bodies
from lnk_proxy import json_shape, strict_json
from lnk_proxy.http_request import RequestRefused
from lnk_proxy.model_bodies import judge_model_body
from lnk_proxy.model_routes import judge_model_route
from lnk_shared.grants import Grants
from lnk_shared.spec import Origin
from lnk_shared.spec_models import LOCAL_KINDS, ModelRule, parse_model_table


def _rule(kind: str, models: tuple[str, ...] = ("m",), **extra: object) -> ModelRule:
    table: dict[str, object] = {"kind": kind, "models": list(models), **extra}
    if kind in ("anthropic", "openai"):
        table["secret"] = "k"
    return parse_model_table(table, Origin("t", "models"))


def _grants(*rules: ModelRule) -> Grants:
    return cast(Grants, SimpleNamespace(spec=SimpleNamespace(models=rules, ports=())))


def test_each_rule_gets_a_deep_and_a_wide_body() -> None:
    rule = _rule("ollama", port=11500)
    probes = body_probes(_grants(rule))
    assert [(p.id, p.expected) for p in probes] == [
        ("model:ollama:11500:deep-body", REFUSED),
        ("model:ollama:11500:wide-body", REFUSED),
        ("model:ollama:11500:nesting-cost", REFUSED),
    ]
    step = probes[1].step
    assert step == {
        "id": "model:ollama:11500:wide-body",
        "kind": "model_body",
        "target": "127.0.0.1:11500",
        "verb": "POST",
        "path": "/api/chat",
        "headers": [],
        "shape": "wide",
        "count": BODY_SHAPES["wide"],
        "pad": 0,
        "model": NOT_A_MODEL,
    }
    url = "http://127.0.0.1:11500/api/chat"
    assert [(e.kind, e.value) for e in probes[1].evidence] == [
        ("wire", url),
        ("wire-said", (url, BOUND_SAID)),
    ]


def test_a_hosted_rule_sends_its_placeholder_key() -> None:
    probes = body_probes(_grants(_rule("anthropic", port=4001)))
    assert [p.id for p in probes] == [
        "model:anthropic:4001:deep-body",
        "model:anthropic:4001:wide-body",
        "model:anthropic:4001:nesting-cost",
    ]
    assert probes[0].step is not None
    assert probes[0].step["headers"] == ["x-api-key: lnk-secret-k"]
    assert probes[0].step["path"] == "/v1/messages"


def test_a_rule_whose_prefixes_take_every_name_is_not_tried() -> None:
    probes = body_probes(_grants(_rule("vllm", models=("l*", "z*", "0*", "Q*"))))
    assert [p.step for p in probes] == [None, None, None]
    assert all("prefixes" in p.not_tried for p in probes)


@pytest.mark.parametrize("kind", LOCAL_KINDS)
def test_each_local_kinds_route_takes_a_body(kind: str) -> None:
    route = judge_model_route(_rule(kind), "POST", INFERENCE[kind])
    assert route.body != "none"


@pytest.mark.parametrize("shape", BODY_SHAPES)
def test_the_local_reader_refuses_each_body_by_the_bound_and_without_it_otherwise(
    shape: str,
) -> None:
    rule = _rule("ollama")
    route = judge_model_route(rule, "POST", "/api/chat")
    body = make_body(shape, BODY_SHAPES[shape], NOT_A_MODEL, PADS[shape])
    assert len(body) > strict_json.MAX_VALUES  # large enough that the proxy scans it
    with pytest.raises(RequestRefused) as bounded:
        judge_model_body(rule, route, body)
    assert BOUND_SAID in bounded.value.reason
    with pytest.raises(RequestRefused) as unbounded:  # the switch: parsed, refused otherwise
        judge_model_body(rule, route, body, bounded=False)
    assert BOUND_SAID not in unbounded.value.reason


@pytest.mark.parametrize("shape", BODY_SHAPES)
def test_the_hosted_reader_refuses_each_body_by_the_bound_and_without_it_parses(
    shape: str,
) -> None:
    body = make_body(shape, BODY_SHAPES[shape], NOT_A_MODEL, PADS[shape])
    with pytest.raises(RequestRefused) as bounded:
        strict_json.read(body)
    assert BOUND_SAID in bounded.value.reason
    if shape == "wide":  # parsed whole: the class the bound closes
        assert len(strict_json.read(body, bounded=False).value["messages"]) == BODY_SHAPES[shape]
    else:  # the parser's own recursion limit: refused, but not before the parse
        with pytest.raises(RequestRefused) as parsed:
            strict_json.read(body, bounded=False)
        assert BOUND_SAID not in parsed.value.reason


@pytest.mark.parametrize(
    ("shape", "count"), [("deep", 0), ("wide", -1), ("tall", 3), ("wide", 2**24), ("deep", -5)]
)
def test_make_body_refuses_what_a_plan_should_not_ask(shape: str, count: int) -> None:
    with pytest.raises(ValueError):
        make_body(shape, count, "m")


def test_make_body_is_json_of_that_shape() -> None:
    import json

    assert json.loads(make_body("deep", 3, "m")) == {"model": "m", "messages": [[[]]]}
    assert json.loads(make_body("wide", 3, "m")) == {"model": "m", "messages": [0, 0, 0]}
    padded = json.loads(make_body("deep", 1, "m", pad=4))
    assert padded == {"model": "m", "lnk_check_pad": "xxxx", "messages": []}


def test_the_nesting_probe_sends_its_bodies_and_is_judged_by_cost() -> None:
    probe = body_probes(_grants(_rule("anthropic", port=4001)))[2]
    assert probe.step is not None
    assert probe.step["kind"] == "model_nesting"
    assert {k: probe.step[k] for k in NESTING} == NESTING
    assert probe.step["headers"] == ["x-api-key: lnk-secret-k"]
    url = "http://127.0.0.1:4001/v1/messages"
    assert [(e.kind, e.value) for e in probe.evidence] == [("wire", url), ("cost", COST_RATIO)]


def _nesting_pair() -> tuple[bytes, bytes]:
    return make_nesting_bodies(NESTING["runs"], NESTING["depth"], NESTING["flat"], NOT_A_MODEL)


def test_the_nesting_bodies_are_within_every_bound_before_the_count() -> None:
    """Scanned (past 2**20 bytes), under the value count, nested within the scanned depth: so
    the count of the nesting is reached, for both, and the same size."""
    for body in _nesting_pair():
        assert len(body) > strict_json.MAX_VALUES
        assert strict_json.refuse_many_values(body) is None
    deep, flat = _nesting_pair()
    assert len(deep) - len(flat) < 2 * NESTING["flat"] + 1


@pytest.mark.parametrize("per_level", [False, True])
def test_both_nesting_bodies_are_refused_by_every_reader_with_or_without_the_switch(
    per_level: bool,
) -> None:
    """Only the count's cost may differ: the verdict is one (no body ever forwarded)."""
    rule = _rule("ollama")
    route = judge_model_route(rule, "POST", "/api/chat")
    json_shape.count_nesting_per_level(per_level)
    try:
        for body in _nesting_pair():
            with pytest.raises(RequestRefused) as hosted:
                strict_json.read(body)
            assert "too large for a double" in hosted.value.reason
            with pytest.raises(RequestRefused) as local:
                judge_model_body(rule, route, body)
            assert "twice" in local.value.reason
    finally:
        json_shape.count_nesting_per_level(False)
    assert json_shape._nesting_within is not None  # the one pass is back
