"""Remembered state belongs to a person, not a uid: after `userdel -r` and a `useradd` that gets
the same uid (with the same name, or another), the new account sees no approvals, no sandbox
history (nor the commands the old one ran), no agents and none of their store, and is asked again
for a spec the old account had approved. And a sandbox's command is its owner's to see only."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_store import read_history, write_history
from as_user import as_user

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

LNK = Path(os.environ.get("LNK_PREFIX", "/opt/lnk")) / "venv" / "bin" / "lnk"
EXIT_NOT_APPROVED = 126  # lnk_shared.errors.EXIT_RUN_REFUSED: a run not approved is refused


@dataclass(frozen=True)
class Person:
    name: str
    uid: int
    gid: int
    home: Path


def _useradd(name: str, uid: int | None = None) -> Person:
    argv = ["useradd", "-m", "-s", "/bin/bash", "-K", "UID_MIN=1500"]
    if uid is not None:
        argv += ["-u", str(uid)]
    subprocess.run([*argv, name], check=True, capture_output=True)
    entry = pwd.getpwnam(name)
    return Person(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))


def _userdel(name: str) -> None:
    with suppress(KeyError):
        uid = pwd.getpwnam(name).pw_uid
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    os.kill(int(entry), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue
    subprocess.run(["userdel", "-r", name], capture_output=True, check=False)


@contextmanager
def _people() -> Iterator[list[str]]:
    """Names to remove afterwards, even when the test fails."""
    names: list[str] = []
    try:
        yield names
    finally:
        for name in names:
            _userdel(name)


def _as(box: RunningBox, person: Person, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**box.owner_env(), "HOME": str(person.home), "USER": person.name}
    return subprocess.run(
        as_user(person.uid, person.gid, str(LNK), *args),
        env=env,
        cwd=str(person.home),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _as_root(box: RunningBox, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**box.owner_env(), "HOME": "/root", "USER": "root"}
    return subprocess.run(
        [str(LNK), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _project(person: Person) -> Path:
    """A project and its spec in the person's home, the person's own; the spec's path."""
    project = person.home / "project"
    project.mkdir()
    spec = person.home / "project.toml"
    spec.write_text(f'[folders]\nread = ["{project}"]\n')
    agent_spec = person.home / "agent.toml"
    agent_spec.write_text("# an agent's spec\n")
    for path in (project, spec, agent_spec):
        os.chown(path, person.uid, person.gid)
    return spec


@pytest.mark.parametrize("same_name", [True, False], ids=["same-name", "another-name"])
def test_a_recycled_uid_starts_empty(running_box: RunningBox, same_name: bool) -> None:
    box = running_box
    marker = "old-account-arg-" + secrets.token_hex(4)
    secret = "old account's conversation " + secrets.token_hex(4)
    agent = "helper"
    with _people() as names:
        old = _useradd("lnkr" + secrets.token_hex(3))
        names.append(old.name)
        spec = _project(old)
        assert _as(box, old, "spec", "approve", "--yes", "--spec", str(spec)).returncode == 0
        ran = _as(box, old, "sandbox", "run", "--spec", str(spec), "--", "/bin/echo", marker)
        assert ran.returncode == 0, ran.stderr
        created = _as(box, old, "agent", "create", agent, "--spec", str(old.home / "agent.toml"))
        assert created.returncode == 0, created.stderr
        agent_id = f"u{old.uid}-{agent}"
        write_history(box.run_dir, box.state_dir, agent_id, secret)
        # what the old account sees of its own, so the new one's view below means something
        assert str(spec) in _as(box, old, "spec", "list").stdout
        assert marker in _as(box, old, "sandbox", "list", "--all", "--json").stdout
        assert agent in _as(box, old, "agent", "list").stdout

        _userdel(old.name)
        new = _useradd(old.name if same_name else "lnkr" + secrets.token_hex(3), uid=old.uid)
        names.append(new.name)
        assert new.uid == old.uid
        new_spec = _project(new)
        if same_name:
            assert new_spec == spec  # the very path the old account approved

        listed = _as(box, new, "spec", "list")
        assert listed.returncode == 0, listed.stderr
        assert "no approved specs" in listed.stdout, listed.stdout
        history = _as(box, new, "sandbox", "list", "--all", "--json")
        assert history.returncode == 0, history.stderr
        assert json.loads(history.stdout) == [] and marker not in history.stdout
        agents = _as(box, new, "agent", "list", "--json")
        assert agents.returncode == 0, agents.stderr
        assert json.loads(agents.stdout) == []
        assert not (box.state_dir / "agent-keys" / f"{agent_id}.pem").exists()

        asked = _as(box, new, "sandbox", "run", "--spec", str(new_spec), "--", "/bin/true")
        assert asked.returncode == EXIT_NOT_APPROVED, asked.stderr
        assert "has not run here before" in asked.stderr  # asked again, not remembered
        assert "not approved" in asked.stderr

        again = _as(box, new, "agent", "create", agent, "--spec", str(new.home / "agent.toml"))
        assert again.returncode == 0, again.stderr
        page, inbox, lease = read_history(box.run_dir, box.state_dir, agent_id)
        assert page == {"events": [], "last_seq": 0}
        assert inbox["messages"] == []
        assert lease["token"] == 1
        _as(box, new, "agent", "remove", agent)


