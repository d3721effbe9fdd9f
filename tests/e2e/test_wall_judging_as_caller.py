"""Judging as the caller: a second unprivileged user asks the controller about root's and a third
user's private paths, and cannot tell what exists there, where its links go, or where another
user's process works and what it has open. Every answer (exit status and output) is the answer
for a path that does not exist, and prints nothing of what is there."""

from __future__ import annotations

import os
import pwd
import secrets
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
MISSING_PID = 4_194_304 + 7  # above the kernel's largest pid_max: never a process


@dataclass
class Asker:
    name: str
    uid: int
    gid: int
    home: Path


@pytest.fixture
def asker() -> Iterator[Asker]:
    """A second unprivileged user of the box: neither root nor the owner."""
    name = "lnka" + secrets.token_hex(3)
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", "-K", "UID_MIN=1500", name], check=True)
    entry = pwd.getpwnam(name)
    try:
        yield Asker(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True, check=False)


@pytest.fixture
def private_paths(running_box: RunningBox) -> Iterator[dict[str, tuple[str, str]]]:
    """Each kind of private thing, as (what is there, its absent twin): root's file and link,
    the owner's file and link, the owner's process's working folder and open file."""
    tag = secrets.token_hex(4)
    owner = running_box.owner
    root_home = Path(pwd.getpwuid(0).pw_dir)
    assert os.stat(root_home).st_mode & 0o077 == 0, "root's home must be private for this test"
    made = [root_home / f"lnk-probe-{tag}.txt", root_home / f"lnk-probe-{tag}-link"]
    made[0].write_text("root's\n")
    made[1].symlink_to(f"/etc/lnk-target-that-tells-{tag}")
    owner_link = owner.home / f"lnk-link-{tag}"
    owner_link.symlink_to(f"/srv/lnk-target-that-tells-{tag}")
    os.chown(owner_link, owner.uid, owner.gid, follow_symlinks=False)
    worker = subprocess.Popen(
        as_user(owner.uid, owner.gid, "/bin/sleep", "120"),
        cwd=str(owner.home / "project"),
        stdin=subprocess.DEVNULL,
    )
    pid = str(worker.pid)
    try:
        yield {
            "root's file": (str(made[0]), str(root_home / f"lnk-absent-{tag}.txt")),
            "root's link": (str(made[1]), str(root_home / f"lnk-absent-{tag}-link")),
            "the owner's file": (str(owner.home / "secret.txt"), str(owner.home / f"no-{tag}")),
            "the owner's key": (
                str(owner.home / ".ssh/id_ed25519"),
                str(owner.home / f".ssh/no-{tag}"),
            ),
            "the owner's link": (str(owner_link), str(owner.home / f"lnk-nolink-{tag}")),
            "the owner's process's folder": (f"/proc/{pid}/cwd", f"/proc/{MISSING_PID}/cwd"),
            "the owner's process's open file": (f"/proc/{pid}/fd/0", f"/proc/{MISSING_PID}/fd/0"),
            "the owner's process's root": (f"/proc/{pid}/root", f"/proc/{MISSING_PID}/root"),
        }
    finally:
        worker.kill()
        worker.wait()
        for path in (*made, owner_link):
            path.unlink(missing_ok=True)


def _ask(box: RunningBox, asker: Asker, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(asker.home),
        "USER": asker.name,
        "LANG": "C.UTF-8",
        **{k: v for k, v in box.owner_env().items() if k.startswith("LNK_")},
    }
    return subprocess.run(
        as_user(asker.uid, asker.gid, str(LNK), *args),
        env=env,
        cwd=str(asker.home),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _answer(result: subprocess.CompletedProcess[str], path: str, token: str) -> tuple[Any, ...]:
    """The answer with the one thing the caller chose (its own path's name) taken out."""
    text = (result.stdout + result.stderr).replace(path, "PATH").replace(token, "TOKEN")
    return result.returncode, text


ASKS = {
    "--read": lambda p: ("sandbox", "run", "--yes", f"--read={p}", "--", "/bin/true"),
    "--write": lambda p: ("sandbox", "run", "--yes", f"--write={p}", "--", "/bin/true"),
    "--command": lambda p: ("sandbox", "run", "--yes", f"--command={p}", "--", "/bin/true"),
    "the program": lambda p: ("sandbox", "run", "--yes", "--", p),
}


@pytest.mark.parametrize("how", list(ASKS))
@pytest.mark.parametrize(
    "what",
    [
        "root's file",
        "root's link",
        "the owner's file",
        "the owner's key",
        "the owner's link",
        "the owner's process's folder",
        "the owner's process's open file",
        "the owner's process's root",
    ],
)
def test_another_users_private_path_answers_as_a_missing_one(
    running_box: RunningBox,
    asker: Asker,
    private_paths: dict[str, tuple[str, str]],
    what: str,
    how: str,
) -> None:
    there, absent = private_paths[what]
    seen = _ask(running_box, asker, *ASKS[how](there))
    missing = _ask(running_box, asker, *ASKS[how](absent))
    token_there = there.split("/")[2] if there.startswith("/proc/") else os.path.basename(there)
    token_absent = absent.split("/")[2] if absent.startswith("/proc/") else os.path.basename(absent)
    assert seen.returncode != 0, seen
    assert _answer(seen, there, token_there) == _answer(missing, absent, token_absent)
    said = seen.stdout + seen.stderr
    assert "that-tells" not in said  # nothing of a link's target
    assert running_box.owner.secret not in said
    assert "permission" not in said.lower()
    assert "project" not in said  # nothing of where the owner's process works


def test_the_owner_still_reaches_their_own_paths(running_box: RunningBox) -> None:
    """The neighbour: the owner's own file (through the same controller) is granted."""
    owner = running_box.owner
    result = running_box.run(
        f"--read={owner.home / 'secret.txt'}",
        "--command=cat",
        cmd=["cat", str(owner.home / "secret.txt")],
    )
    assert result.returncode == 0, result.stderr
    assert owner.secret in result.stdout


def test_the_callers_own_process_folder_is_followed(running_box: RunningBox) -> None:
    """`/proc/PID/cwd` of the caller's own process is followed to where it works (the owner's
    project), and then meets the rule for links not root's, as any link of theirs would."""
    owner = running_box.owner
    script = f"exec {LNK} sandbox run --yes --read=/proc/$$/cwd -- /bin/true"
    result = subprocess.run(
        as_user(owner.uid, owner.gid, "/bin/sh", "-c", script),
        env=running_box.owner_env(),
        cwd=str(owner.home / "project"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert f"(really {owner.home / 'project'})" in result.stderr, result.stderr
    assert "[link-owner]" in result.stderr
