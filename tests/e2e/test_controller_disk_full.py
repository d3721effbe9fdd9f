"""A disk that fills while sandboxes run: every client still gets its program's real exit
status (it is known before the last write), and once space returns no record says a sandbox is
live without one and every uid is free again."""

from __future__ import annotations

import errno
import json
import sqlite3
import subprocess
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from as_owner import lnk_argv, owner_env, run_lnk

RunningBox = Any  # tests/e2e/conftest.py
PrivateBox = Any
pytestmark = pytest.mark.needs_root

STATE_MB = 24  # the state folder's tmpfs: the database, its logs and the sandboxes' homes
STATUSES = (7, 8, 9)  # each sandbox's program exits with its own
SETTLE_S = 90.0  # the reaper's back-off is at most 30 s; a loaded machine is slow
POLL_S = 0.05
FILL_CHUNK = 4096  # a page at a time, so the tmpfs ends up full to the last page


def _listed(running_box: RunningBox, box: PrivateBox) -> list[dict[str, Any]] | None:
    listed = run_lnk(running_box, "sandbox", "list", "--json", box=box)
    if listed.returncode != 0:
        return None  # the controller could not answer (a full disk): asked again
    rows: list[dict[str, Any]] = json.loads(listed.stdout)
    return rows


def _wait_for(what: str, done: Any, timeout: float = SETTLE_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = done()
        if value:
            return value
        time.sleep(POLL_S)
    pytest.fail(f"{what}: not within {timeout:g} s")


def _fill(path: Path) -> None:
    with open(path, "wb", buffering=0) as f:  # unbuffered: nothing left to fail at close
        while True:
            try:
                f.write(b"\0" * FILL_CHUNK)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                return


def _records(database: Path) -> list[tuple[str, str]]:
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        return list(db.execute("SELECT id, state FROM sandboxes"))


def test_a_disk_filled_while_sandboxes_run_leaves_no_ghost_record(
    running_box: RunningBox, private_box: Any
) -> None:
    with private_box(state_tmpfs_mb=STATE_MB) as box:
        env = owner_env(running_box, box)
        clients = []
        try:
            for status in STATUSES:  # each waits for a line on its stdin, then exits
                clients.append(
                    subprocess.Popen(
                        lnk_argv(
                            running_box,
                            "sandbox",
                            "run",
                            "--yes",
                            "--",
                            "/bin/sh",
                            "-c",
                            f"read line; exit {status}",
                        ),
                        env=env,
                        cwd=str(running_box.owner.home),
                        stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                    )
                )
            _wait_for(
                "every sandbox running",
                lambda: (
                    [r["state"] for r in _listed(running_box, box) or []]
                    == ["running"] * len(STATUSES)
                ),
            )
            fill = box.state_dir / "fill"
            _fill(fill)
            got, errors = [], []
            for client in clients:  # the disk stays full while each program exits
                _out, err = client.communicate(b"go\n", timeout=SETTLE_S)
                got.append(client.returncode)
                errors.append(err.decode(errors="replace"))
            assert got == list(STATUSES), errors
        finally:
            for client in clients:
                if client.poll() is None:
                    client.kill()
                    client.wait(timeout=60)
                for pipe in (client.stdin, client.stderr):
                    if pipe is not None:
                        pipe.close()
        fill.unlink()  # space returns: every clean-up the full disk stopped now lands
        _wait_for(
            "every sandbox cleaned once space returned", lambda: _listed(running_box, box) == []
        )
        records = _records(box.state_dir / "controller.db")
        assert len(records) == len(STATUSES)
        assert {state for _id, state in records} == {"ended"}
        assert box.user_lines() == []
        # the uids are free: a launch goes through
        again = run_lnk(running_box, "sandbox", "run", "--yes", "--", "/bin/true", box=box)
        assert again.returncode == 0, again.stderr
