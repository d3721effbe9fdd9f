"""The lookups made after judging, as the caller too: covering the box's folders inside a grant
(`staging.hidden_mount_points`, which makes a missing `~/.lnk` to cover it) and finding an
agent's folder (`agent_launch.agent_for_launch`). A second user points its own `~/.lnk` (or its
`~/Link`) at a folder in root's `0700` home, or in a third user's, and asks: whether something
is there must not change the answer, and nothing is made there. A user whose home is not its own
gets nothing made in it by root. The neighbour: a missing `~/.lnk` is made as its owner."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user
from install_prefix import LNK

pytestmark = pytest.mark.needs_root

RunningBox = Any  # tests/e2e/conftest.py


@dataclass
class User:
    name: str
    uid: int
    gid: int
    home: Path


def _add_user(*options: str) -> User:
    name = "lnkc" + secrets.token_hex(3)
    useradd = ["useradd", "-s", "/bin/sh", "-K", "UID_MIN=1500", *options, name]
    subprocess.run(useradd, check=True, capture_output=True)
    entry = pwd.getpwnam(name)
    return User(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))


def _remove_user(user: User) -> None:
    subprocess.run(["userdel", "-r", user.name], capture_output=True, check=False)


@pytest.fixture
def asker() -> Iterator[User]:
    """A second unprivileged user of the box, with a home of its own and nothing in it."""
    user = _add_user("-m")
    os.chmod(user.home, 0o700)
    try:
        yield user
    finally:
        _remove_user(user)


@pytest.fixture
def third() -> Iterator[User]:
    """A third user, whose home (0700) neither root's tools nor the asker may show."""
    user = _add_user("-m")
    os.chmod(user.home, 0o700)
    try:
        yield user
    finally:
        _remove_user(user)


