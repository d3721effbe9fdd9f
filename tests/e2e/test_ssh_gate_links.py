"""Through the SSH gate too, no link a session makes lands in its folder: sftp's symlink request
(and `ln -s` in a command) is refused inside the sandbox (Landlock, no MAKE_SYM in a write
grant), so the box user's own write afterwards, on the host, stays in the folder."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from as_user import as_user
from sshd import (
    TOOLS,
    BoxUser,
    GateSshd,
    RunningBox,
    authorize,
    gate_sshd,
    sftp,
    spec_text,
)

pytestmark = pytest.mark.needs_root


@pytest.fixture(scope="module")
def sshd() -> Iterator[GateSshd]:
    with gate_sshd() as server:
        yield server


@pytest.fixture(scope="module")
def user(running_box: RunningBox, sshd: GateSshd) -> BoxUser:
    """A box user whose sessions may run `ln` too."""
    user = sshd.add_user(spec_text(commands=[*TOOLS, "ln"]))
    authorize(running_box, sshd, user)
    return user


def test_a_link_made_over_sftp_or_a_command_is_refused(sshd: GateSshd, user: BoxUser) -> None:
    keys = user.home / ".ssh" / "authorized_keys"
    over_sftp = user.folder / f"report-{secrets.token_hex(3)}.txt"
    by_command = user.folder / f"notes-{secrets.token_hex(3)}.txt"
    refused = sftp(sshd, user, f"-ln -s {keys} {over_sftp}\n")
    assert refused.returncode == 0, refused.stderr  # the session ran; the step was refused
    assert "Permission denied" in refused.stderr, refused.stderr
    command = sshd.ssh(user, command=f"ln -s {keys} {by_command}; echo status=$?")
    assert command.returncode == 0, command.stderr
    assert command.stdout.strip() == "status=1", command.stdout + command.stderr
    for link in (over_sftp, by_command):
        assert not link.is_symlink() and not link.exists()
    # The box user's own write on the host afterwards lands in the folder, nowhere else.
    keys_before = keys.read_bytes() if keys.exists() else None
    wrote = subprocess.run(
        as_user(user.uid, user.gid, "/bin/sh", "-c", f"echo x > {over_sftp}"),
        capture_output=True, check=False,
    )  # fmt: skip
    assert wrote.returncode == 0
    assert (keys.read_bytes() if keys.exists() else None) == keys_before
    assert over_sftp.read_text() == "x\n"
    over_sftp.unlink()


def test_a_plain_file_over_sftp_still_lands(sshd: GateSshd, user: BoxUser, tmp_path: Any) -> None:
    name = f"plain-{secrets.token_hex(3)}.txt"
    (tmp_path / "in.txt").write_text("plain\n")
    ok = sftp(sshd, user, f"put {tmp_path}/in.txt {user.folder}/{name}\n")
    assert ok.returncode == 0, ok.stderr
    assert (user.folder / name).read_text() == "plain\n"
    (user.folder / name).unlink()
