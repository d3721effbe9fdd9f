"""Specs given by flags alone, as a box user alternates them: each set is remembered by what it
opens, so two sets alternated ask once each (they shared one slot and asked every time); the user
lists them and forgets one, then all; another user's approvals are not theirs."""

from __future__ import annotations

import os
import pwd
import secrets
import signal
import subprocess
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
from as_user import as_user
from conftest import LNK, RunningBox

pytestmark = pytest.mark.needs_root

ASKED = "has not run here before"


@dataclass(frozen=True)
class Person:
    name: str
    uid: int
    gid: int
    home: Path


@pytest.fixture
def person() -> Iterator[Person]:
    """A box user of this test's own, removed after even when it fails."""
    name = "lnkf" + secrets.token_hex(3)
    subprocess.run(
        ["useradd", "-m", "-s", "/bin/bash", "-K", "UID_MIN=1500", name],
        check=True,
        capture_output=True,
    )
    entry = pwd.getpwnam(name)
    try:
        yield Person(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    finally:
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            with suppress(OSError):
                if os.stat(f"/proc/{pid}").st_uid == entry.pw_uid:
                    os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["userdel", "-r", name], capture_output=True, check=False)


def _as(box: RunningBox, who: Person, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        as_user(who.uid, who.gid, str(LNK), *args),
        env={**box.owner_env(), "HOME": str(who.home), "USER": who.name},
        cwd=str(who.home),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _folder(who: Person, name: str) -> str:
    path = who.home / name
    path.mkdir()
    os.chown(path, who.uid, who.gid)
    return str(path)


def _runs_unasked(box: RunningBox, who: Person, folder: str) -> bool:
    """`lnk sandbox run --read FOLDER -- /bin/true` without --yes and without a terminal: it
    runs only if this very set was approved; otherwise it asks, and with no one to answer, is
    not approved."""
    ran = _as(box, who, "sandbox", "run", "--read", folder, "--", "/bin/true")
    if ran.returncode == 0:
        assert ASKED not in ran.stderr, ran.stderr
        return True
    assert ASKED in ran.stderr, (ran.returncode, ran.stderr)
    return False


def _flag_lines(box: RunningBox, who: Person) -> list[str]:
    listed = _as(box, who, "spec", "list")
    assert listed.returncode == 0, listed.stderr
    return [line for line in listed.stdout.splitlines() if "<flags>:" in line]


def test_two_flag_sets_alternated_ask_once_each(running_box: RunningBox, person: Person) -> None:
    box = running_box
    one, two = _folder(person, "one"), _folder(person, "two")
    for folder in (one, two):
        assert not _runs_unasked(box, person, folder)  # new: asked
        approved = _as(box, person, "spec", "approve", "--yes", "--read", folder)
        assert approved.returncode == 0, approved.stderr
    for folder in (one, two, one, two):  # alternated: neither asks again
        assert _runs_unasked(box, person, folder)

    lines = _flag_lines(box, person)
    assert len(lines) == 2
    (line_one,) = [line for line in lines if f"read {one}" in line]
    key_one = next(word for word in line_one.split() if word.startswith("<flags>:"))

    forgot = _as(box, person, "spec", "forget", key_one)
    assert forgot.returncode == 0 and "forgotten" in forgot.stdout, forgot.stderr
    assert not _runs_unasked(box, person, one)  # that one asks again
    assert _runs_unasked(box, person, two)  # the other is still remembered

    forgot = _as(box, person, "spec", "forget", "--all")
    assert forgot.returncode == 0, forgot.stderr
    assert not _runs_unasked(box, person, two)
    assert _flag_lines(box, person) == []


def test_another_users_flag_approval_is_not_theirs(running_box: RunningBox, person: Person) -> None:
    """The owner approves a set; the same flags from another user still ask, and the other
    user's forget cannot touch the owner's approval."""
    box = running_box
    shared = _folder(person, "shared")
    os.chmod(person.home, 0o755)
    os.chmod(shared, 0o755)
    approved = box.as_owner("spec", "approve", "--yes", "--read", shared)
    assert approved.returncode == 0, approved.stderr
    owner_lines = [
        line for line in box.as_owner("spec", "list").stdout.splitlines() if shared in line
    ]
    assert len(owner_lines) == 1
    key = next(word for word in owner_lines[0].split() if word.startswith("<flags>:"))
    assert not _runs_unasked(box, person, shared)
    assert _as(box, person, "spec", "forget", key).stdout.startswith("was not remembered")
    assert _as(box, person, "spec", "forget", "<flags>").returncode == 0
    still = box.as_owner("sandbox", "run", "--read", shared, "--", "/bin/true")
    assert still.returncode == 0 and ASKED not in still.stderr, still.stderr
    assert box.as_owner("spec", "forget", key).returncode == 0
