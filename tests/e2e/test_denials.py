"""Refusals that explain themselves, as a box user meets them: a program that fails on what
Landlock denied it is told, in one line on stderr, what was denied and the flag that grants it
(or the rule that refuses that grant); `lnk sandbox show --json` keeps it whether the program
failed or not; a sandbox that denies itself 100,000 times keeps the controller answering and its
record bounded. Real kernel (Landlock ABI 7 audit records), real users, real bwrap."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from typing import Any

import install_prefix
import pytest
from as_user import as_user

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = pytest.mark.needs_root

MAX_EXAMPLES = 5  # lnk_controller.denials.MAX_EXAMPLES
FLOOD = 100_000
LIST_WITHIN_S = 5.0  # `lnk sandbox list` answers within this while a sandbox floods
FLOOD_TIMEOUT_S = 240
LNK = str(install_prefix.LNK)


def _last(box: RunningBox) -> dict[str, Any]:
    listed = box.as_owner("sandbox", "list", "--all", "--json")
    assert listed.returncode == 0, listed.stderr
    newest = max(json.loads(listed.stdout), key=lambda row: row["created_at"])
    shown = box.as_owner("sandbox", "show", newest["id"], "--json")
    assert shown.returncode == 0, shown.stderr
    row: dict[str, Any] = json.loads(shown.stdout)
    return row


def _ensure_audit(box: RunningBox) -> None:
    said = (box.run_dir / "denials.status").read_text(encoding="utf-8")
    if said.startswith("unavailable"):
        pytest.skip(f"this kernel's audit is not readable here: {said.strip()}")


def test_a_listing_the_sandbox_is_denied_says_what_to_grant(running_box: RunningBox) -> None:
    """A file of ~/project granted, and `ls ~/project` inside (a user looking for the rest):
    Landlock denies reading the folder; the failed run's stderr names it and the flag, show
    --json holds it, and the run with that flag lists the folder."""
    _ensure_audit(running_box)
    project = running_box.owner.home / "project"
    file_only = f"--read={project / 'readme.txt'}"
    run = running_box.run(
        file_only, "--command=ls", cmd=["/bin/sh", "-c", f"ls '{project}'; exit 3"]
    )
    assert run.returncode == 3
    assert "Permission denied" in run.stderr
    hint = "read ~/project (grant it with --read ~/project)"
    assert f"lnk: denied: {hint}" in run.stderr
    row = _last(running_box)
    assert row["denials"]["count"] >= 1
    assert hint in row["denials"]["examples"]
    granted = running_box.run(f"--read={project}", "--command=ls", cmd=["ls", str(project)])
    assert granted.returncode == 0, granted.stderr
    assert "readme.txt" in granted.stdout and "denied:" not in granted.stderr


def test_a_grant_the_box_refuses_is_not_suggested(running_box: RunningBox) -> None:
    """`ls /`: reading / is denied, and `--read /` would be refused (it holds other programs'
    sockets): the hint says the rule, never the flag."""
    _ensure_audit(running_box)
    run = running_box.run("--command=ls", cmd=["/bin/sh", "-c", "ls /; exit 1"])
    assert run.returncode == 1
    assert "denied: read / (refused [other-programs-sockets]:" in run.stderr
    assert "--read /)" not in run.stderr and "--read / " not in run.stderr


def test_a_program_that_succeeds_is_not_told_but_show_keeps_it(running_box: RunningBox) -> None:
    _ensure_audit(running_box)
    project = running_box.owner.home / "project"
    run = running_box.run(
        f"--read={project / 'readme.txt'}",
        "--command=ls",
        cmd=["/bin/sh", "-c", f"ls '{project}' || true"],
    )
    assert run.returncode == 0
    assert "denied:" not in run.stderr
    row = _last(running_box)
    hint = "read ~/project (grant it with --read ~/project)"
    assert hint in row["denials"]["examples"]
    text = running_box.as_owner("sandbox", "show", row["id"])
    assert "denied by the kernel (" in text.stdout
    assert hint in text.stdout


def test_another_users_view_of_the_sandbox_holds_no_denials(running_box: RunningBox) -> None:
    """The paths a sandbox tried are its owner's: root's `show` of it has none (as with its
    command)."""
    _ensure_audit(running_box)
    running_box.run("--command=ls", cmd=["/bin/sh", "-c", "ls /home; exit 1"])
    row = _last(running_box)
    assert row["denials"]["count"] >= 1  # its owner sees them
    env = {**running_box.env}
    shown = subprocess.run(
        [LNK, "sandbox", "show", row["id"], "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["denials"] is None


def test_a_flood_of_denials_keeps_the_controller_answering(running_box: RunningBox) -> None:
    """100,000 denials from one sandbox: `lnk sandbox list` answers within LIST_WITHIN_S all
    along, and the sandbox's record holds the exact count and at most MAX_EXAMPLES lines."""
    _ensure_audit(running_box)
    flood = (
        "import os, sys\n"
        "print('flooding', flush=True)\n"
        f"for n in range({FLOOD}):\n"
        "    try:\n"
        "        os.listdir('/home')\n"
        "    except PermissionError:\n"
        "        pass\n"
        "sys.exit(5)\n"
    )
    argv = ["sandbox", "run", "--yes", "--command=python3", "--", "python3", "-c", flood]
    owner = running_box.owner
    process = subprocess.Popen(
        as_user(owner.uid, owner.gid, LNK, *argv),
        env=running_box.owner_env(),
        cwd=str(owner.home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "flooding\n"
        slowest = 0.0
        while process.poll() is None:
            began = time.monotonic()
            listed = running_box.as_owner("sandbox", "list", timeout=30)
            slowest = max(slowest, time.monotonic() - began)
            assert listed.returncode == 0, listed.stderr
        _, err = process.communicate(timeout=FLOOD_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 5, err
    assert slowest < LIST_WITHIN_S, f"lnk sandbox list took {slowest:.1f} s during the flood"
    assert err.count("denied:") == 1
    row = _last(running_box)
    # The kernel's own count (its domain's end record), though it dropped records past its
    # backlog: every denial counted, five at most kept.
    assert row["denials"]["count"] == FLOOD
    assert len(row["denials"]["examples"]) <= MAX_EXAMPLES


def test_box_status_says_whether_runs_explain_denials(running_box: RunningBox) -> None:
    status = subprocess.run(
        [LNK, "box", "status"], env=running_box.env, capture_output=True, text=True, check=False
    )
    line = next(x for x in status.stdout.splitlines() if x.startswith("denials"))
    assert line.split(None, 1)[1].startswith(("on", "off", "unavailable"))


# A bidi override and a zero-width space: reversed, hidden text. (Terminal controls cannot be
# in a grant's path at all: the box refuses them; the unit test reads a kernel record of one.)
HOSTILE = "ev\u202etxt.exe\u200b"


def test_a_hostile_folder_name_is_shown_escaped(running_box: RunningBox) -> None:
    """The owner's folder named with a bidi override: a file in it is granted, the folder itself
    is not, and listing it is denied: stderr and show name it with every control escaped."""
    _ensure_audit(running_box)
    owner = running_box.owner
    folder = owner.home / HOSTILE
    folder.mkdir()
    (folder / "notes.txt").write_text("n\n")
    os.chown(folder, owner.uid, owner.gid)
    os.chown(folder / "notes.txt", owner.uid, owner.gid)
    try:
        run = running_box.run(
            f"--read={folder / 'notes.txt'}",
            "--command=ls",
            cmd=["/bin/sh", "-c", f"ls '{folder}'; exit 1"],
        )
        assert run.returncode == 1
        said = [line for line in run.stderr.splitlines() if line.startswith("lnk: denied:")]
        assert said, run.stderr
        escaped = "ev\\u202etxt.exe\\u200b"
        assert escaped in said[0]
        assert said[0].isprintable()
        row = _last(running_box)
        assert any(escaped in line for line in row["denials"]["examples"])
        assert all(line.isprintable() for line in row["denials"]["examples"])
    finally:
        shutil.rmtree(folder)
