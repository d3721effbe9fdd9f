"""The plan's probes for a `[[services]]` rule: per rule, a method or route it does not list, a
CONNECT to its host and a key of the sandbox's own, each expected refused, each judged by the
proxy's log for exactly its target; never the secret, never an allowed method."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from lnk_cli.check.plan import REFUSED
from lnk_cli.check.plan_services import OWN_TOKEN, service_probes
from lnk_shared.grants import Grants
from lnk_shared.spec_services import TELEGRAM_HOST, ServiceRule

BOT = ServiceRule("telegram", TELEGRAM_HOST, "bot", ("getMe", "sendMessage"))
API = ServiceRule("bearer", "api.example.com", "key", ("GET /v1/items/*",))


def _grants(*rules: ServiceRule) -> Grants:
    return cast(Grants, SimpleNamespace(spec=SimpleNamespace(services=rules)))


def _steps(rule: ServiceRule) -> dict[str, dict[str, Any]]:
    return {p.id.rpartition(":")[2]: p.step or {} for p in service_probes(_grants(rule))}


def test_a_telegram_rule_gets_three_refused_probes_by_the_placeholder() -> None:
    probes = service_probes(_grants(BOT))
    assert [p.id for p in probes] == [
        f"service:telegram:{TELEGRAM_HOST}:method",
        f"service:telegram:{TELEGRAM_HOST}:connect",
        f"service:telegram:{TELEGRAM_HOST}:own-key",
    ]
    assert {p.expected for p in probes} == {REFUSED}
    steps = _steps(BOT)
    assert steps["method"]["path"] == "/bot0:lnk-secret-bot/getUpdates"
    assert steps["connect"] == {
        "id": f"service:telegram:{TELEGRAM_HOST}:connect",
        "kind": "proxy",
        "method": "CONNECT",
        "target": f"{TELEGRAM_HOST}:443",
    }
    assert steps["own-key"]["path"] == f"/bot{OWN_TOKEN}/getMe"
    wire = [e.value for p in probes for e in p.evidence]
    assert wire == [
        f"http://{TELEGRAM_HOST}/bot0:lnk-secret-bot/getUpdates",
        f"{TELEGRAM_HOST}:443",
        f"http://{TELEGRAM_HOST}/bot{OWN_TOKEN}/getMe",
    ]


@pytest.mark.parametrize(
    ("allow", "method"),
    [
        (("getUpdates",), "deleteMessage"),
        (("getUpdates", "deleteMessage", "sendDocument"), "lnkCheckNotListed"),
    ],
)
def test_the_refused_method_is_one_the_rule_does_not_list(
    allow: tuple[str, ...], method: str
) -> None:
    rule = ServiceRule("telegram", TELEGRAM_HOST, "bot", allow)
    assert _steps(rule)["method"]["path"].endswith(f"/{method}")


def test_a_bearer_rule_tries_an_unlisted_route_and_its_own_authorization() -> None:
    steps = _steps(API)
    assert (steps["method"]["verb"], steps["method"]["path"]) == ("DELETE", "/lnk-check-not-listed")
    assert steps["own-key"]["headers"] == [f"Authorization: Bearer {OWN_TOKEN}"]
    assert steps["own-key"]["path"] == "/v1/items"


def test_no_rule_no_probe() -> None:
    assert service_probes(_grants()) == []
