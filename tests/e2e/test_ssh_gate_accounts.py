"""A key `lnk box authorize` let in is bound to that account: after `userdel -r` and a `useradd`
of the same name with the same uid, whom root then lets in with the new person's own key (the
same keys file, by name), the old key's holder (its line still in that file) no longer gets a
session as the new person, and nothing of its session runs; the new person's key does."""

from __future__ import annotations

import dataclasses
import os
import pwd
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from sshd import LNK, GateSshd, authorize, gate_sshd, let_in

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]


@pytest.fixture(scope="module")
def sshd() -> Iterator[GateSshd]:
    with gate_sshd() as server:
        yield server


def _recreate(name: str, uid: int) -> None:
    """userdel -r, then useradd of the same name with the same uid (and a new home)."""
    for entry in os.listdir("/proc"):
        with suppress(OSError, ProcessLookupError):
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid:
                os.kill(int(entry), signal.SIGKILL)
    subprocess.run(["userdel", "-r", name], check=True, capture_output=True)
    subprocess.run(
        ["useradd", "-m", "-s", "/bin/sh", "-u", str(uid), name], check=True, capture_output=True
    )
    subprocess.run(["usermod", "-p", "*", name], check=True)  # not locked: sshd would refuse


def test_a_key_let_in_for_a_deleted_account_does_not_enter_its_successor(
    running_box: RunningBox, sshd: GateSshd
) -> None:
    user = let_in(running_box, sshd)
    first = sshd.ssh(user, command="id -u")
    assert first.returncode == 0, first.stderr  # the granted path: the key gets its session

    _recreate(user.name, user.uid)
    assert pwd.getpwnam(user.name).pw_uid == user.uid
    successor = dataclasses.replace(user, key=user.key.with_name(f"{user.name}_successor"))
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(successor.key)], check=True
    )
    authorize(running_box, sshd, successor)  # root lets the new person in, with its own key

    witness = user.folder / "entered"
    later = sshd.ssh(user, command=f"touch {witness}")  # the old key, its old line
    assert later.returncode != 0, later.stdout
    assert "key-account" in later.stderr and "another account of this name" in later.stderr
    assert not witness.exists()
    own = sshd.ssh(successor, command="id -u")
    assert own.returncode == 0, own.stderr
    assert own.stdout.strip().isdigit()


def _unbind(path: Path) -> None:
    """The user's line as the gate wrote it before lines were bound: no `--account`."""
    text = path.read_text(encoding="utf-8")
    old = re.sub(r" --account [0-9:]+\"", '"', text)
    assert old != text
    path.write_text(old, encoding="utf-8")


def _listed(box: RunningBox, sshd: GateSshd, user: str) -> str:
    argv = ["box", "authorize", "--list", "--user", user, "--keys-dir", str(sshd.keys_dir)]
    return subprocess.run(
        [str(LNK), *argv], env=box.env, capture_output=True, text=True, check=True
    ).stdout


def test_a_line_written_before_accounts_does_not_let_a_recycled_uid_in(
    running_box: RunningBox, sshd: GateSshd
) -> None:
    """A line without `--account` (from before lines were bound) still sits in the file after
    its user was deleted and made again with the same uid and name, and root let the new person
    in with its own key: the old key's holder got a session as the new person. Now the old line
    is refused at every session, naming what root does; the new person's key still gets in."""
    user = let_in(running_box, sshd)
    _unbind(sshd.keys_dir / user.name)
    _recreate(user.name, user.uid)
    successor = dataclasses.replace(user, key=user.key.with_name(f"{user.name}_successor"))
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(successor.key)], check=True
    )
    authorize(running_box, sshd, successor)

    witness = user.folder / "entered"
    refused = sshd.ssh(user, command=f"touch {witness}")  # the old key, its unbound line
    assert refused.returncode != 0, refused.stdout
    assert "key-account" in refused.stderr and "no --account" in refused.stderr
    assert "lnk box authorize --bind" in refused.stderr
    assert not witness.exists()
    own = sshd.ssh(successor, command="id -u")
    assert own.returncode == 0, own.stderr


def test_root_sees_an_unbound_line_and_binds_it_to_the_account(
    running_box: RunningBox, sshd: GateSshd
) -> None:
    """The admin's way out: `--list` marks the unbound line, `--bind --user U` binds U's such
    lines to U's account as it is now (root vouches it is the same person), and the key gets
    its session again."""
    user = let_in(running_box, sshd)
    _unbind(sshd.keys_dir / user.name)
    assert "UNBOUND" in _listed(running_box, sshd, user.name)
    assert sshd.ssh(user, command="id -u").returncode != 0

    keys = str(sshd.keys_dir)
    bound = subprocess.run(
        [str(LNK), "box", "authorize", "--bind", "--user", user.name, "--keys-dir", keys],
        env=running_box.env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bound.returncode == 0, bound.stderr
    assert f"to {user.name}'s account" in bound.stdout
    assert "UNBOUND" not in _listed(running_box, sshd, user.name)
    entered = sshd.ssh(user, command="id -u")
    assert entered.returncode == 0, entered.stderr
