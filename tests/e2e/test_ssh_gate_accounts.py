"""A key `lnk box authorize` let in is bound to that account: after `userdel -r` and a `useradd`
of the same name with the same uid, whom root then lets in with the new person's own key (the
same keys file, by name), the old key's holder (its line still in that file) no longer gets a
session as the new person, and nothing of its session runs; the new person's key does."""

from __future__ import annotations

import dataclasses
import os
import pwd
import signal
import subprocess
from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import pytest
from sshd import GateSshd, authorize, gate_sshd, let_in

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
