"""The owner's secret store, on a running box with real users: `lnk secret set` takes a value
from standard input only, never the command line; no answer, error, list or database file
holds the value; another user sees none of it; a recycled uid starts with no secrets."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

LNK = Path(os.environ.get("LNK_PREFIX", "/opt/lnk")) / "venv" / "bin" / "lnk"
EXIT_USAGE = 2


def _value() -> str:
    """A fresh Telegram-shaped bot token, unique to one test."""
    return f"{secrets.randbelow(10**9) + 10**9}:AA{secrets.token_urlsafe(26)[:33]}"


def _useradd(name: str, uid: int | None = None) -> tuple[str, int, int, Path]:
    argv = ["useradd", "-m", "-s", "/bin/bash", "-K", "UID_MIN=1500"]
    if uid is not None:
        argv += ["-u", str(uid)]
    subprocess.run([*argv, name], check=True, capture_output=True)
    entry = pwd.getpwnam(name)
    return name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir)


def _userdel(name: str) -> None:
    with suppress(KeyError):
        uid = pwd.getpwnam(name).pw_uid
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with suppress(OSError):
                    if os.stat(f"/proc/{entry}").st_uid == uid:
                        os.kill(int(entry), signal.SIGKILL)
    subprocess.run(["userdel", "-r", name], capture_output=True, check=False)


@contextmanager
def _people() -> Iterator[list[str]]:
    names: list[str] = []
    try:
        yield names
    finally:
        for name in names:
            _userdel(name)


def _as(
    box: RunningBox, person: tuple[str, int, int, Path], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    name, uid, gid, home = person
    env = {**box.owner_env(), "HOME": str(home), "USER": name}
    return subprocess.run(
        as_user(uid, gid, str(LNK), *args),
        env=env,
        cwd=str(home),
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _owner(box: RunningBox) -> tuple[str, int, int, Path]:
    o = box.owner
    return o.name, o.uid, o.gid, o.home


def _state_bytes(box: RunningBox) -> bytes:
    """Every file the box keeps in its state folder (the database and its WAL, logs, keys)."""
    data = b""
    for path in Path(box.state_dir).rglob("*"):
        if path.is_file() and not path.is_symlink():
            with suppress(OSError):
                data += path.read_bytes()
    return data


def test_a_secret_set_from_stdin_is_listed_by_name_and_held_nowhere_readable(
    running_box: RunningBox,
) -> None:
    box = running_box
    owner = _owner(box)
    value = _value()
    name = "bot-" + secrets.token_hex(3)
    put = _as(box, owner, "secret", "set", name, stdin=value + "\n")
    assert put.returncode == 0, put.stderr
    assert value not in put.stdout + put.stderr
    try:
        listed = _as(box, owner, "secret", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert [r["name"] for r in json.loads(listed.stdout)] == [name]
        assert value not in listed.stdout
        plain = _as(box, owner, "secret", "list")
        assert name in plain.stdout and value not in plain.stdout
        sandboxes = _as(box, owner, "sandbox", "list", "--all", "--json")
        assert value not in sandboxes.stdout + sandboxes.stderr
        # The database (and everything else in the state folder) holds it sealed only.
        state = _state_bytes(box)
        assert value.encode() not in state
        assert value.split(":")[1].encode() not in state
        key = Path(box.state_dir) / "secrets.key"
        assert key.stat().st_uid == 0 and key.stat().st_mode & 0o777 == 0o600
    finally:
        removed = _as(box, owner, "secret", "remove", name)
    assert removed.returncode == 0, removed.stderr
    assert _as(box, owner, "secret", "list", "--json").stdout.strip() == "[]"
    again = _as(box, owner, "secret", "remove", name)
    assert again.returncode == 1 and "no secret named" in again.stderr


@pytest.mark.parametrize(
    "words",
    [("{name}", "{value}"), ("{name}", "--value", "{value}"), ("--value={value}", "{name}")],
    ids=["positional", "option", "option-first"],
)
def test_a_value_on_the_command_line_is_refused_kept_nowhere_and_not_repeated(
    running_box: RunningBox, words: tuple[str, ...]
) -> None:
    box = running_box
    owner = _owner(box)
    value = _value()
    name = "argv-" + secrets.token_hex(3)
    argv = [w.format(name=name, value=value) for w in words]
    put = _as(box, owner, "secret", "set", *argv, stdin=value)
    assert put.returncode == EXIT_USAGE, put.stderr
    assert "never given on the command line" in put.stderr
    assert value not in put.stdout + put.stderr
    listed = _as(box, owner, "secret", "list", "--json")
    assert json.loads(listed.stdout) == []  # nothing was kept, under either word
    assert value.encode() not in _state_bytes(box)


def test_a_value_that_could_split_a_header_is_refused_without_repeating_it(
    running_box: RunningBox,
) -> None:
    box = running_box
    owner = _owner(box)
    value = _value()
    put = _as(box, owner, "secret", "set", "split", stdin=f"{value}\r\nX-Planted: 1\n")
    assert put.returncode == EXIT_USAGE, put.stderr
    assert value not in put.stderr and "control character" in put.stderr
    assert json.loads(_as(box, owner, "secret", "list", "--json").stdout) == []


def test_another_user_neither_sees_nor_removes_the_owners_secret(running_box: RunningBox) -> None:
    box = running_box
    owner = _owner(box)
    value = _value()
    name = "shared-" + secrets.token_hex(3)
    with _people() as names:
        other = _useradd("lnko" + secrets.token_hex(3))
        names.append(other[0])
        assert _as(box, owner, "secret", "set", name, stdin=value).returncode == 0
        try:
            theirs = _as(box, other, "secret", "list", "--json")
            assert theirs.returncode == 0, theirs.stderr
            assert json.loads(theirs.stdout) == []
            gone = _as(box, other, "secret", "remove", name)
            assert gone.returncode == 1 and "no secret named" in gone.stderr
            # The other user setting the same name makes its own, and leaves the owner's.
            assert _as(box, other, "secret", "set", name, stdin=_value()).returncode == 0
            mine = _as(box, owner, "secret", "list", "--json")
            assert [r["name"] for r in json.loads(mine.stdout)] == [name]
        finally:
            _as(box, owner, "secret", "remove", name)


def test_a_recycled_uid_starts_with_no_secrets(running_box: RunningBox) -> None:
    box = running_box
    value = _value()
    with _people() as names:
        old = _useradd("lnkq" + secrets.token_hex(3))
        names.append(old[0])
        assert _as(box, old, "secret", "set", "bot", stdin=value).returncode == 0
        assert "bot" in _as(box, old, "secret", "list").stdout
        _userdel(old[0])
        new = _useradd(old[0], uid=old[1])
        names.append(new[0])
        assert new[1] == old[1]
        listed = _as(box, new, "secret", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == []
