"""`lnk` in C (lnk_cli/native/lnk_client.c) against a real box, run by its real unprivileged owner.

The quick-path runs use a copy of the binary alone in its folder: no python3 beside it, so any
fall-back to Python would fail with "cannot run the Python CLI"; a sandbox that ran proves the
C path launched it by itself. The fall-back is checked from a copy laid out as a venv's (bin/lnk
beside bin/python3, with the installed venv's pyvenv.cfg and lib/), as the packaged `lnk` is.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_owner import build_alone, owner_tmp, run_as_owner, start_as_owner

from lnk_shared.native_build import CLIENT

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]
RunningBox = Any  # tests/e2e/conftest.py
WAIT_S = 30.0


@dataclass
class Clients:
    alone: Path  # the quick path only: no python3 beside it
    venv: Path  # beside the installed venv's python3: falls back to the Python CLI


@pytest.fixture(scope="module")
def clients() -> Iterator[Clients]:
    # Outside /tmp/pytest-of-root (0700), so the unprivileged owner can run it.
    with owner_tmp("lnkc-e2e-") as root:
        alone = build_alone(root)
        venv = install_prefix.PREFIX / "venv"
        (root / "venv" / "bin").mkdir(parents=True)
        shutil.copy(venv / "pyvenv.cfg", root / "venv" / "pyvenv.cfg")
        (root / "venv" / "lib").symlink_to(venv / "lib")
        (root / "venv" / "bin" / "python3").symlink_to(venv / "bin" / "python3")
        shutil.copy(alone, root / "venv" / "bin" / CLIENT)
        for folder in (root / "venv", root / "venv" / "bin"):
            folder.chmod(0o755)
        yield Clients(alone=alone, venv=root / "venv" / "bin" / CLIENT)


def _run(
    box: RunningBox, lnk: Path, *words: str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return run_as_owner(box, [str(lnk), *words], input=input, timeout=WAIT_S)


def _note(box: RunningBox) -> str:
    """The note the runs from the owner's home get: it is not granted (sandbox_plan.cwd_note)."""
    home = box.owner.home
    return f"lnk: note: {home} is not granted to this sandbox; it starts in "


def _said(box: RunningBox, stderr: str) -> str:
    """`stderr` after its first line, which must be the note."""
    first, _, rest = stderr.partition("\n")
    assert first.startswith(_note(box)), stderr
    return rest


def test_true_runs_end_to_end(running_box: RunningBox, clients: Clients) -> None:
    ran = _run(running_box, clients.alone, "sandbox", "run", "--yes", "--", "/bin/true")
    assert (ran.returncode, ran.stdout, _said(running_box, ran.stderr)) == (0, "", "")


def test_output_and_exit_status_pass_through(running_box: RunningBox, clients: Clients) -> None:
    script = 'read line; echo "out $line"; echo err >&2; exit 7'
    ran = _run(
        running_box,
        clients.alone,
        "sandbox",
        "run",
        "--yes",
        "--",
        "/bin/sh",
        "-c",
        script,
        input="from stdin\n",
    )
    said = _said(running_box, ran.stderr)
    assert (ran.returncode, ran.stdout, said) == (7, "out from stdin\n", "err\n")


def test_a_spec_file_grants_what_it_says(running_box: RunningBox, clients: Clients) -> None:
    owner = running_box.owner
    project = owner.home / "project"
    spec = owner.home / f"native-{secrets.token_hex(3)}.toml"
    spec.write_text(f'[folders]\nread = ["{project}"]\n')
    os.chown(spec, owner.uid, owner.gid)
    read = f'read line < "{project}/readme.txt" && echo "$line"'
    try:
        granted = _run(
            running_box, clients.alone, "sandbox", "run", f"--spec={spec}", "--yes", "--",
            "/bin/sh", "-c", read,
        )  # fmt: skip
        # The owner's secret is not in the spec: the wall still stands for the C client.
        secret = f'read line < "{owner.home}/secret.txt" && echo "$line"'
        refused = _run(
            running_box, clients.alone, "sandbox", "run", "--spec", str(spec), "--yes", "--",
            "/bin/sh", "-c", secret,
        )  # fmt: skip
    finally:
        spec.unlink(missing_ok=True)
    assert (granted.returncode, granted.stdout) == (0, "hello project\n"), granted.stderr
    assert refused.returncode != 0
    assert "secret.txt" in refused.stderr  # the shell could not open it
    assert owner.secret not in refused.stdout + refused.stderr


def test_a_new_spec_without_yes_is_refused_as_python_refuses_it(
    running_box: RunningBox, clients: Clients
) -> None:
    owner = running_box.owner
    spec = owner.home / f"native-{secrets.token_hex(3)}.toml"
    spec.write_text(f'[folders]\nread = ["{owner.home / "project"}"]\n')
    os.chown(spec, owner.uid, owner.gid)
    try:
        ran = _run(running_box, clients.alone, "sandbox", "run", "--spec", str(spec), "--", "true")
    finally:
        spec.unlink(missing_ok=True)
    assert ran.returncode == 126  # not approved: refused, nothing ran (a run's status)
    assert "project" in ran.stderr  # the question's lines: what it would open
    assert ran.stderr.endswith(
        "lnk: not approved: there is no terminal to ask on; "
        "read what it opens (lnk spec show) and pass --yes to approve it\n"
    )


def test_sigterm_to_the_client_reaches_the_program(
    running_box: RunningBox, clients: Clients
) -> None:
    owner = running_box.owner
    spec = owner.home / f"sleep-{secrets.token_hex(3)}.toml"
    spec.write_text('[commands]\nallow = ["sleep"]\n')
    os.chown(spec, owner.uid, owner.gid)
    script = 'trap "echo got-term; exit 9" TERM; echo ready; sleep 30 & wait'
    argv = [
        str(clients.alone), "sandbox", "run", "--yes", "--spec", str(spec), "--",
        "/bin/sh", "-c", script,
    ]  # fmt: skip
    process = start_as_owner(running_box, argv, stdin=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], WAIT_S)
        assert ready, "the program did not start"
        assert process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        spec.unlink(missing_ok=True)
    assert "got-term" in out, (out, err)
    assert process.returncode == 9, (out, err)


def test_other_commands_fall_back_to_the_python_cli(
    running_box: RunningBox, clients: Clients
) -> None:
    listed = _run(running_box, clients.venv, "sandbox", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert isinstance(json.loads(listed.stdout), list)
    alone = _run(running_box, clients.alone, "sandbox", "list")
    assert alone.returncode == 1
    assert alone.stderr.startswith("lnk: cannot run the Python CLI (")
