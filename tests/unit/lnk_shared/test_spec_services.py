"""lnk_shared.spec_services: a spec's [[services]] rules, judged on their text; a spec that
carries a secret's value is refused without repeating it; each rule is shown and hashed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lnk_shared.discovery import context_for, resolve_spec
from lnk_shared.errors import EXIT_REFUSED, ServiceRefused, SpecError
from lnk_shared.grants import Grants
from lnk_shared.opens import describe, describe_changes
from lnk_shared.paths import BoxPaths
from lnk_shared.refusals import judge
from lnk_shared.spec import Origin
from lnk_shared.spec_file import parse_spec_text
from lnk_shared.spec_services import (
    TELEGRAM_HOST,
    ServiceRule,
    parse_service_flag,
    parse_service_table,
)

ORIGIN = Origin("spec.toml", "[services]", 3)
TOKEN = "1234567890:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
KEY = "sk-proj-Xq3v9ZKp2LmN8rT4wY6bC1dF5gH7jK0"
BOT = """
[[services]]
kind = "telegram"
secret = "bot"
allow = ["getMe", "sendMessage"]
"""


def _telegram(**extra: object) -> dict[str, object]:
    return {"kind": "telegram", "secret": "bot", "allow": ["getMe"], **extra}


def _bearer(**extra: object) -> dict[str, object]:
    table: dict[str, object] = {
        "kind": "bearer",
        "host": "api.example.com",
        "secret": "example",
        "allow": ["GET /v1/items"],
    }
    return table | extra


def test_a_telegram_rule_goes_to_the_bot_api_with_its_methods_deduplicated() -> None:
    rule = parse_service_table(_telegram(allow=["sendMessage", "getMe", "SENDMESSAGE"]), ORIGIN)
    assert rule == ServiceRule("telegram", TELEGRAM_HOST, "bot", ("getMe", "sendMessage"))
    assert rule.allows_method("getme") and rule.allows_method("SendMessage")
    assert not rule.allows_method("getUpdates")


@pytest.mark.parametrize("method", ["setWebhook", "SETWEBHOOK", "logOut", "logout", "close"])
def test_telegrams_always_refused_methods_cannot_be_allowed(method: str) -> None:
    with pytest.raises(ServiceRefused) as raised:
        parse_service_table(_telegram(allow=["getMe", method]), ORIGIN)
    assert raised.value.exit_code == EXIT_REFUSED
    assert "never allowed" in str(raised.value)


@pytest.mark.parametrize("method", ["setWebhook", "logOut", "close"])
def test_a_rule_never_allows_the_refused_methods_whatever_it_holds(method: str) -> None:
    rule = ServiceRule("telegram", TELEGRAM_HOST, "bot", (method,))  # made past the parser
    assert not rule.allows_method(method)


def test_a_telegram_rule_may_not_point_elsewhere() -> None:
    with pytest.raises(SpecError, match=r"api\.telegram\.org only"):
        parse_service_table(_telegram(host="evil.example"), ORIGIN)


def test_a_bearer_rule_names_one_host_and_routes() -> None:
    rule = parse_service_table(_bearer(allow=["POST /v1/items/*", "GET /v1/items"]), ORIGIN)
    assert rule == ServiceRule(
        "bearer", "api.example.com", "example", ("GET /v1/items", "POST /v1/items/*")
    )


@pytest.mark.parametrize(
    ("table", "why"),
    [
        (_bearer(host=None), "names the host"),
        (_bearer(host="*.example.com"), "not a wildcard"),
        (_bearer(host="127.0.0.1 x"), "host"),
        (_bearer(allow=["FETCH /v1"]), "METHOD /path"),
        (_bearer(allow=["GET v1"]), "starts with '/'"),
        (_bearer(allow=["GET /v1/../admin"]), "each segment is plain"),
        (_bearer(allow=["GET /v1/./x"]), "each segment is plain"),
        (_bearer(allow=["GET /v1//x"]), "each segment is plain"),
        (_bearer(allow=["GET /v1/%2e%2e"]), "each segment is plain"),
        (_bearer(allow=["GET /v1;x=1"]), "each segment is plain"),
        (_bearer(allow=["GET /v1/"]), "each segment is plain"),
        (_bearer(allow=["GET /v1?q=1"]), "each segment is plain"),
        (_bearer(allow=["GET /v1/*/x"]), "each segment is plain"),
        (_bearer(allow=[]), "allow is empty"),
        (_telegram(allow=[]), "allow is empty"),
        (_telegram(allow=["send message"]), "not a Bot API method"),
        (_telegram(allow="getMe"), "allow: expected"),
        (_telegram(kind="smtp"), "kind: expected one of"),
        (_telegram(secret=3), "secret: expected the name"),
        (_telegram(secret="bad name"), "not a secret's name"),
        (_telegram(url="https://x"), "unknown key 'url'"),
    ],
)
def test_a_malformed_rule_is_a_spec_error_naming_what(table: dict[str, object], why: str) -> None:
    with pytest.raises(SpecError, match=why):
        parse_service_table(table, ORIGIN)


@pytest.mark.parametrize("key", ["token", "value", "api_key", "password", "Token"])
def test_a_key_that_would_carry_the_value_is_refused_without_repeating_it(key: str) -> None:
    with pytest.raises(SpecError, match="never holds a secret's value") as raised:
        parse_service_table(_telegram(**{key: TOKEN}), ORIGIN)
    assert TOKEN not in str(raised.value) and "AAHdq" not in str(raised.value)


@pytest.mark.parametrize(
    "table",
    [
        _telegram(secret=TOKEN),
        _bearer(secret=KEY),
        _telegram(allow=["getMe", TOKEN]),
        _bearer(allow=[f"GET /v1/{KEY}"]),
        _bearer(host=f"{KEY}.example.com"),
    ],
)
def test_a_value_where_a_name_goes_is_refused_without_repeating_it(
    table: dict[str, object],
) -> None:
    with pytest.raises(SpecError, match="looks like a secret's value") as raised:
        parse_service_table(table, ORIGIN)
    assert TOKEN not in str(raised.value) and KEY not in str(raised.value)
    assert "AAHdq" not in str(raised.value) and "Xq3v9" not in str(raised.value)


def test_the_flag_form_is_the_same_rule() -> None:
    origin = Origin("command line", "--service")
    assert parse_service_flag("telegram:bot:getMe,sendMessage", origin) == parse_service_table(
        _telegram(allow=["getMe", "sendMessage"]), ORIGIN
    )
    bearer = parse_service_flag("bearer:example@api.example.com:GET /v1/items", origin)
    assert bearer == parse_service_table(_bearer(), ORIGIN)


@pytest.mark.parametrize("text", [f"telegram:{TOKEN}", TOKEN, f"telegram:{TOKEN}:getMe"])
def test_a_flag_carrying_the_value_is_refused_without_repeating_it(text: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_service_flag(text, Origin("command line", "--service"))
    assert "AAHdq" not in str(raised.value)


def test_a_services_table_instead_of_an_array_is_a_spec_error() -> None:
    text = '[services]\nkind = "telegram"\nsecret = "bot"\nallow = ["getMe"]\n'
    with pytest.raises(SpecError, match=r"\[\[services\]\] tables"):
        parse_spec_text(text, source="spec.toml", base="/")


def test_two_rules_for_one_host_are_a_spec_error() -> None:
    with pytest.raises(SpecError, match="a second telegram rule"):
        parse_spec_text(BOT + BOT, source="spec.toml", base="/")


def _grants(tmp_path: Path, text: str) -> Grants:
    spec = parse_spec_text(text, source=str(tmp_path / "s.toml"), base=str(tmp_path)).build()
    box = BoxPaths(tmp_path / "box/c", tmp_path / "box/s", tmp_path / "box/r")
    env = {"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    ctx = context_for(os.getuid(), env=env, box=box, spec_file=None, home=str(tmp_path))
    return judge(resolve_spec(spec, ctx, path_env="/usr/bin:/bin"), ctx)


def test_a_rule_is_in_the_hash_with_every_field(tmp_path: Path) -> None:
    plain = _grants(tmp_path, "")
    assert "services" not in plain.canonical()  # specs without one keep the hash they had
    bot = _grants(tmp_path, BOT)
    assert bot.canonical()["services"] == [
        {
            "kind": "telegram",
            "host": TELEGRAM_HOST,
            "secret": "bot",
            "allow": ["getme", "sendmessage"],
        }
    ]
    assert bot.spec.has_proxy
    other_secret = _grants(tmp_path, BOT.replace('"bot"', '"other-bot"'))
    more = _grants(tmp_path, BOT.replace('"getMe"', '"getMe", "getUpdates"'))
    same = _grants(tmp_path, BOT.replace('["getMe", "sendMessage"]', '["sendmessage", "GETME"]'))
    assert len({plain.digest(), bot.digest(), other_secret.digest(), more.digest()}) == 4
    assert same.digest() == bot.digest()


def test_the_approval_shows_the_host_the_secret_by_name_and_what_it_allows(
    tmp_path: Path,
) -> None:
    bot = _grants(tmp_path, BOT)
    text = "\n".join(describe(bot))
    assert "telegram https://api.telegram.org" in text
    assert "the secret bot added outside" in text
    assert "getMe, sendMessage" in text and "never setWebhook, logOut or close" in text
    more = _grants(tmp_path, BOT.replace('"getMe"', '"getMe", "getUpdates"'))
    changes = "\n".join(describe_changes(bot.canonical_json(), more))
    assert "+ service" in changes and "getupdates" in changes
    assert "- service" in changes
