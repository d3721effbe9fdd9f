"""The SSH gate end to end, specs and refusals: a spec edited between sessions rules the next
one, `--read ~` still hides the box's settings, `--check` runs nothing, every session fails
closed (no bash, other writes, a spec others could rewrite, the box down, an over-long
command), and `lnk box authorize` refuses what it must.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from as_user import as_user
from sshd import (
    LNK,
    BoxUser,
    GateSshd,
    RunningBox,
    authorize,
    gate_sshd,
    let_in,
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
    return let_in(running_box, sshd)


# -- the spec, at each session ------------------------------------------------------------------


def test_a_sessions_environment_is_the_specs_env_and_never_the_key_holders(
    running_box: RunningBox, sshd: GateSshd
) -> None:
    """Root's spec gives the variable; the key holder's own (sent with SendEnv) does not reach
    the sandbox, nor replaces the spec's."""
    holder = sshd.add_user(spec_text(extra='[env]\nGATE_MODE = "from-the-spec"\n'))
    authorize(running_box, sshd, holder)
    result = sshd.ssh(
        holder,
        "-o",
        "SendEnv=GATE_MODE LC_GATE_OWN",
        command='echo "[$GATE_MODE][${LC_GATE_OWN:-unset}]"',
        env={**os.environ, "GATE_MODE": "from-the-holder", "LC_GATE_OWN": "holder"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[from-the-spec][unset]\n"


def test_a_spec_edited_between_sessions_rules_the_next_one(
    running_box: RunningBox, sshd: GateSshd
) -> None:
    edited = sshd.add_user(spec_text())
    authorize(running_box, sshd, edited)
    data = sshd.data / f"shared-{edited.name}"
    data.mkdir(mode=0o755)
    (data / "notes.txt").write_text("from the admin\n")
    first = sshd.ssh(edited, command=f"cat {data}/notes.txt")
    assert first.returncode != 0
    assert "from the admin" not in first.stdout
    edited.spec.write_text(spec_text(extra=f'[folders]\nread = ["{data}"]\n'))
    second = sshd.ssh(edited, command=f"cat {data}/notes.txt")  # no question asked: root chose
    assert second.returncode == 0, second.stderr
    assert second.stdout == "from the admin\n"
    edited.spec.write_text(spec_text(commands=["id"]))
    third = sshd.ssh(edited, command=f"cat {data}/notes.txt")
    assert third.returncode != 0
    assert "/bin/bash" in third.stderr


def test_read_home_still_hides_the_box_settings_and_agents(
    running_box: RunningBox, sshd: GateSshd
) -> None:
    reader = sshd.add_user(spec_text(extra='[folders]\nread = ["~"]\n'))
    authorize(running_box, sshd, reader)
    secret = secrets.token_hex(8)
    for rel in ("visible.txt", ".lnk/settings", "Link/Agents/a1/key"):
        path = reader.home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{secret}\n")
    subprocess.run(["chown", "-R", f"{reader.uid}:{reader.gid}", str(reader.home)], check=True)
    visible = sshd.ssh(reader, command=f"cat {reader.home}/visible.txt")
    assert visible.stdout == f"{secret}\n", visible.stderr
    hidden = sshd.ssh(
        reader, command=f"cat {reader.home}/.lnk/settings {reader.home}/Link/Agents/a1/key"
    )
    assert secret not in hidden.stdout
    assert hidden.returncode != 0


def _enter_as(user: BoxUser, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        as_user(user.uid, user.gid, str(LNK), "sandbox", "enter", *args),
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_check_prints_the_grants_and_runs_nothing(
    running_box: RunningBox, sshd: GateSshd, user: BoxUser
) -> None:
    from lnk_shared.accounts import home_token, prove_account

    mark = user.folder / f"ran-{secrets.token_hex(3)}"
    proof = prove_account(user.uid)
    assert proof is not None
    result = _enter_as(  # the line's own command, as `lnk box authorize` wrote it
        user,
        "--spec",
        str(user.spec),
        "--folder",
        str(user.folder),
        "--run-dir",
        str(running_box.run_dir),
        "--account",
        home_token(user.uid, proof),
        "--check",
        env={"PATH": "/usr/bin:/bin", "SSH_ORIGINAL_COMMAND": f"touch {mark}"},
    )
    assert result.returncode == 0, result.stderr
    assert re.search(rf"^\s+write\s+{re.escape(str(user.folder))}$", result.stdout, re.M)
    assert re.search(r"^\s+run\s+/bin/bash", result.stdout, re.M), result.stdout
    assert re.search(r"^hash: [0-9a-f]{64}$", result.stdout, re.M)
    time.sleep(0.5)
    assert not mark.exists()


# -- fail closed ----------------------------------------------------------------------------------


def test_a_spec_that_does_not_let_bash_run_is_refused_before_anything_runs(
    running_box: RunningBox, sshd: GateSshd
) -> None:
    nobash = sshd.add_user(spec_text())
    authorize(running_box, sshd, nobash)
    nobash.spec.write_text(spec_text(commands=["touch", "id"]))  # edited after it was let in
    mark = nobash.folder / "ran"
    for command in (f"touch {mark}", None):
        result = sshd.ssh(nobash, command=command)
        assert result.returncode != 0
        assert "/bin/bash" in result.stderr and "[commands]" in result.stderr
    over_sftp = sftp(sshd, nobash, "ls\n")
    assert over_sftp.returncode != 0
    assert not mark.exists()


def test_a_spec_that_writes_elsewhere_is_refused(running_box: RunningBox, sshd: GateSshd) -> None:
    other = sshd.data / f"other-{secrets.token_hex(3)}"
    other.mkdir()
    writer = sshd.add_user(spec_text())
    os.chown(other, writer.uid, writer.gid)
    authorize(running_box, sshd, writer)
    writer.spec.write_text(spec_text(extra=f'[folders]\nwrite = ["{other}"]\n'))
    result = sshd.ssh(writer, command=f"touch {other}/x {writer.folder}/x")
    assert result.returncode == 126  # refused: a session is a run (lnk sandbox enter)
    assert "session-writes" in result.stderr
    assert list(other.iterdir()) == [] and list(writer.folder.iterdir()) == []


def test_a_spec_the_box_user_could_rewrite_is_refused(
    running_box: RunningBox, sshd: GateSshd
) -> None:
    owned = sshd.add_user(spec_text())
    authorize(running_box, sshd, owned)
    os.chown(owned.spec, owned.uid, owned.gid)  # e.g. an admin's slip after the key went in
    result = sshd.ssh(owned, command=f"touch {owned.folder}/x")
    assert result.returncode == 126  # refused: a session is a run
    assert "the spec" in result.stderr and "not root" in result.stderr
    assert list(owned.folder.iterdir()) == []


def test_a_box_that_is_down_is_a_clear_refusal(running_box: RunningBox, sshd: GateSshd) -> None:
    down = sshd.root / "box-that-is-down"
    down.mkdir(mode=0o755)
    lost = sshd.add_user(spec_text())
    authorize(running_box, sshd, lost, "--run-dir", str(down))
    result = sshd.ssh(lost, command=f"touch {lost.folder}/x")
    assert result.returncode == 125  # lnk's own error in a run
    assert "the box is not running" in result.stderr
    assert list(lost.folder.iterdir()) == []


def test_an_over_long_command_is_refused(sshd: GateSshd, user: BoxUser) -> None:
    mark = user.folder / f"long-{secrets.token_hex(3)}"
    result = sshd.ssh(user, command=f"touch {mark}; : " + "x" * 70_000)
    assert result.returncode == 125  # lnk's own (usage) error in a run
    assert "over the limit" in result.stderr
    assert not mark.exists()


# -- the generator, as root runs it ---------------------------------------------------------------


def _authorize_cli(box: RunningBox, sshd: GateSshd, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LNK), "box", "authorize", "--keys-dir", str(sshd.keys_dir), *args],
        env=box.env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize(
    "where", ["home", "home-inside", "etc", "run-dir", "state-dir", "keys-dir", "through-a-link"]
)
def test_authorize_refuses_a_folder_in_a_protected_place(
    running_box: RunningBox, sshd: GateSshd, user: BoxUser, where: str
) -> None:
    link = sshd.data / f"link-{secrets.token_hex(3)}"
    link.symlink_to(user.folder)
    folder = {
        "home": user.home,
        "home-inside": user.home / "work",
        "etc": Path("/etc"),
        "run-dir": running_box.run_dir,
        "state-dir": running_box.state_dir,
        "keys-dir": sshd.keys_dir,
        "through-a-link": link,
    }[where]
    if where == "home-inside":
        folder.mkdir(exist_ok=True)
    before = (sshd.keys_dir / user.name).read_text()
    result = _authorize_cli(
        running_box,
        sshd,
        *("--user", user.name, "--spec", str(user.spec), "--folder", str(folder)),
        *("--key", f"{user.key}.pub", "--run-dir", str(running_box.run_dir)),
    )
    assert result.returncode == 3, result.stderr
    assert "session-folder" in result.stderr or "gate-path" in result.stderr
    assert (sshd.keys_dir / user.name).read_text() == before


def test_authorize_again_is_ok_another_line_of_the_key_is_refused_revoke_takes_it_out(
    running_box: RunningBox, sshd: GateSshd
) -> None:
    twice = sshd.add_user(spec_text())
    authorize(running_box, sshd, twice)
    keys_file = sshd.keys_dir / twice.name
    before = keys_file.read_text()
    same = ("--user", twice.name, "--spec", str(twice.spec), "--folder", str(twice.folder))
    run_dir = ("--run-dir", str(running_box.run_dir))  # as sshd.authorize wrote it
    again = _authorize_cli(running_box, sshd, *same, "--key", f"{twice.key}.pub", *run_dir)
    assert again.returncode == 0, again.stderr  # what automation re-runs: no error
    assert "already authorized" in again.stdout
    assert keys_file.read_text() == before  # nothing added
    other = twice.folder.parent / f"{twice.folder.name}-other"
    other.mkdir()
    shutil.chown(other, twice.name, twice.name)
    elsewhere = _authorize_cli(
        running_box,
        sshd,
        *("--user", twice.name, "--spec", str(twice.spec), "--folder", str(other)),
        *("--key", f"{twice.key}.pub", *run_dir),
    )
    assert elsewhere.returncode == 3  # sshd would take the first line and ignore this one
    assert "already in" in elsewhere.stderr
    assert keys_file.read_text() == before
    found = re.search(r"SHA256:[A-Za-z0-9+/]+", elsewhere.stderr)
    assert found is not None
    fingerprint = found.group(0)
    revoked = _authorize_cli(running_box, sshd, "--revoke", fingerprint, "--user", twice.name)
    assert revoked.returncode == 0, revoked.stderr
    assert sshd.ssh(twice, command="true").returncode == 255  # the key no longer gets in


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        (spec_text(commands=["id"]), "/bin/bash"),
        (spec_text(extra='[folders]\nwrite = ["/var/tmp"]\n'), "session-writes"),
        ("[nonsense]\n", "nonsense"),
    ],
    ids=["no-bash", "writes-elsewhere", "unreadable-spec"],
)
def test_authorize_refuses_a_line_every_session_would_fail(
    running_box: RunningBox, sshd: GateSshd, spec: str, why: str
) -> None:
    """The line's command is run with --check as the user before anything is written."""
    doomed = sshd.add_user(spec)
    result = _authorize_cli(
        running_box,
        sshd,
        *("--user", doomed.name, "--spec", str(doomed.spec), "--folder", str(doomed.folder)),
        *("--key", f"{doomed.key}.pub", "--run-dir", str(running_box.run_dir)),
    )
    assert result.returncode == 3, result.stderr
    assert "session-check" in result.stderr and why in result.stderr
    assert not (sshd.keys_dir / doomed.name).exists()
