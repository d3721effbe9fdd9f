"""Exit statuses a script can rely on, against a real box, run by its real unprivileged owner.

A command that runs a program passes the program's status through, whatever it is (1, 2 and 3
included: a program's own failure must not read as lnk's "error", "usage" or "refused"), and
says its own with the statuses env, timeout and docker run use: 125 lnk's error, 126 refused or
the program cannot run, 127 not found; the C client (its quick path) and both Python clients
alike. Every other command keeps 0-3, and what it is asked for that already holds (an agent
stopped, a sandbox ended) is 0.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_owner import build_alone, owner_env, owner_tmp, run_as_owner

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]
RunningBox = Any  # tests/e2e/conftest.py
PREFIX = install_prefix.PREFIX
WAIT_S = 60.0
PYTHON_CLI = "from lnk_cli.__main__ import main; main()"


@pytest.fixture(scope="module")
def clients() -> Iterator[dict[str, list[str]]]:
    """Each client as the argv that starts it: the C one alone (its quick path only: no Python
    beside it), Python's quick path, and Python's full client (given a flag, as argparse reads)."""
    with owner_tmp("lnks-e2e-") as root:
        alone = build_alone(root)
        python = [str(PREFIX / "venv" / "bin" / "python3"), "-P", "-c", PYTHON_CLI]
        yield {"c": [str(alone)], "python-quick": python, "python-full": python}


def _spec(box: RunningBox, text: str) -> Path:
    owner = box.owner
    spec = owner.home / f"statuses-{secrets.token_hex(3)}.toml"
    spec.write_text(text)
    os.chown(spec, owner.uid, owner.gid)
    return spec


def _run(
    box: RunningBox, client: str, clients: dict[str, list[str]], words: list[str], **env: str
) -> subprocess.CompletedProcess[str]:
    """`lnk sandbox run WORDS` by `client`; the full Python client gets a flag first (a plain
    form would take its quick path)."""
    flags = ["--processes", "64"] if client == "python-full" else []
    argv = [*clients[client], "sandbox", "run", *flags, *words]
    return run_as_owner(box, argv, env=owner_env(box, **env))


def _sandbox_rows(box: RunningBox) -> list[dict[str, Any]]:
    listed = box.as_owner("sandbox", "list", "--all", "--json")
    assert listed.returncode == 0, listed.stderr
    rows: list[dict[str, Any]] = json.loads(listed.stdout)
    return rows


CLIENTS = ["c", "python-quick", "python-full"]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_programs_own_1_2_3_pass_through_and_do_not_read_as_lnks(
    running_box: RunningBox, clients: dict[str, list[str]], client: str
) -> None:
    # Each of lnk's own old statuses through the C client (most runs take its path), and the
    # one that read as "refused" through each Python client: the same code decides for both.
    for status in (1, 2, 3) if client == "c" else (3,):
        script = f"echo ran {status}; exit {status}"
        ran = _run(running_box, client, clients, ["--yes", "--", "/bin/sh", "-c", script])
        assert (ran.returncode, ran.stdout) == (status, f"ran {status}\n"), ran.stderr
        # the program's failure, not lnk's (the one note says where it started: its home,
        # as the caller's is not granted; test_working_folder_note.py)
        said = [line for line in ran.stderr.splitlines() if not line.startswith("lnk: note: ")]
        assert "lnk:" not in "\n".join(said)


@pytest.mark.parametrize("client", CLIENTS)
def test_lnks_own_failures_in_a_run_are_125_126_127_and_nothing_runs(
    running_box: RunningBox, clients: dict[str, list[str]], client: str, tmp_path: Path
) -> None:
    box, owner = running_box, running_box.owner
    marker = owner.home / f"ran-{secrets.token_hex(3)}"
    touch = ["--", "/bin/sh", "-c", f"echo ran > {marker}"]  # would show it ran, outside
    refused = _spec(box, "[localhost]\nports = [40781]\n")  # the main proxy's port: a rule
    unknown_key = _spec(box, "[folders]\nreed = []\n")
    new = _spec(box, "# never approved\n")
    not_executable = owner.home / f"plain-{secrets.token_hex(3)}.txt"
    not_executable.write_text("#!/bin/sh\necho ran\n")
    os.chown(not_executable, owner.uid, owner.gid)
    before = len(_sandbox_rows(box))
    cases = {
        "a rule refuses the spec": (["--yes", "--spec", str(refused), *touch], 126),
        "not approved (no terminal to ask)": (["--spec", str(new), *touch], 126),
        "a spec that cannot be read": (["--yes", "--spec", str(unknown_key), *touch], 125),
        "a spec file missing": (["--yes", "--spec", str(tmp_path / "none.toml"), *touch], 125),
        "a program not found": (["--yes", "--", "no-such-program-" + secrets.token_hex(3)], 127),
        "a program not executable": (["--yes", "--", str(not_executable)], 126),
    }
    try:
        for what, (words, status) in cases.items():
            ran = _run(box, client, clients, words)
            assert ran.returncode == status, (what, ran.returncode, ran.stderr)
            said = ran.stderr.splitlines()[-1]  # after the question's lines, if any
            assert said.startswith(("lnk: ", "lnk-sandbox: ")), (what, ran.stderr)
            assert "Traceback" not in ran.stderr
        no_box = _run(box, client, clients, ["--yes", *touch], LNK_RUN_DIR=str(tmp_path))
        assert no_box.returncode == 125, no_box.stderr
        assert "the box is not running" in no_box.stderr
    finally:
        for path in (refused, unknown_key, new, not_executable):
            path.unlink(missing_ok=True)
    assert not marker.exists()  # none of them ran the program
    # Only the program that could not be executed got as far as a sandbox of its own.
    assert len(_sandbox_rows(box)) - before <= 1


def test_the_other_commands_keep_0_to_3_and_what_already_holds_is_0(
    running_box: RunningBox,
) -> None:
    box, owner = running_box, running_box.owner
    assert box.as_owner("agent", "create", "bad name!", "--spec", "/etc/hostname").returncode == 2
    assert box.as_owner("sandbox", "list", "--no-such-flag").returncode == 2
    status = subprocess.run(  # what a script reads of the box: data, not text to match
        [str(PREFIX / "venv" / "bin" / "lnk"), "box", "status", "--json"],
        env=box.env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    doc = json.loads(status.stdout)
    assert [s["name"] for s in doc["services"]] == ["proxy", "bridge-store", "controller"]
    assert doc["up"] is True and status.returncode == 0, status.stdout
    assert all(s["state"] == "up" and type(s["pid"]) is int for s in doc["services"])

    ended = box.run(cmd=["/bin/true"])
    assert ended.returncode == 0, ended.stderr
    (row,) = [r for r in _sandbox_rows(box) if r.get("command") == ["/bin/true"]][-1:]
    stopped = box.as_owner("sandbox", "stop", row["id"])
    assert stopped.returncode == 0, stopped.stderr  # ended already: what was asked holds
    zero = box.as_owner("sandbox", "lease", row["id"], "--seconds", "0")
    assert zero.returncode == 2, zero.stderr  # the caller's number is wrong: a usage error
    assert "seconds" in zero.stderr and "Traceback" not in zero.stderr

    name = "st-" + secrets.token_hex(2)
    spec = _spec(box, "# an agent's spec\n")
    created = box.as_owner("agent", "create", name, "--spec", str(spec))
    assert created.returncode == 0, created.stderr
    try:
        # `--yes` after the name approves the spec and runs the default program (its stdin is
        # empty: it ends at once); it is never taken as the program to run.
        started = box.as_owner("agent", "start", name, "--yes", stdin=subprocess.DEVNULL)
        assert started.returncode == 0, started.stderr
        assert "--yes" not in started.stderr
        for _ in range(2):  # stopped already, and again: no error either time
            stop = box.as_owner("agent", "stop", name)
            assert stop.returncode == 0, stop.stderr
            assert "not running" in stop.stdout
        refused = box.as_owner("agent", "start", name, "--force")
        assert refused.returncode == 125 and "unknown option" in refused.stderr
    finally:
        box.as_owner("agent", "remove", name)
        spec.unlink(missing_ok=True)
        shutil.rmtree(owner.home / "Link" / "Agents" / name, ignore_errors=True)
