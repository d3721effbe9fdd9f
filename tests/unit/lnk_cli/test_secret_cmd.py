"""`lnk secret`: a value comes from standard input or a prompt without echo, never argv, and is
never repeated in an error."""

from __future__ import annotations

import io
from typing import Any

import pytest

from lnk_cli import app, secret_cmd
from lnk_shared.errors import EXIT_USAGE, UsageError

VALUE = "1234567890:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"


class Pipe:
    def __init__(self, data: bytes) -> None:
        self.buffer = io.BytesIO(data)

    def isatty(self) -> bool:
        return False


class Terminal:
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("ending", [b"", b"\n", b"\r\n"])
def test_a_piped_value_drops_one_trailing_newline(ending: bytes) -> None:
    assert secret_cmd.read_value("bot", Pipe(VALUE.encode() + ending)) == VALUE.encode()


def test_a_piped_value_with_two_lines_is_refused() -> None:
    with pytest.raises(UsageError, match="control character"):
        secret_cmd.read_value("bot", Pipe(b"first\nsecond\n"))


def test_on_a_terminal_the_value_is_prompted_twice_without_echo() -> None:
    answers = iter([VALUE, VALUE])
    prompts: list[str] = []

    def prompt(text: str) -> str:
        prompts.append(text)
        return next(answers)

    assert secret_cmd.read_value("bot", Terminal(), prompt=prompt) == VALUE.encode()
    assert len(prompts) == 2 and all(VALUE not in p for p in prompts)


def test_two_different_typed_values_keep_nothing() -> None:
    answers = iter([VALUE, VALUE + "x"])
    with pytest.raises(UsageError, match="differ"):
        secret_cmd.read_value("bot", Terminal(), prompt=lambda _t: next(answers))


@pytest.mark.parametrize(
    "argv",
    [
        ["secret", "set", "bot", VALUE],
        ["secret", "set", "bot", "--value", VALUE],
        ["secret", "set", f"--value={VALUE}", "bot"],
        ["secret", "set", f"--token={VALUE}", "bot"],
        ["secret", "list", VALUE],
        ["secret", "remove", "bot", VALUE],
    ],
)
def test_a_value_on_the_command_line_is_refused_and_not_repeated(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    called: list[Any] = []
    monkeypatch.setattr(secret_cmd, "_api", lambda *a: called.append(a))
    assert app.run(argv) == EXIT_USAGE
    captured = capsys.readouterr()
    assert VALUE not in captured.err and VALUE not in captured.out
    assert VALUE[:10] not in captured.err
    assert called == []  # nothing reached the controller


def test_a_value_given_as_the_name_is_refused_and_not_repeated(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    called: list[Any] = []
    monkeypatch.setattr(secret_cmd, "_api", lambda *a: called.append(a))
    assert app.run(["secret", "set", "--", VALUE]) == EXIT_USAGE
    assert VALUE not in capsys.readouterr().err
    assert called == []


def test_other_groups_still_name_their_stray_words(capsys: pytest.CaptureFixture[str]) -> None:
    assert app.run(["spec", "list", "stray-word"]) == EXIT_USAGE
    assert "stray-word" in capsys.readouterr().err