def test_the_same_account_keeps_its_records(running_box: RunningBox) -> None:
    """The check must not forget the records of an account that is still the same person."""
    box = running_box
    with _people() as names:
        person = _useradd("lnks" + secrets.token_hex(3))
        names.append(person.name)
        spec = _project(person)
        assert _as(box, person, "spec", "approve", "--yes", "--spec", str(spec)).returncode == 0
        (person.home / "new-file").write_text("the home changes; it stays the same folder\n")
        for _ in range(3):
            assert str(spec) in _as(box, person, "spec", "list").stdout
        ran = _as(box, person, "sandbox", "run", "--spec", str(spec), "--", "/bin/true")
        assert ran.returncode == 0, ran.stderr  # still approved: not asked again


def test_a_sandboxs_command_is_shown_to_its_owner_only(running_box: RunningBox) -> None:
    box = running_box
    marker = "owners-arg-" + secrets.token_hex(4)
    ran = box.run(cmd=["/bin/echo", marker])
    assert ran.returncode == 0, ran.stderr
    mine = json.loads(box.as_owner("sandbox", "list", "--all", "--json").stdout)
    (row,) = [r for r in mine if r["command"] and marker in r["command"]]
    as_root = _as_root(box, "sandbox", "list", "--all", "--json")
    assert as_root.returncode == 0, as_root.stderr
    (seen,) = [r for r in json.loads(as_root.stdout) if r["id"] == row["id"]]
    assert seen["command"] is None
    assert marker not in as_root.stdout
    shown = _as_root(box, "sandbox", "list", "--all")
    assert marker not in shown.stdout and row["id"] in shown.stdout
    one = _as_root(box, "sandbox", "show", row["id"], "--json")  # root's view of one sandbox
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["command"] is None and marker not in one.stdout
    theirs_shown = box.as_owner("sandbox", "show", row["id"], "--json")
    assert marker in json.loads(theirs_shown.stdout)["command"]  # the owner sees their own
    with _people() as names:
        other = _useradd("lnko" + secrets.token_hex(3))
        names.append(other.name)
        theirs = _as(box, other, "sandbox", "list", "--all", "--json")
        assert theirs.returncode == 0, theirs.stderr
        assert marker not in theirs.stdout and row["id"] not in theirs.stdout
        other_show = _as(box, other, "sandbox", "show", row["id"], "--json")
        assert other_show.returncode != 0 and marker not in other_show.stdout + other_show.stderr
