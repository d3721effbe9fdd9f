"""`lnk box authorize`: root lets a key into a box user's account, through the gate only.

Judges every part of the line before it is written (the key, the spec, the folder, the box),
makes the user a box user (`sshd_dropin.harden_user`), then adds the line to the user's
root-owned file (`key_store`). Nothing is written when anything is refused.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from lnk_shared.accounts import home_token, prove_account
from lnk_shared.discovery import real_or_planned
from lnk_shared.errors import RefusedError, SpecError, UsageError
from lnk_shared.paths import BoxPaths
from lnk_ssh_gate.authorized_keys import (
    MAX_KEY_BYTES,
    KeyRefused,
    check_folder,
    forced_command,
    key_line,
    parse_public_key,
)
from lnk_ssh_gate.gate_paths import GatePathRefused, check_line_path, check_root_owned_path
from lnk_ssh_gate.key_store import KeyStore
from lnk_ssh_gate.sshd_dropin import harden_user

__all__ = ["Authorized", "SessionCheckRefused", "authorize", "default_lnk"]

CHECK_TIMEOUT_S = 60  # `lnk sandbox enter --check` reads and judges the spec; seconds at most


class SessionCheckRefused(RefusedError):
    """The gate, run as the box user, would refuse every session of this line."""

    rule = "session-check"


@dataclass(frozen=True)
class Authorized:
    fingerprint: str
    path: Path
    line: str
    changes: list[str]
    added: bool = True  # False: this very line was already there, and nothing changed


def default_lnk() -> str:
    """The `lnk` of the install this runs from (/opt/lnk/venv/bin/lnk on a box)."""
    return str(Path(sys.prefix) / "bin" / "lnk")


def _read_key(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read the key {path}: {exc.strerror}") from None
    if b"\x00" in data:
        raise KeyRefused(path, "it holds NUL: not a public key")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyRefused(path, "it is not text: give the .pub file") from None


def _real(path: str, what: str, *, want_dir: bool) -> None:
    try:
        info = os.stat(path)
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror}") from None
    if want_dir and not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{what} {path} is not a folder")
    if not want_dir and not stat.S_ISREG(info.st_mode):
        raise SpecError("not a regular file", source=path)
    if os.path.realpath(path) != path:
        raise GatePathRefused(
            f"{what} {path}",
            f"it passes through a link (really {os.path.realpath(path)}): write the real path, "
            "so what the line names cannot be moved under it",
        )


def _check_as_user(entry: pwd.struct_passwd, command: str) -> None:
    """Run the line's command with --check as the box user: what every session would meet
    (the spec unreadable, no /bin/bash, writes elsewhere, a folder the rules refuse) is
    refused now, while root is here to fix it. A spec edited later is judged at its session."""
    argv = [
        "/usr/bin/setpriv",
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--init-groups",
        "--",
        *command.split(" "),  # every word was checked: no quoting, no spaces inside a word
        "--check",
    ]
    try:
        result = subprocess.run(
            argv,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SessionCheckRefused(command, f"cannot run it as {entry.pw_name}: {exc}") from None
    if result.returncode != 0:
        why = result.stderr.strip().removeprefix("lnk: ") or f"exit status {result.returncode}"
        raise SessionCheckRefused(
            f"the line for {entry.pw_name}", f"run as {entry.pw_name}, the gate refuses it: {why}"
        )


def authorize(
    *,
    user: str,
    spec: str,
    folder: str,
    key_file: str,
    run_dir: str | None,
    store: KeyStore,
    lnk: str | None = None,
) -> Authorized:
    forced_command(lnk or default_lnk(), spec, folder, run_dir)  # checks each path first
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise UsageError(f"there is no user {user!r} on this machine") from None
    if entry.pw_uid == 0:
        raise UsageError("root is not a box user: the gate is for unprivileged users")
    proof = prove_account(entry.pw_uid)
    if proof is None or proof.name != user:
        raise UsageError(f"{user!r} is not the account of uid {entry.pw_uid} on this machine")
    command = forced_command(
        lnk or default_lnk(), spec, folder, run_dir, home_token(entry.pw_uid, proof)
    )
    _real(spec, "the spec", want_dir=False)
    _real(folder, "the folder", want_dir=True)
    if run_dir is not None:
        check_root_owned_path(Path(check_line_path(run_dir, "the box's run dir")), "the run dir")
    box = BoxPaths.from_env()
    protected = [
        (real_or_planned(entry.pw_dir), f"{user}'s home, whose dot files run at each login"),
        ("/etc", "the machine's settings"),
        *[(real_or_planned(str(d)), "the box's own folder") for d in box.all()],
        (real_or_planned(str(store.directory)), "the keys' folder"),
        (spec, "the spec: a session that wrote it would widen its next one"),
    ]
    if run_dir is not None:
        protected.append((real_or_planned(run_dir), "the box's run dir"))
    check_folder(folder, protected)
    key = parse_public_key(_read_key(key_file), key_file)
    line = key_line(key, command)
    _check_as_user(entry, command)
    store.already(user, key, line)  # another line of the key: refused before the user changes
    changes = harden_user(user)
    path, added = store.add(user, key, line)  # checks again, locked
    return Authorized(key.fingerprint, path, line, changes, added)
