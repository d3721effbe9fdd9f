"""lnk_proxy.service_relay and the admin frames that carry a sandbox's service rules and secrets:
rules read by the spec model's own rules, values checked and never repeated in an error, a
secret removed (or never sent) refusing its rule's requests, a CONNECT to a rule host refused,
and the proxy's `unsafe_skip_service_method_check` reopening exactly the method check."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk_proxy.admin import OpenCommand, SecretsCommand, parse_command
from lnk_proxy.http_request import ProxyRequest, RequestRefused, parse_request_head
from lnk_proxy.service_relay import (
    ServiceGrant,
    parse_service_secrets,
    parse_services,
    scrub_text,
)
from lnk_shared.spec_services import TELEGRAM_HOST, ServiceRule

BOT = ServiceRule("telegram", TELEGRAM_HOST, "bot", ("getMe", "sendMessage"))
TABLE = {"kind": "telegram", "host": TELEGRAM_HOST, "secret": "bot", "allow": ["getme"]}
VALUE = "1234567890:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
P = "0:lnk-secret-bot"
PROXY_SECRET = "s" * 43


@pytest.fixture
def run_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as path:
        yield Path(path)


def _request(target: str, method: str = "GET", *headers: str) -> ProxyRequest:
    authority = target.split("/")[2] if "://" in target else target
    host = authority.partition(":")[0]
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", *headers, "", ""]
    return parse_request_head("\r\n".join(lines).encode("latin-1"))


def _open(run_dir: Path, **extra: object) -> dict[str, Any]:
    grants = {"internet_any": False, "internet": [], "lan_any": False, "lan": []}
    return {
        "op": "open",
        "sandbox": "sbx-1",
        "socket": str(run_dir / "sbx-1.sock"),
        "grants": grants,
        "secret": PROXY_SECRET,
        **extra,
    }


def test_a_rule_and_its_secret_reach_the_listener_from_the_open_frame(run_dir: Path) -> None:
    frame = _open(run_dir, services=[TABLE], service_secrets={"bot": VALUE})
    command = parse_command(frame, run_dir)
    assert isinstance(command, OpenCommand)
    assert command.services.rules == (ServiceRule("telegram", TELEGRAM_HOST, "bot", ("getme",)),)
    forward, secret = command.services.judge(
        command.services.rules[0], _request(f"http://{TELEGRAM_HOST}/bot{P}/getMe")
    )
    assert secret == VALUE.encode() and forward.logged_path == f"/bot{P}/getMe"
    assert VALUE not in repr(command) and VALUE not in repr(command.services)


def test_an_open_without_services_holds_none(run_dir: Path) -> None:
    command = parse_command(_open(run_dir), run_dir)
    assert isinstance(command, OpenCommand) and command.services.rules == ()


@pytest.mark.parametrize(
    "extra",
    [
        {"services": [{**TABLE, "token": VALUE}]},  # a value-carrying key
        {"services": [{**TABLE, "secret": VALUE}]},  # a value for a name
        {"services": [TABLE, TABLE]},  # two rules for one host
        {"services": "telegram"},
        {"services": [TABLE], "service_secrets": {"other": VALUE}},  # no rule uses it
        {"services": [TABLE], "service_secrets": {"bot": VALUE + " x"}},  # not a secret's shape
        {"services": [TABLE], "service_secrets": {"bot": 7}},
        {"services": [TABLE], "service_secrets": [VALUE]},
    ],
)
def test_a_hostile_service_field_is_refused_without_repeating_a_value(
    run_dir: Path, extra: dict[str, Any]
) -> None:
    with pytest.raises(ValueError) as caught:
        parse_command(_open(run_dir, **extra), run_dir)
    assert VALUE not in str(caught.value)
    assert VALUE.split(":")[1][:10] not in str(caught.value)


def test_the_secrets_frame_replaces_the_values() -> None:
    command = parse_command(
        {"op": "secrets", "sandbox": "sbx-1", "service_secrets": {"bot": VALUE}}, Path("/run")
    )
    assert isinstance(command, SecretsCommand) and command.secrets == {"bot": VALUE.encode()}
    assert VALUE not in repr(command)


def test_a_removed_secret_refuses_the_rules_next_request() -> None:
    grant = ServiceGrant([BOT], {"bot": VALUE.encode()})
    request = _request(f"http://{TELEGRAM_HOST}/bot{P}/getMe")
    assert grant.judge(BOT, request)[1] == VALUE.encode()
    grant.replace_secrets({})
    with pytest.raises(RequestRefused) as caught:
        grant.judge(BOT, request)
    assert caught.value.rule == "service-secret-gone"
    assert "lnk secret set bot" in caught.value.reason
    with pytest.raises(ValueError, match="names no rule"):
        grant.replace_secrets({"other": b"x"})


def test_a_rule_sent_without_its_secret_refuses_from_the_start() -> None:
    grant = ServiceGrant([BOT])
    with pytest.raises(RequestRefused, match="not set"):
        grant.judge(BOT, _request(f"http://{TELEGRAM_HOST}/bot{P}/getMe"))


@pytest.mark.parametrize("target", [f"{TELEGRAM_HOST}:443", f"{TELEGRAM_HOST.upper()}:443"])
def test_a_connect_to_a_rule_host_is_refused_with_the_plain_http_way(target: str) -> None:
    grant = ServiceGrant([BOT], {"bot": VALUE.encode()})
    request = _request(target, "CONNECT")
    rule = grant.rule_for(request)
    assert rule == BOT
    with pytest.raises(RequestRefused) as caught:
        grant.judge(rule, request)
    assert caught.value.rule == "service-plain-http-only"
    assert f"http://{TELEGRAM_HOST}/" in caught.value.reason


def test_another_host_is_not_a_rules() -> None:
    grant = ServiceGrant([BOT], {"bot": VALUE.encode()})
    assert grant.rule_for(_request("http://api.telegram.org.evil.example/x")) is None
    assert ServiceGrant().rule_for(_request(f"http://{TELEGRAM_HOST}/x")) is None


def test_the_unsafe_switch_skips_the_method_check_only() -> None:
    grant = ServiceGrant([BOT], {"bot": VALUE.encode()})
    refused = _request(f"http://{TELEGRAM_HOST}/bot{P}/getUpdates")
    with pytest.raises(RequestRefused, match="not in the rule"):
        grant.judge(BOT, refused)
    forward, _ = grant.judge(BOT, refused, check_route=False)
    assert forward.logged_path == f"/bot{P}/getUpdates"
    with pytest.raises(RequestRefused) as caught:  # never-allowed and own keys still refused
        grant.judge(BOT, _request(f"http://{TELEGRAM_HOST}/bot{P}/setWebhook"), check_route=False)
    assert caught.value.rule == "service-never"
    own = _request(f"http://{TELEGRAM_HOST}/bot{VALUE}/getMe")
    with pytest.raises(RequestRefused, match="placeholder"):
        grant.judge(BOT, own, check_route=False)


def test_the_rule_hosts_are_judged_as_an_internet_grant_of_exactly_them() -> None:
    grant = ServiceGrant([BOT])
    assert [str(h) for h in grant.memo.grants.internet] == [TELEGRAM_HOST]
    assert not grant.memo.grants.internet_any and not grant.memo.grants.localhost_ports


def test_an_errors_text_never_holds_the_secret() -> None:
    assert scrub_text(f"ended: BadResponse('x {VALUE}')", VALUE.encode()) == (
        "ended: BadResponse('x <secret>')"
    )


def test_secrets_parse_names_any_secret_without_rules() -> None:
    assert parse_service_secrets({"bot": VALUE}, None) == {"bot": VALUE.encode()}
    with pytest.raises(ValueError, match="not a secret's name"):
        parse_service_secrets({"../x": VALUE}, None)
    assert parse_services([]) == ()
