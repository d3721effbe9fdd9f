"""The plan's probes against the proxy's port-22 rule: an unlisted host's 22, a name listed
without a port on 22, nothing for a spec without a proxy; and the verdicts each evidence gives
(a refusal that is not the port rule's, under `*`, is a leak)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from lnk_cli.check.plan import LEAKED, REFUSED
from lnk_cli.check.plan_ssh import PORT_RULE, ssh_probes
from lnk_cli.check.verdicts import Outside, judge_probe
from lnk_shared.grants import Grants


def _host(name: str, port: int | None = None, wildcard: bool = False) -> Any:
    return SimpleNamespace(name=name, port=port, wildcard=wildcard)


def _grants(
    internet: list[Any] = [],  # noqa: B006
    *,
    any_host: bool = False,
    proxy: bool = True,
    host_mode: bool = False,
) -> Grants:
    spec = SimpleNamespace(
        has_proxy=proxy, internet=internet, internet_any=any_host, network_host=host_mode
    )
    return cast(Grants, SimpleNamespace(spec=spec))


@pytest.mark.parametrize(
    ("grants", "ids"),
    [
        (_grants(proxy=False), []),
        (_grants(host_mode=True), []),
        (_grants([_host("*.example.com", wildcard=True)]), ["proxy:ssh-unlisted"]),
        (_grants([_host("git.example", 22)]), ["proxy:ssh-unlisted"]),  # its own probe: allowed
        (_grants([_host("www.example", 443)]), ["proxy:ssh-unlisted"]),
        (
            _grants([_host("git.example", 22), _host("www.example"), _host("b.example")]),
            ["proxy:ssh-unlisted", "proxy:ssh-bare:www.example"],  # the first bare name only
        ),
        (_grants(any_host=True), ["proxy:ssh-unlisted"]),
    ],
)
def test_which_probes_a_spec_gets(grants: Grants, ids: list[str]) -> None:
    probes = ssh_probes(grants)
    assert [p.id for p in probes] == ids
    assert all(p.expected == REFUSED for p in probes)
    for probe in probes:
        assert probe.step is not None and probe.step["method"] == "CONNECT"
        assert probe.step["id"] == probe.id  # the probe program answers by it
        assert probe.step["target"].endswith(":22")


def test_the_unlisted_host_resolves_nowhere_and_is_new_each_check() -> None:
    first, second = (ssh_probes(_grants())[0].step or {} for _ in range(2))
    assert first["target"].endswith(".invalid:22") and first["target"] != second["target"]


def _judge(grants: Grants, which: int, outcome: str, refused: set[str]) -> str:
    probe = ssh_probes(grants)[which]
    target = (probe.step or {})["target"]
    outside = Outside(wire_refused=frozenset(f"{target} {r}: why" for r in refused))
    result = {"outcome": outcome, "detail": "403 lnk: refused", "data": ""}
    return judge_probe(probe, result, outside).verdict


@pytest.mark.parametrize(
    ("grants", "which", "outcome", "refused", "verdict"),
    [
        # a bare name on 22: the port rule's refusal, or leaked
        (_grants([_host("www.example")]), 1, "stopped", {PORT_RULE}, REFUSED),
        (_grants([_host("www.example")]), 1, "through", set(), LEAKED),
        (_grants([_host("www.example")]), 1, "stopped", {"no-address"}, LEAKED),
        # an unlisted name without `*`: any refusal (not-listed)
        (_grants([_host("www.example")]), 0, "stopped", {"not-listed"}, REFUSED),
        (_grants([_host("www.example")]), 0, "through", set(), LEAKED),
        # under `*` the lookup's refusal would come after the port was let through: leaked
        (_grants(any_host=True), 0, "stopped", {PORT_RULE}, REFUSED),
        (_grants(any_host=True), 0, "stopped", {"no-address"}, LEAKED),
    ],
)
def test_verdicts(
    grants: Grants, which: int, outcome: str, refused: set[str], verdict: str
) -> None:
    assert _judge(grants, which, outcome, refused) == verdict
