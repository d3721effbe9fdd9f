"""`lnk agent list`: an agent's spec path is a name from disk, shown as escapes."""

from __future__ import annotations

import pytest

from lnk_cli import agent_commands


def test_list_shows_a_hostile_spec_path_as_escapes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    agents = [{"name": "a", "running": False, "host_uid": None, "spec": "/h/\x9b2J\u2066.toml"}]
    monkeypatch.setattr(agent_commands, "_call", lambda *_a: agents)

    class Args:
        json = False

    assert agent_commands.cmd_list(Args()) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "/h/\\x9b2J\\u2066.toml" in out
    assert out.splitlines()[0].split()[0] in ("NAME", "HASH")  # a header, then the row
    assert all(line.isprintable() for line in out.splitlines())