def _ask(box: RunningBox, user: User, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(user.home),
        "USER": user.name,
        "LANG": "C.UTF-8",
        **{k: v for k, v in box.owner_env().items() if k.startswith("LNK_")},
    }
    return subprocess.run(
        as_user(user.uid, user.gid, str(LNK), *args),
        env=env,
        cwd=str(user.home),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _as(user: User, *argv: str) -> None:
    subprocess.run(as_user(user.uid, user.gid, *argv), check=True, capture_output=True)


def _answer(result: subprocess.CompletedProcess[str]) -> tuple[int, str]:
    return result.returncode, result.stdout + result.stderr


def _private_parent(where: str, third: User) -> Path:
    if where == "root's home":
        root_home = Path(pwd.getpwuid(0).pw_dir)
        assert stat.S_IMODE(os.stat(root_home).st_mode) & 0o077 == 0, "root's home is private"
        return root_home
    return third.home


@pytest.mark.parametrize("where", ["root's home", "a third user's home"])
def test_a_settings_link_into_a_private_folder_answers_as_a_missing_one(
    running_box: RunningBox, asker: User, third: User, where: str
) -> None:
    """The asker's `~/.lnk` is its own link into a folder it cannot search; its grant of that
    folder's parent puts the link's target among the folders to cover. Root looked there: a
    target that exists was covered (bwrap then failed on it), a missing one was left out."""
    parent = _private_parent(where, third)
    bait = parent / f"lnk-bait-{secrets.token_hex(4)}"
    _as(asker, "/bin/ln", "-s", str(bait), str(asker.home / ".lnk"))
    ask = ("sandbox", "run", "--yes", f"--read={parent}", "--", "/bin/true")
    try:
        missing = _ask(running_box, asker, *ask)
        assert not os.path.lexists(bait), "nothing is made where the link points"
        bait.mkdir(mode=0o700)
        (bait / "inside").write_text("bait\n")
        there = _ask(running_box, asker, *ask)
        assert sorted(os.listdir(bait)) == ["inside"], "nothing is made inside either"
    finally:
        shutil.rmtree(bait, ignore_errors=True)
    assert _answer(there) == _answer(missing)
    assert there.returncode == 0, there.stderr  # the grant itself works: nothing to cover


def test_an_agent_folder_through_a_link_into_roots_home_answers_as_a_missing_one(
    running_box: RunningBox, asker: User
) -> None:
    """The asker's `~/Link` is its own link into root's home: whether root's folder holds
    `Agents/NAME` must not show in what `lnk agent start NAME` answers."""
    name = "a" + secrets.token_hex(3)
    spec = asker.home / "agent.toml"
    _as(asker, "/bin/sh", "-c", f"echo '# an agent' > {spec}")
    created = _ask(running_box, asker, "agent", "create", name, "--spec", str(spec))
    assert created.returncode == 0, created.stderr
    root_home = _private_parent("root's home", asker)
    bait = root_home / f"lnk-bait-{secrets.token_hex(4)}"
    _as(asker, "/bin/mv", str(asker.home / "Link"), str(asker.home / "Link.real"))
    _as(asker, "/bin/ln", "-s", str(bait), str(asker.home / "Link"))
    try:
        missing = _ask(running_box, asker, "agent", "start", name, "--yes", "--", "/bin/true")
        (bait / "Agents" / name).mkdir(parents=True)
        os.chown(bait / "Agents" / name, asker.uid, asker.gid)
        there = _ask(running_box, asker, "agent", "start", name, "--yes", "--", "/bin/true")
        assert sorted(os.listdir(bait / "Agents" / name)) == []
    finally:
        shutil.rmtree(bait, ignore_errors=True)
        _ask(running_box, asker, "agent", "remove", name)
    assert _answer(there) == _answer(missing)
    assert there.returncode != 0
    assert "reached without links" in there.stderr, there.stderr
    assert str(bait) not in there.stderr  # nothing of where the link goes


def test_a_home_the_caller_cannot_write_gets_nothing_made_in_it(running_box: RunningBox) -> None:
    """A user whose home is root's folder (0755): covering its missing `~/.lnk` needs it made,
    which the user could not do; root used to make it, the user's own. Now the launch is
    refused, naming the folder, and the home stays as it was."""
    home = Path(f"/srv/lnk-home-{secrets.token_hex(4)}")
    home.mkdir(mode=0o755)
    user = _add_user("-M", "-d", str(home))
    try:
        result = _ask(
            running_box, user, "sandbox", "run", "--yes", f"--read={home}", "--", "/bin/true"
        )
        assert os.listdir(home) == [], "nothing is made in a home its user cannot write"
    finally:
        _remove_user(user)
        shutil.rmtree(home, ignore_errors=True)
    assert result.returncode == 126, result.stderr  # refused: a run's status
    assert f"{home}/.lnk" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_settings_folder_is_made_by_its_owner(
    running_box: RunningBox, asker: User
) -> None:
    """The granted path: a read grant of the whole home covers `~/.lnk`, made first (the
    owner's, 0700) because nothing may appear uncovered under it later; the run works."""
    assert not os.path.lexists(asker.home / ".lnk")
    result = _ask(
        running_box, asker, "sandbox", "run", "--yes", f"--read={asker.home}", "--", "/bin/true"
    )
    assert result.returncode == 0, result.stderr
    info = os.lstat(asker.home / ".lnk")
    assert stat.S_ISDIR(info.st_mode)
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (asker.uid, asker.gid, 0o700)


def test_no_placeholder_is_made_in_another_users_folder_inside_a_write_grant(
    running_box: RunningBox, asker: User, third: User
) -> None:
    """The asker's write folder holds a `.git` of the third user's, 0700: the asker cannot make
    anything in it, nor can its sandbox (which writes only as the asker, and cannot chmod a
    folder it does not own). Root made `.git/hooks` and the other git placeholders there, in a
    folder of another user's; now nothing is made there, and the sandbox still runs."""
    work = asker.home / "work"
    _as(asker, "/bin/mkdir", str(work))
    foreign = work / ".git"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, third.uid, third.gid)
    ask = ("sandbox", "run", "--yes", f"--write={work}", "--", "/bin/sh", "-c", "echo ran")
    try:
        ran = _ask(running_box, asker, *ask)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.split() == ["ran"]
        assert sorted(os.listdir(foreign)) == [], "nothing of the box's in another user's folder"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_an_owners_own_closed_git_keeps_its_config_read_only(
    running_box: RunningBox, asker: User
) -> None:
    """The asker's `.git` is its own but 0555 (so placeholders in it fall back to root, as the
    asker could chmod it and make them): its existing `config` stays read-only inside, and
    the launch runs."""
    work = asker.home / "closed"
    _as(asker, "/bin/mkdir", "-p", str(work / ".git"))
    _as(asker, "/bin/sh", "-c", f"echo '[core]' > {work}/.git/config; chmod 0555 {work}/.git")
    script = f"echo pwned >> {work}/.git/config && echo WROTE; echo ran"
    try:
        ran = _ask(
            running_box,
            asker,
            "sandbox",
            "run",
            "--yes",
            f"--write={work}",
            "--",
            "/bin/sh",
            "-c",
            script,
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.split() == ["ran"]
        assert (work / ".git" / "config").read_text() == "[core]\n"
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)
