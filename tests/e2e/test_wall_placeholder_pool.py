"""The placeholders' pool end to end (lnk_controller/placeholder_pool.py): a write grant's empty
folders come back into the owner's pool at clean-up and the next launch renames the very same
inodes in, the owner's folder and git seeing nothing of it, no sandbox reaching the pool; and a
controller killed with folders in its pool trusts none of them when it starts again."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user
from install_prefix import LNK

RunningBox = Any  # tests/e2e/conftest.py
PrivateBox = Any

pytestmark = pytest.mark.needs_root

STARTED = "lnk-pool-test: started"
WAIT_S = 15.0  # how long a restarted controller may take to clean a killed one's sandbox


@pytest.fixture
def folders(running_box: RunningBox) -> Iterator[list[Path]]:
    """Three fresh git work trees of the owner's, each holding one committed file."""
    owner = running_box.owner
    made = []
    for _ in range(3):
        path = owner.home / f"pool-{secrets.token_hex(4)}"
        path.mkdir()
        (path / "readme.txt").write_text("hello\n")
        _git(path, "init", "-q")
        _git(path, "add", "readme.txt")
        _git(path, "-c", "user.name=o", "-c", "user.email=o@x", "commit", "-qm", "first")
        subprocess.run(["chown", "-R", f"{owner.uid}:{owner.gid}", str(path)], check=True)
        made.append(path)
    yield made
    for path in made:
        subprocess.run(["chattr", "-R", "-i", str(path)], capture_output=True, check=False)
        shutil.rmtree(path, ignore_errors=True)


def _git(path: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(path), "-c", f"safe.directory={path}", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@contextmanager
def _held(
    box: RunningBox, folder: Path, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """The owner's sandbox writing `folder`, held started until the block ends."""
    owner = box.owner
    argv = as_user(owner.uid, owner.gid, str(LNK), "sandbox", "run", "--yes", f"--write={folder}")
    with subprocess.Popen(
        [*argv, "--", "/bin/sh", "-c", f"echo {STARTED}; read go"],
        env=dict(env) if env is not None else box.owner_env(),
        cwd=str(owner.home),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as sandbox:
        out, into, err = sandbox.stdout, sandbox.stdin, sandbox.stderr
        assert out is not None and into is not None and err is not None
        try:
            first = out.readline().strip()
            assert first == STARTED, f"the sandbox did not start: {err.read()}"
            yield sandbox
            if sandbox.poll() is None:
                into.write("go\n")
                into.close()
                assert sandbox.wait(timeout=60) == 0, err.read()
        finally:
            if sandbox.poll() is None:
                sandbox.kill()


def _folder_placeholders(folder: Path) -> set[int]:
    """The inodes of the top-level empty folders the box put in `folder` (all but git's and
    the owner's own entries)."""
    return {
        os.lstat(folder / name).st_ino
        for name in os.listdir(folder)
        if name not in ("readme.txt", ".git") and stat.S_ISDIR(os.lstat(folder / name).st_mode)
    }


def _pool(state_dir: Path, uid: int) -> set[int]:
    """The inodes the owner's pool holds, by the names it gives them (`dev-ino`)."""
    owner = state_dir / "placeholder-pool" / str(uid)
    return {int(name.split("-")[1]) for name in os.listdir(owner)} if owner.exists() else set()


def test_the_next_launch_takes_the_last_one_s_folders_and_nothing_shows(
    running_box: RunningBox, folders: list[Path]
) -> None:
    box, (first, second, _) = running_box, folders
    with _held(box, first):
        made = _folder_placeholders(first)
        assert len(made) > 20, "too few placeholders to tell a pool from chance"
        assert _git(first, "status", "--porcelain", "--ignored") == ""
    assert sorted(os.listdir(first)) == [".git", "readme.txt"]
    pool = box.state_dir / "placeholder-pool"
    top, mine = os.stat(pool), os.stat(pool / str(box.owner.uid))
    assert (top.st_uid, stat.S_IMODE(top.st_mode)) == (0, 0o700)
    assert (mine.st_uid, stat.S_IMODE(mine.st_mode)) == (box.owner.uid, 0o700)
    pooled = _pool(box.state_dir, box.owner.uid)
    assert len(pooled) >= len(made), "the clean-up pooled nothing"

    with _held(box, second):
        taken = _folder_placeholders(second)
        assert taken and taken <= pooled, "the launch made new folders beside a full pool"
        assert not taken & _pool(box.state_dir, box.owner.uid), "lent and still pooled"
        assert _git(second, "status", "--porcelain", "--ignored") == ""
        for ino in taken:  # sealed like any made placeholder: the owner cannot remove one
            (name,) = [n for n in os.listdir(second) if os.lstat(second / n).st_ino == ino]
            owner_rm = subprocess.run(
                as_user(box.owner.uid, box.owner.gid, "/bin/rmdir", str(second / name)),
                capture_output=True,
                check=False,
            )
            assert owner_rm.returncode != 0 and (second / name).is_dir()
            break
    assert sorted(os.listdir(second)) == [".git", "readme.txt"]
    assert _git(second, "status", "--porcelain", "--ignored") == ""


def test_no_sandbox_reaches_the_pool(running_box: RunningBox, folders: list[Path]) -> None:
    box, folder = running_box, folders[0]
    with _held(box, folders[1]):
        pass  # a pool with folders in it
    pool = box.state_dir / "placeholder-pool"
    result = box.sh(
        f"ls -a {pool} {pool}/{box.owner.uid} && echo LEAK: listed; "
        f"mkdir {pool}/{box.owner.uid}/x && echo LEAK: made; echo done",
        f"--write={folder}",
    )
    assert result.stdout.splitlines()[-1:] == ["done"], result.stderr
    assert "LEAK" not in result.stdout
    assert not (pool / str(box.owner.uid) / "x").exists()


def test_a_killed_controller_s_pool_is_trusted_by_no_later_launch(
    running_box: RunningBox, private_box: Any, folders: list[Path]
) -> None:
    """Folders in the pool when the controller is killed are only the pool's memory's to lend:
    the next controller removes them at its start, and cleans the killed one's sandbox (whose
    own placeholders may go into the new pool, checked as any clean-up's are)."""
    owner = running_box.owner
    with private_box() as box:
        env = {
            **running_box.owner_env(),
            **{k: v for k, v in box.env.items() if k.startswith("LNK_")},
        }
        with _held(running_box, folders[0], env), _held(running_box, folders[1], env):
            pass  # two launches' folders pooled
        before = _pool(box.state_dir, owner.uid)
        with _held(running_box, folders[2], env) as sandbox:
            lent = _folder_placeholders(folders[2])
            left = _pool(box.state_dir, owner.uid)
            assert lent <= before and left and not left & lent
            os.kill(box.controller_pid(), signal.SIGKILL)
            sandbox.wait(timeout=60)  # its client sees its controller gone
            up = box.lnk("box", "up")
            assert up.returncode == 0, up.stderr
            deadline = time.monotonic() + WAIT_S
            while sorted(os.listdir(folders[2])) != [".git", "readme.txt"]:
                assert time.monotonic() < deadline, f"left: {os.listdir(folders[2])}"
                time.sleep(0.05)
        assert not _pool(box.state_dir, owner.uid) & left, "a killed controller's pool was kept"
        assert _git(folders[2], "status", "--porcelain", "--ignored") == ""
        with _held(running_box, folders[0], env):
            assert not _folder_placeholders(folders[0]) & left
