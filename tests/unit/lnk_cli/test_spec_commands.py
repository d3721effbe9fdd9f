"""`lnk spec list`: a remembered spec's path is a name from disk, shown as escapes."""

from __future__ import annotations

import pytest

from lnk_cli import spec_commands

HOSTILE = "/home/u/x\x1b[2J\u202e\u200bspec.toml"


def test_list_shows_a_hostile_spec_path_as_escapes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"hash": "0" * 64, "approved_at": "2026-12-01T12:00:00", "spec": HOSTILE}]
    monkeypatch.setattr(spec_commands, "_api", lambda *_a: rows)

    class Args:
        json = False

    assert spec_commands.cmd_list(Args()) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "/home/u/x\\x1b[2J\\u202e\\u200bspec.toml" in out
    assert out.splitlines()[0].split()[0] in ("NAME", "HASH")  # a header, then the row
    assert all(line.isprintable() for line in out.splitlines())
