"""A launch the wall cannot build as promised is refused, naming what is missing, and nothing
runs: an older Landlock, a missing bwrap, a missing confiner, a spec a rule refuses.

A missing capability is simulated by a box of its own whose config says so (a pretended
Landlock ABI, a bwrap or Python path that does not exist); the session's box is never touched.
Each program here would leave a file in a write grant if it ran at all.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = pytest.mark.needs_root

PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
LNK = PREFIX / "venv" / "bin" / "lnk"
LNK_PYTHON = PREFIX / "venv" / "bin" / "python"
SANDBOX_USER_PREFIX = "lnk-sbx-"
EXIT_REFUSED = 3  # lnk_shared.errors: a rule or a missing capability refuses the launch
LANDLOCK_ABI_NEEDED = 6  # lnk_controller.spawn.MIN_LANDLOCK_ABI: scoping of signals and sockets


@dataclass
class _PrivateBox:
    env: dict[str, str]
    run_dir: Path
    state_dir: Path
    config_dir: Path
    uid_first: int
    uid_last: int

    def lnk(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(LNK), *args], env=self.env, capture_output=True, text=True, timeout=60, check=False
        )

    def users(self) -> list[str]:
        found = []
        for path in ("/etc/passwd", "/etc/group"):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    uid = line.split(":")[2]
                    ours = uid.isdigit() and self.uid_first <= int(uid) <= self.uid_last
                    if line.startswith(SANDBOX_USER_PREFIX) and ours:
                        found.append(f"{path}: {line.strip()}")
        return found


_REMOVE_USERS = """
import sys
from lnk_controller import host_users
first, last = int(sys.argv[1]), int(sys.argv[2])
for user in host_users.list_lnk_users():
    if first <= user.uid <= last:
        host_users.remove_user(user)
"""


@contextmanager
def _private_box(config: str) -> Iterator[_PrivateBox]:
    """A box of its own with `config` in its controller.toml, torn down whatever happens. Its
    uid range is its own: a starting controller removes the users of its range it did not
    record, which would be another box's sandboxes."""
    tag = secrets.token_hex(4)
    first = 2_000_100_000 + secrets.randbelow(1000) * 100_000
    box = _PrivateBox(
        env={
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "LNK_RUN_DIR": f"/run/lnk-test-{tag}",
            "LNK_STATE_DIR": f"/var/lib/lnk-test-{tag}",
            "LNK_CONFIG_DIR": f"/etc/lnk-test-{tag}",
            "LANG": "C.UTF-8",
        },
        run_dir=Path(f"/run/lnk-test-{tag}"),
        state_dir=Path(f"/var/lib/lnk-test-{tag}"),
        config_dir=Path(f"/etc/lnk-test-{tag}"),
        uid_first=first,
        uid_last=first + 999,
    )
    box.config_dir.mkdir(mode=0o755)
    (box.config_dir / "controller.toml").write_text(
        f"uid_first = {box.uid_first}\nuid_last = {box.uid_last}\n{config}\n"
    )
    try:
        up = box.lnk("box", "up")
        if up.returncode != 0:
            log = box.state_dir / "logs" / "controller.log"
            pytest.fail(
                f"lnk box up failed: {up.stderr}\n{log.read_text() if log.exists() else ''}"
            )
        yield box
    finally:
        box.lnk("box", "down")
        with suppress(OSError, ValueError):
            os.kill(int((box.run_dir / "controller.pid").read_text()), signal.SIGKILL)
        subprocess.run(
            ["umount", "-R", "-l", str(box.run_dir / "sandboxes")], capture_output=True, check=False
        )
        subprocess.run(
            [str(LNK_PYTHON), "-I", "-c", _REMOVE_USERS, str(box.uid_first), str(box.uid_last)],
            capture_output=True,
            check=False,
        )
        for path in (box.run_dir, box.state_dir, box.config_dir):
            shutil.rmtree(path, ignore_errors=True)


def _run_in(
    running_box: RunningBox, box: _PrivateBox, *flags: str, cmd: list[str]
) -> subprocess.CompletedProcess[str]:
    """`lnk sandbox run --yes FLAGS -- CMD` as the session's owner, against `box`."""
    owner = running_box.owner
    env = {**running_box.owner_env(), **{k: v for k, v in box.env.items() if k.startswith("LNK_")}}
    return subprocess.run(
        [
            "/usr/bin/setpriv",
            f"--reuid={owner.uid}",
            f"--regid={owner.gid}",
            "--init-groups",
            "--",
            str(LNK),
            "sandbox",
            "run",
            "--yes",
            *flags,
            "--",
            *cmd,
        ],
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
    running_box: RunningBox,
) -> None:
    witness, flags, cmd = _witness(running_box)
    try:
        with _private_box(f"unsafe_pretend_landlock_abi = {LANDLOCK_ABI_NEEDED - 1}") as box:
            result = _run_in(running_box, box, *flags, cmd=cmd)
            users = box.users()
        assert not witness.exists(), "the program ran with a Landlock ABI below what it needs"
        assert users == []
        _assert_refused(result, "Landlock", "ABI", str(LANDLOCK_ABI_NEEDED - 1))
    finally:
        with suppress(FileNotFoundError):
            witness.unlink()


def test_launch_without_bwrap_is_refused(running_box: RunningBox) -> None:
    witness, flags, cmd = _witness(running_box)
    try:
        with _private_box('bwrap = "/nonexistent/bwrap"') as box:
            result = _run_in(running_box, box, *flags, cmd=cmd)
            users = box.users()
        assert not witness.exists(), "the program ran without bwrap"
        assert users == []
        _assert_refused(result, "bwrap")
    finally:
        with suppress(FileNotFoundError):
            witness.unlink()


def test_launch_without_the_confiner_is_refused(running_box: RunningBox) -> None:
    witness, flags, cmd = _witness(running_box)
    try:
        with _private_box('python = "/nonexistent/python"') as box:
            result = _run_in(running_box, box, *flags, cmd=cmd)
            users = box.users()
        assert not witness.exists(), "the program ran without its confiner"
        assert users == []
        _assert_refused(result, "confiner")
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
