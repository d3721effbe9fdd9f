"""Running a program as a test box's owner (the real unprivileged user who launches sandboxes),
from a folder the test names, pointed at a private box when the test has one: the argv, the
environment and the call the e2e tests share, so each test says only what it runs and where.

    ran = run_lnk(running_box, "sandbox", "run", "--yes", "--", "/bin/true", box=box)
    ran = run_as_owner(running_box, [*client, "sandbox", "list"], cwd=project)

A client other than the installed `lnk` is an argv prefix (`[str(c_client)]`, a Python one); the
C client alone in its folder (`build_alone`) can only take its quick path, as no python3 is
beside it to fall back to.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import install_prefix
from as_user import as_user

from lnk_shared.native_build import CLIENT, build

RunningBox = Any  # tests/e2e/conftest.py
PrivateBox = Any  # the same
LNK = str(install_prefix.LNK)
WAIT_S = 60.0  # a launch takes a second or two; a loaded 2-core machine, far more


def owner_env(
    running_box: RunningBox, box: PrivateBox | None = None, **extra: str
) -> dict[str, str]:
    """The owner's environment, pointed at `box`'s folders (its LNK_ variables) when given, with
    `extra` over both."""
    env = running_box.owner_env()
    if box is not None:
        env.update({k: v for k, v in box.env.items() if k.startswith("LNK_")})
    return {**env, **extra}


def owner_argv(running_box: RunningBox, *argv: str) -> list[str]:
    """`argv` run as the owner (setpriv drops root to the owner's uid, gid and groups)."""
    owner = running_box.owner
    return as_user(owner.uid, owner.gid, *argv)


def lnk_argv(running_box: RunningBox, *words: str) -> list[str]:
    """The installed `lnk WORDS`, run as the owner."""
    return owner_argv(running_box, LNK, *words)


def run_as_owner(
    running_box: RunningBox,
    argv: Sequence[str],
    *,
    box: PrivateBox | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    input: str | None = None,
    timeout: float = WAIT_S,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`argv` as the owner from `cwd` (the owner's home unless given), in `env` (the owner's,
    pointed at `box`, unless given), its output captured; `check` raises on a failure. Its
    stdin is `input`, or empty: a program that reads it ends instead of waiting on the test's."""
    return subprocess.run(
        owner_argv(running_box, *argv),
        env=owner_env(running_box, box) if env is None else env,
        cwd=str(running_box.owner.home if cwd is None else cwd),
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def run_lnk(
    running_box: RunningBox,
    *words: str,
    box: PrivateBox | None = None,
    cwd: Path | None = None,
    timeout: float = WAIT_S,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """The installed `lnk WORDS` as the owner from `cwd` (`run_as_owner`)."""
    return run_as_owner(running_box, [LNK, *words], box=box, cwd=cwd, timeout=timeout, check=check)


def start_as_owner(
    running_box: RunningBox,
    argv: Sequence[str],
    *,
    box: PrivateBox | None = None,
    cwd: Path | None = None,
    stdin: int | None = subprocess.PIPE,
) -> subprocess.Popen[str]:
    """`argv` started as the owner from `cwd` (the owner's home unless given), in the owner's
    environment pointed at `box`, its stdout and stderr piped as text; its stdin piped too
    unless `stdin` says otherwise (DEVNULL, or None: the test's own). The caller ends it."""
    return subprocess.Popen(
        owner_argv(running_box, *argv),
        env=owner_env(running_box, box),
        cwd=str(running_box.owner.home if cwd is None else cwd),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextmanager
def owner_tmp(prefix: str) -> Iterator[Path]:
    """A new folder under /tmp the owner can enter (pytest's tmp_path is root's, 0700), removed
    with all it holds on the way out."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        root.chmod(0o755)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def build_alone(root: Path) -> Path:
    """The C client built as `root/alone/lnk`, in a folder of its own that the owner can enter:
    with no python3 beside it, it can only take its quick path (any fall-back fails with
    "cannot run the Python CLI")."""
    client = build(root / "alone" / CLIENT, program=CLIENT)
    (root / "alone").chmod(0o755)
    return client
