"""The plan's probes against the shared proxy's caps: unread tunnels to a host the spec lists
(not tried without one), a refusal flood judged by the lines the proxy's log holds for it, and
nothing for a spec without a proxy; the verdicts each evidence gives."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from lnk_cli.check.plan import LEAKED, REFUSED
from lnk_cli.check.plan_caps import FLOOD_LINES, FLOOD_TARGET, HOLD_TUNNELS, cap_probes
from lnk_cli.check.verdicts import Outside, judge_probe
from lnk_shared.grants import Grants

DEFAULT_TUNNEL_CAP = 256  # lnk_proxy's max_tunnels_per_sandbox default


def _host(name: str, port: int | None = None, wildcard: bool = False) -> Any:
    return SimpleNamespace(name=name, port=port, wildcard=wildcard)


def _grants(internet: list[Any] = [], lan: list[Any] = [], proxy: bool = True) -> Grants:  # noqa: B006
    spec = SimpleNamespace(has_proxy=proxy, internet=internet, lan=lan)
    return cast(Grants, SimpleNamespace(spec=spec))


def test_the_tunnels_held_are_past_the_proxys_default_cap() -> None:
    assert HOLD_TUNNELS > DEFAULT_TUNNEL_CAP


def test_tunnels_go_to_the_first_single_listed_host_and_the_flood_to_this_machine() -> None:
    probes = cap_probes(
        tried=True, grants=_grants([_host("*.example.com", wildcard=True), _host("www", 8080)])
    )
    assert [p.id for p in probes] == ["proxy:tunnel-caps", "proxy:refusal-flood"]
    assert {p.expected for p in probes} == {REFUSED}
    hold, flood = (p.step or {} for p in probes)
    assert hold == {
        "id": "proxy:tunnel-caps",
        "kind": "proxy_hold",
        "target": "www:8080",
        "count": HOLD_TUNNELS,
    }
    assert flood["kind"] == "proxy_flood" and flood["target"] == FLOOD_TARGET


def test_without_a_single_listed_host_the_tunnels_are_not_tried_but_the_flood_is() -> None:
    ranges = SimpleNamespace(network=SimpleNamespace(num_addresses=256))
    probes = cap_probes(
        tried=True, grants=_grants([_host("*.example.com", wildcard=True)], [ranges])
    )
    assert probes[0].step is None and "no single host" in probes[0].not_tried
    assert probes[1].step is not None


def test_a_spec_without_a_proxy_gets_no_cap_probe() -> None:
    assert cap_probes(tried=True, grants=_grants(proxy=False)) == []


def test_without_caps_both_are_named_not_tried_with_the_flag_that_runs_them() -> None:
    probes = cap_probes(_grants([_host("www")]), tried=False)
    assert [p.id for p in probes] == ["proxy:tunnel-caps", "proxy:refusal-flood"]
    assert all(p.step is None and "--caps" in p.not_tried for p in probes)


@pytest.mark.parametrize(
    ("outcome", "lines", "verdict"),
    [
        ("stopped", 2, REFUSED),  # folded: the first line and one count
        ("stopped", FLOOD_LINES, REFUSED),
        ("stopped", FLOOD_LINES + 1, LEAKED),  # a line each: the log can be filled
        ("stopped", 500, LEAKED),
        ("through", 1, LEAKED),  # a flood request was not refused at all
    ],
)
def test_the_flood_is_judged_by_its_lines_in_the_log(
    outcome: str, lines: int, verdict: str
) -> None:
    flood = cap_probes(tried=True, grants=_grants())[1]
    outside = Outside(wire_refusals={FLOOD_TARGET: lines, "other:443": 10_000})
    result = {"outcome": outcome, "detail": "500 refused", "data": ""}
    assert judge_probe(flood, result, outside).verdict == verdict


@pytest.mark.parametrize(("outcome", "verdict"), [("stopped", REFUSED), ("through", LEAKED)])
def test_the_tunnels_are_judged_by_whether_every_one_was_held(outcome: str, verdict: str) -> None:
    hold = cap_probes(tried=True, grants=_grants([_host("www")]))[0]
    result = {"outcome": outcome, "detail": "-", "data": ""}
    assert judge_probe(hold, result, Outside()).verdict == verdict
