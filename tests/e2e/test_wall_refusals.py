"""A launch the wall cannot build as promised is refused, naming what is missing, and nothing
runs: an older Landlock, a missing bwrap, confiner or launcher, a spec a rule refuses.

A missing capability is simulated by a box of its own whose config says so (a pretended
Landlock ABI, a bwrap or confiner path that does not exist); the session's box is never touched.
Each program here would leave a file in a write grant if it ran at all.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = pytest.mark.needs_root

PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
LNK = PREFIX / "venv" / "bin" / "lnk"
LNK_PYTHON = PREFIX / "venv" / "bin" / "python"
SANDBOX_USER_PREFIX = "lnk-sbx-"
EXIT_REFUSED = 126  # lnk_shared.errors.EXIT_RUN_REFUSED: a rule or a missing capability
LANDLOCK_ABI_NEEDED = 6  # lnk_controller.spawn.MIN_LANDLOCK_ABI: scoping of signals and sockets


def _run_in(
    running_box: RunningBox, box: Any, *flags: str, cmd: list[str]
) -> subprocess.CompletedProcess[str]:
    """`lnk sandbox run --yes FLAGS -- CMD` as the session's owner, against `box`."""
    owner = running_box.owner
    env = {**running_box.owner_env(), **{k: v for k, v in box.env.items() if k.startswith("LNK_")}}
    return subprocess.run(
        as_user(owner.uid, owner.gid, str(LNK), "sandbox", "run", "--yes", *flags, "--", *cmd),
        env=env,
        cwd=str(owner.home),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _witness(running_box: RunningBox) -> tuple[Path, list[str], list[str]]:
    """A file the program would create in its write grant: (path, flags, command)."""
    folder = running_box.owner.home / "project" / "out"
    witness = folder / f"ran-{secrets.token_hex(4)}"
    return witness, [f"--write={folder}", "--command=touch"], ["/usr/bin/touch", str(witness)]


def _assert_refused(result: subprocess.CompletedProcess[str], *names: str) -> None:
    """Refused as a launch the wall cannot build: exit 3, one line naming each of `names`."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == EXIT_REFUSED, (result.returncode, result.stderr)
    assert "refused [launch]" in result.stderr, result.stderr
    for name in names:
        assert name.lower() in result.stderr.lower(), (name, result.stderr)


def test_launch_on_a_kernel_with_an_older_landlock_abi_is_refused(
    running_box: RunningBox, private_box: Any
) -> None:
    witness, flags, cmd = _witness(running_box)
    try:
        with private_box(f"unsafe_pretend_landlock_abi = {LANDLOCK_ABI_NEEDED - 1}") as box:
            result = _run_in(running_box, box, *flags, cmd=cmd)
            users = box.user_lines()
        assert not witness.exists(), "the program ran with a Landlock ABI below what it needs"
        assert users == []
        _assert_refused(result, "Landlock", "ABI", str(LANDLOCK_ABI_NEEDED - 1))
    finally:
        with suppress(FileNotFoundError):
            witness.unlink()


def test_launch_without_bwrap_is_refused(running_box: RunningBox, private_box: Any) -> None:
    witness, flags, cmd = _witness(running_box)
    try:
        with private_box('bwrap = "/nonexistent/bwrap"') as box:
            result = _run_in(running_box, box, *flags, cmd=cmd)
            users = box.user_lines()
        assert not witness.exists(), "the program ran without bwrap"
        assert users == []
        _assert_refused(result, "bwrap")
    finally:
        with suppress(FileNotFoundError):
            witness.unlink()


def test_launch_without_the_confiner_is_refused(running_box: RunningBox, private_box: Any) -> None:
    witness, flags, cmd = _witness(running_box)
    try:
        with private_box('confiner = "/nonexistent/lnk-sandbox"') as box:
            result = _run_in(running_box, box, *flags, cmd=cmd)
            users = box.user_lines()
        assert not witness.exists(), "the program ran without its confiner"
        assert users == []
        _assert_refused(result, "confiner")
    finally:
        with suppress(FileNotFoundError):
            witness.unlink()


def test_launch_without_the_launcher_is_refused(running_box: RunningBox, private_box: Any) -> None:
    witness, flags, cmd = _witness(running_box)
    try:
        with private_box('spawner = "/nonexistent/lnk-spawn"') as box:
            result = _run_in(running_box, box, *flags, cmd=cmd)
            users = box.user_lines()
        assert not witness.exists(), "the program ran without its launcher"
        assert users == []
        _assert_refused(result, "launcher")
        assert "/nonexistent/lnk-spawn" in result.stderr and "reinstall" in result.stderr
    finally:
        with suppress(FileNotFoundError):
            witness.unlink()


def test_write_grant_on_ssh_folder_is_refused_naming_the_rule(running_box: RunningBox) -> None:
    ssh = running_box.owner.home / ".ssh"
    witness = ssh / f"ran-{secrets.token_hex(4)}"
    try:
        result = running_box.run(
            "--write=~/.ssh", "--command=touch", cmd=["/usr/bin/touch", str(witness)]
        )
        assert not witness.exists(), "the program ran with ~/.ssh writable"
        assert "Traceback" not in result.stderr, result.stderr
        assert result.returncode == EXIT_REFUSED, (result.returncode, result.stderr)
        assert "refused [code-runs-outside]" in result.stderr, result.stderr
        assert ".ssh" in result.stderr
    finally:
        with suppress(FileNotFoundError):
            witness.unlink()


def test_a_user_that_cannot_be_made_refuses_the_launch_and_leaves_nothing(
    running_box: RunningBox, private_box: Any
) -> None:
    """The sandbox's user is made while its mounts are staged: when making it fails (here a
    home of its name is already there), the launch is refused, what was staged meanwhile is
    removed, no /etc line stays, and the next launch (on the same uid) runs."""
    witness, flags, cmd = _witness(running_box)
    try:
        with private_box() as box:
            staging = box.run_dir / "sandboxes"
            stale = box.state_dir / "homes" / f"{SANDBOX_USER_PREFIX}{box.uid_first}"
            stale.mkdir(mode=0o700)
            refused = _run_in(running_box, box, *flags, cmd=cmd)
            users = box.user_lines()
            mounts = [
                m
                for m in Path("/proc/self/mountinfo").read_text().splitlines()
                if f" {staging}/" in m
            ]
            left = list(staging.iterdir())
            ran_before = witness.exists()
            again = _run_in(running_box, box, *flags, cmd=cmd)
        assert "Traceback" not in refused.stderr, refused.stderr
        assert refused.returncode != 0
        assert f"{stale} already exists" in refused.stderr, refused.stderr
        assert not ran_before, "the program ran without its user"
        assert (users, mounts, left) == ([], [], [])
        assert again.returncode == 0, again.stderr
        assert witness.exists()
    finally:
        with suppress(FileNotFoundError):
            witness.unlink()
