"""lnk_shared.secret_names: which names and values a secret may have, and that no refusal
repeats a value."""

from __future__ import annotations

import pytest

from lnk_shared.errors import UsageError
from lnk_shared.secret_names import (
    MAX_SECRET_BYTES,
    check_secret_name,
    check_secret_value,
    looks_like_a_value,
)

TELEGRAM_TOKEN = "1234567890:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
OPENAI_KEY = "sk-proj-Xq3v9ZKp2LmN8rT4wY6bC1dF5gH7jK0"
JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig"


@pytest.mark.parametrize("name", ["telegram-bot", "OPENAI_KEY", "a", "x" * 64, "bot2"])
def test_a_name_a_person_picks_is_kept(name: str) -> None:
    assert check_secret_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "-bot",
        "2bot",
        "bot name",
        "bot/../x",
        "bot\x00",
        "bot\n",
        "bøt",
        "x" * 65,
        "bot.key",
    ],
)
def test_a_name_outside_the_pattern_is_refused(name: str) -> None:
    with pytest.raises(UsageError, match="not a secret's name"):
        check_secret_name(name)


@pytest.mark.parametrize("value", [TELEGRAM_TOKEN, OPENAI_KEY, JWT, "Ab3" * 11])
def test_a_value_given_as_a_name_is_refused_without_repeating_it(value: str) -> None:
    assert looks_like_a_value(value)
    with pytest.raises(UsageError) as raised:
        check_secret_name(value)
    assert value not in str(raised.value)
    assert value[:8] not in str(raised.value)


@pytest.mark.parametrize("name", ["telegram-bot", "anthropic_work_account_key", "x" * 40])
def test_a_long_plain_name_is_not_taken_for_a_value(name: str) -> None:
    assert not looks_like_a_value(name)


@pytest.mark.parametrize("value", [TELEGRAM_TOKEN.encode(), b"x", b"~" * MAX_SECRET_BYTES])
def test_a_visible_ascii_value_is_kept(value: bytes) -> None:
    assert check_secret_value(value) == value


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"", "empty"),
        (b"a" * (MAX_SECRET_BYTES + 1), "bytes long"),
        (b"zqxj en-hunter2", "space"),
        (b"zqxjv\r\nX-Injected: 1", "control"),
        (b"zqxjv\x00rest", "control"),
        (b"zqxj\xc3\xa9n", "non-ASCII"),
        (b"\tzqxjv", "control"),
    ],
)
def test_a_value_that_could_split_a_header_is_refused_without_repeating_it(
    value: bytes, why: str
) -> None:
    with pytest.raises(UsageError, match=why) as raised:
        check_secret_value(value)
    assert "zqxj" not in str(raised.value)
