"""The plan's fast-form probes: per hosted rule, the spellings a screen of the bytes as written
would miss, posted to its inference route naming a model the rule does not list. Judged by the
proxy's own `judge_hosted` on the very bytes the probe program sends: the strict pass refuses
each with the rule its evidence looks for; the test-only naive screen lets each by to the model
refusal instead (so check reports `leaked`), and nothing is forwarded either way."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from lnk_cli.check.plan import REFUSED
from lnk_cli.check.plan_fast_form import ROUTES, SPELLINGS, fast_form_probes
from lnk_cli.check.plan_hosted import NOT_A_MODEL
from lnk_proxy.hosted_models import IssuedIds, judge_hosted
from lnk_proxy.http_request import RequestRefused
from lnk_shared.grants import Grants
from lnk_shared.spec import Origin
from lnk_shared.spec_models import ModelRule, parse_model_table


def _rule(kind: str, models: tuple[str, ...] = ("claude-x",)) -> ModelRule:
    table = {"kind": kind, "models": list(models), "secret": "k"}
    return parse_model_table(table, Origin("t", "models"))


def _grants(*rules: ModelRule) -> Grants:
    return cast(Grants, SimpleNamespace(spec=SimpleNamespace(models=rules, ports=())))


def _judged(rule: ModelRule, step: dict[str, object], *, naive: bool) -> RequestRefused:
    body = str(step["body"]).encode(str(step["encoding"]))  # as lnk_inside/probes.py sends it
    with pytest.raises(RequestRefused) as refused:
        judge_hosted(
            rule.kind,
            f"lnk-secret-{rule.secret}",
            rule.allows_model,
            method="POST",
            target=str(step["path"]),
            headers=(),
            untrusted_body=body,
            issued=IssuedIds(),
            naive_screen=naive,
        )
    return refused.value


def test_each_hosted_rule_gets_each_spelling_and_a_local_rule_none() -> None:
    local = parse_model_table({"kind": "ollama", "models": ["m"]}, Origin("t", "models"))
    rules = (_rule("anthropic"), _rule("openai", ("gpt-x",)), local)
    probes = fast_form_probes(_grants(*rules))
    assert [p.id for p in probes] == [
        f"model:{kind}:{port}:{name}"
        for kind, port in (("anthropic", 4001), ("openai", 4000))
        for name in SPELLINGS
    ]
    assert {p.expected for p in probes} == {REFUSED}
    targets = [
        (p.step["path"], SPELLINGS[p.id.rsplit(":", 1)[1]][2][:10]) for p in probes if p.step
    ]
    assert len(set(targets)) == len(targets)  # a (route, rule) of its own: never aggregated
    for probe in probes:
        assert probe.step is not None and NOT_A_MODEL in str(probe.step["body"])
        url = f"http://{probe.step['target']}{probe.step['path']}"
        said = SPELLINGS[probe.id.rsplit(":", 1)[1]][2]
        assert [(e.kind, e.value) for e in probe.evidence] == [
            ("wire", url),
            ("wire-said", (url, said)),
        ]


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
@pytest.mark.parametrize("name", list(SPELLINGS))
def test_the_strict_pass_refuses_each_by_its_rule_and_the_naive_screen_does_not(
    kind: str, name: str
) -> None:
    rule = _rule(kind)
    probe = next(p for p in fast_form_probes(_grants(rule)) if p.id.endswith(f":{name}"))
    assert probe.step is not None
    strict = _judged(rule, probe.step, naive=False)
    assert SPELLINGS[name][2] in f"{strict.rule}: {strict.reason}"  # the wire line's words
    naive = _judged(rule, probe.step, naive=True)
    assert naive.rule == "model-name"  # reported leaked: not the words above
    assert SPELLINGS[name][2] not in f"{naive.rule}: {naive.reason}"


def test_no_other_hosted_probe_of_the_url_is_refused_with_a_spellings_words() -> None:
    """The evidence reads every refusal of the same URL: another probe's must not say them."""
    from lnk_cli.check.plan_hosted import hosted_probes

    for rule in (_rule("anthropic"), _rule("openai", ("gpt-x",))):
        for probe in hosted_probes(_grants(rule)):
            if probe.step is None or probe.step.get("method") != "POST":
                continue
            assert probe.step["path"] not in ROUTES[rule.kind].values(), probe.id
            refused = _judged(rule, {**probe.step, "encoding": "utf-8"}, naive=False)
            for _, _, said in SPELLINGS.values():
                assert said not in f"{refused.rule}: {refused.reason}", probe.id


def test_bad_utf8_is_sent_as_bytes_not_as_utf8() -> None:
    probe = next(p for p in fast_form_probes(_grants(_rule("anthropic"))) if "utf8" in p.id)
    assert probe.step is not None
    assert b"\xff\xfe" in str(probe.step["body"]).encode("latin-1")


def test_a_rule_that_takes_every_name_is_not_tried() -> None:
    probes = fast_form_probes(_grants(_rule("anthropic", ("lnk*", "zz*", "0*", "Q*"))))
    assert all(p.step is None and p.not_tried for p in probes)
