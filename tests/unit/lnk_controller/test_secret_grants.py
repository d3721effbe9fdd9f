"""lnk_controller.secret_grants: what a sandbox with service rules gets at launch (the
placeholders in its environment, never a value) and what the proxy gets (the rules and their
values), a secret not kept refusing the launch by name, on a real SQLite store."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_controller import proxy_link
from lnk_controller.db import open_database
from lnk_controller.secret_grants import (
    check_present,
    hosted_key_env,
    placeholder_env,
    service_fields,
)
from lnk_controller.secret_store import SecretStore
from lnk_shared.errors import LaunchRefused
from lnk_shared.spec import Origin
from lnk_shared.spec_models import parse_model_table
from lnk_shared.spec_services import TELEGRAM_HOST, ServiceRule

BOT = ServiceRule("telegram", TELEGRAM_HOST, "telegram-bot", ("getMe",))
API = ServiceRule("bearer", "api.example.com", "api-key", ("GET /v1/items",))
VALUE = b"1234567890:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
OWNER = 1000


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SecretStore]:
    engine = open_database(tmp_path / "controller.db")
    try:
        yield SecretStore(engine, os.urandom(32))
    finally:
        engine.dispose()


def test_the_sandbox_gets_placeholders_only() -> None:
    env = placeholder_env([BOT, API])
    assert env == {
        "LNK_SECRET_TELEGRAM_BOT": "0:lnk-secret-telegram-bot",
        "LNK_SECRET_API_KEY": "lnk-secret-api-key",
        "TELEGRAM_BOT_TOKEN": "0:lnk-secret-telegram-bot",
    }
    assert placeholder_env([]) == {}


def test_the_proxy_gets_the_rules_and_the_owners_values(store: SecretStore) -> None:
    store.set(OWNER, "telegram-bot", VALUE)
    fields = service_fields(store, OWNER, [BOT])
    assert fields == {
        "services": [BOT.canonical()],
        "service_secrets": {"telegram-bot": VALUE.decode()},
    }
    assert service_fields(store, OWNER, []) == {}


def test_a_secret_not_kept_refuses_the_launch_by_name(store: SecretStore) -> None:
    store.set(OWNER + 1, "telegram-bot", VALUE)  # another owner's: never this sandbox's
    with pytest.raises(LaunchRefused) as caught:
        service_fields(store, OWNER, [BOT])
    assert "telegram-bot" in str(caught.value) and "lnk secret set telegram-bot" in str(
        caught.value
    )
    assert VALUE.decode() not in str(caught.value)
    with pytest.raises(LaunchRefused, match="lnk secret set"):
        check_present(None, OWNER, [BOT])
    check_present(None, OWNER, [])  # no rule: nothing needed


def test_a_changed_secret_is_kept_with_the_held_listener() -> None:
    read, write = os.pipe()
    os.close(write)
    command = {"op": "adopt", "services": [BOT.canonical()], "service_secrets": {"x": "old"}}
    proxy_link.HELD.keep("sbx-held", read, command)
    try:
        proxy_link.HELD.update("sbx-held", {**command, "service_secrets": {}})
        assert proxy_link.held_services("sbx-held") == [BOT.canonical()]
        assert proxy_link.HELD.snapshot()["sbx-held"][1]["service_secrets"] == {}
    finally:
        proxy_link.HELD.drop("sbx-held")
    assert proxy_link.held_services("sbx-held") == []


def test_a_hosted_rules_key_variable_holds_its_placeholder_never_a_value() -> None:
    origin = Origin("spec.toml", "models[0]", 1)
    rules = [
        parse_model_table({"kind": "anthropic", "models": ["claude-x"], "secret": "c"}, origin),
        parse_model_table({"kind": "openai", "models": ["gpt-x"], "secret": "o"}, origin),
        parse_model_table({"kind": "vllm", "models": ["q"], "secret": "v"}, origin),
    ]
    assert hosted_key_env(rules) == {
        "ANTHROPIC_API_KEY": "lnk-secret-c",
        "OPENAI_API_KEY": "lnk-secret-o",
    }
    assert hosted_key_env([]) == {}
