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


def _start(monkeypatch: pytest.MonkeyPatch, *words: str) -> tuple[object, list[str]]:
    """`lnk agent start WORDS`, up to the launch: the flags and the program it would run."""
    import argparse

    agents = [{"name": "bot", "running": False, "host_uid": None, "spec": "/h/bot.toml"}]
    monkeypatch.setattr(agent_commands, "_call", lambda *_a: agents)
    seen: list[tuple[object, list[str]]] = []
    monkeypatch.setattr(
        "lnk_cli.launch_client.run_in_sandbox",
        lambda flags, program, agent: seen.append((flags, program)) or 0,
    )
    parser = argparse.ArgumentParser()
    groups = parser.add_subparsers()
    agent_commands.register(groups)
    args = parser.parse_args(["agent", "start", *words])
    assert args.handler(args) == 0
    return seen[0]


@pytest.mark.parametrize(
    "words",
    [
        ["bot", "--env", "KEY", "--env=MODE=x", "--yes", "--", "/bin/prog"],
        ["bot", "--yes", "--env", "KEY", "--env", "MODE=x", "--", "/bin/prog"],
    ],
)
def test_start_takes_env_before_the_program_for_this_start(
    monkeypatch: pytest.MonkeyPatch, words: list[str]
) -> None:
    flags, program = _start(monkeypatch, *words)
    assert flags.env == ["KEY", "MODE=x"]  # type: ignore[attr-defined]
    assert flags.yes is True  # type: ignore[attr-defined]
    assert flags.spec == "/h/bot.toml"  # type: ignore[attr-defined]
    assert program == ["/bin/prog"]


def test_start_refuses_another_option_before_the_program(monkeypatch: pytest.MonkeyPatch) -> None:
    from lnk_shared.errors import UsageError

    with pytest.raises(UsageError, match="unknown option --read"):
        _start(monkeypatch, "bot", "--read", "/", "--", "/bin/prog")
