"""`lnk sandbox wire` and `list`: what the proxy logged and what a sandbox ran is shown to a
person with every control, bidi and zero-width character as a visible escape."""

from __future__ import annotations

import json

import pytest

from lnk_cli import sandbox_commands

HOSTILE = "x\x1b[2J\x07\r\n\x9b31m\u202eevil\u200b\ufeffy"
HOSTILE_SHOWN = "x\\x1b[2J\\x07\\r\\n\\x9b31m\\u202eevil\\u200b\\ufeffy"


def test_a_wire_line_shows_a_hostile_target_as_escapes() -> None:
    raw = json.dumps(
        {
            "time": "t",
            "decision": "refused",
            "rule": "host-not-listed",
            "method": "CONNECT",
            "target": HOSTILE,
            "address": None,
            "up": 0,
            "down": 0,
        }
    )
    line = sandbox_commands._wire_line(raw)
    assert HOSTILE_SHOWN in line
    assert line.isprintable()


def test_a_wire_line_that_is_not_json_is_still_shown_as_escapes() -> None:
    assert sandbox_commands._wire_line(HOSTILE) == HOSTILE_SHOWN


def test_list_shows_a_hostile_command_as_escapes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"id": "s1", "state": "running", "paused": False, "host_uid": 1, "command": [HOSTILE]}]
    monkeypatch.setattr(sandbox_commands, "_call", lambda *_a, **_k: rows)

    class Args:
        all = False
        json = False

    assert sandbox_commands.cmd_list(Args()) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert HOSTILE_SHOWN[:40] in out
    assert out.splitlines()[0].split()[0] == "ID"  # a header, then the row
    assert all(line.isprintable() for line in out.splitlines())
