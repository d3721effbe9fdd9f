"""A box of the benchmark's own for the time of a measurement: its own run, state and config
folders and its own block of sandbox uids (a starting controller removes the sandbox users of
its range it has no record of, so sharing a running box's range would take its sandboxes
away), `lnk box up` on entry, and on exit `lnk box down` with every folder removed."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
LNK = str(PREFIX / "venv" / "bin" / "lnk")
UID_BLOCK = 1000
_FOLDERS = ("LNK_RUN_DIR", "LNK_STATE_DIR", "LNK_CONFIG_DIR")


@dataclass(frozen=True)
class PrivateBox:
    env: dict[str, str]  # what `lnk` needs to reach this box
    uids: range  # its sandboxes' host uids


@contextmanager
def private_box(
    uid_base: int, uid_blocks: int, config: str = "", prefix: Path = PREFIX
) -> Iterator[PrivateBox]:
    """A running box whose uid block is one of `uid_blocks` blocks from `uid_base` (each bench
    has its own span, away from the e2e tests'), run by the box installed in `prefix`."""
    lnk = str(prefix / "venv" / "bin" / "lnk")
    tag = secrets.token_hex(3)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "LANG": "C.UTF-8",
        "LNK_RUN_DIR": f"/run/lnk-bench-{tag}",
        "LNK_STATE_DIR": f"/var/lib/lnk-bench-{tag}",
        "LNK_CONFIG_DIR": f"/etc/lnk-bench-{tag}",
    }
    first = uid_base + secrets.randbelow(uid_blocks) * UID_BLOCK
    uids = range(first, first + UID_BLOCK)
    config_dir = Path(env["LNK_CONFIG_DIR"])
    config_dir.mkdir(mode=0o755)
    (config_dir / "controller.toml").write_text(
        f"uid_first = {uids[0]}\nuid_last = {uids[-1]}\n{config}"
    )
    try:
        subprocess.run([lnk, "box", "up"], env=env, check=True, stdout=subprocess.DEVNULL)
        yield PrivateBox(env, uids)
    finally:
        subprocess.run([lnk, "box", "down"], env=env, check=False, stdout=subprocess.DEVNULL)
        subprocess.run(
            ["umount", "-l", f"{env['LNK_RUN_DIR']}/sandboxes"], check=False, capture_output=True
        )
        for key in _FOLDERS:
            shutil.rmtree(env[key], ignore_errors=True)
