"""The lease reaper under faults: one sandbox whose clean-up keeps failing (something mounted
under its home) and a reaper thread killed by an injected exception must not stop another
sandbox's lease from ending it; the failing one is shown `cleaning (retrying: …)` and cleaned
once its fault is gone."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from as_owner import lnk_argv, owner_env, run_lnk

RunningBox = Any  # tests/e2e/conftest.py
PrivateBox = Any
pytestmark = pytest.mark.needs_root

LONG_LEASE_S = 600  # the box's default lease: no sandbox here ends by it
ENFORCED_WITHIN_S = 2.0  # the bound: a 1 s lease ends its sandbox within 2 s
SETTLE_S = 60.0  # how long a state the test waits for may take on a loaded machine
POLL_S = 0.02


def _listed(running_box: RunningBox, box: PrivateBox) -> list[dict[str, Any]]:
    listed = run_lnk(running_box, "sandbox", "list", "--json", box=box)
    assert listed.returncode == 0, listed.stderr
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


def _uid_processes(uid: int) -> list[int]:
    """Live (not zombie) processes with `uid` as their real, effective or saved uid."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", encoding="ascii", errors="replace") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        zombie = fields.get("State", "").split()[:1] == ["Z"]
        if not zombie and str(uid) in fields.get("Uid", "").split()[:3]:
            found.append(int(name))
    return found


@contextmanager
def _sleepers(running_box: RunningBox, box: PrivateBox, count: int) -> Iterator[list[Any]]:
    """`count` sandboxes running `sleep`, each by its own client, started one after the other
    (so their records are oldest first in that order); yields (client, row) pairs."""
    owner = running_box.owner
    started: list[Any] = []
    try:
        for n in range(count):
            client = subprocess.Popen(
                lnk_argv(
                    running_box,
                    "sandbox",
                    "run",
                    "--yes",
                    "--command=sleep",
                    "--",
                    "/usr/bin/sleep",
                    str(900 + n),
                ),
                env=owner_env(running_box, box),
                cwd=str(owner.home),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            started.append((client, None))

            def running(tag: str = str(900 + n)) -> dict[str, Any] | None:
                rows = [r for r in _listed(running_box, box) if r["command"][-1] == tag]
                return rows[0] if rows and rows[0]["state"] == "running" else None

            started[-1] = (client, _wait_for(f"sandbox {n} running", running))
        yield started
    finally:
        for client, _row in started:
            client.terminate()
        for client, _row in started:
            client.wait(timeout=60)


@contextmanager
def _mounted_under_home(box: PrivateBox, host_uid: int) -> Iterator[Path]:
    """A tmpfs mounted under the sandbox user's home: its clean-up cannot remove the home."""
    homes = box.state_dir / "homes"
    (home,) = [p for p in homes.iterdir() if p.stat().st_uid == host_uid]
    point = home / "stuck"
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "lnk-test", str(point)], check=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)


def _ends_within_bound(running_box: RunningBox, box: PrivateBox, client: Any, row: Any) -> float:
    """Set the sandbox's lease to 1 s; return how long until no process of its uid is left."""
    lease = run_lnk(running_box, "sandbox", "lease", row["id"], "--seconds", "1", box=box)
    assert lease.returncode == 0, lease.stderr
    started = time.monotonic()
    _wait_for(
        f"the 1 s lease of {row['id']} ending it",
        lambda: not _uid_processes(row["host_uid"]),
        timeout=SETTLE_S,
    )
    took = time.monotonic() - started
    assert client.wait(timeout=SETTLE_S) != 0
    return took


def _stuck_then_freed(running_box: RunningBox, box: PrivateBox) -> None:
    with _sleepers(running_box, box, 2) as ((stuck_client, stuck), (leased_client, leased)):
        with _mounted_under_home(box, stuck["host_uid"]):
            # the stuck one ends first, and its clean-up fails on every pass from then on
            lease = run_lnk(running_box, "sandbox", "lease", stuck["id"], "--seconds", "1", box=box)
            assert lease.returncode == 0, lease.stderr
            stuck_client.wait(timeout=SETTLE_S)
            _wait_for(
                "the stuck sandbox's processes killed",
                lambda: not _uid_processes(stuck["host_uid"]),
            )

            def retrying() -> dict[str, Any] | None:
                rows = {r["id"]: r for r in _listed(running_box, box)}
                row = rows.get(stuck["id"])
                return row if row and row["state"] == "stopping" and row["retrying"] else None

            shown = _wait_for("the stuck sandbox shown as retrying", retrying)
            assert "mounted" in shown["retrying"]
            listed = run_lnk(running_box, "sandbox", "list", box=box)
            assert f"{stuck['id']}  cleaning (retrying: " in listed.stdout, listed.stdout

            took = _ends_within_bound(running_box, box, leased_client, leased)
            assert took < ENFORCED_WITHIN_S, f"a 1 s lease ended its sandbox after {took:.1f} s"
            _wait_for(
                "the leased sandbox cleaned away",
                lambda: all(r["id"] != leased["id"] for r in _listed(running_box, box)),
            )
        # the fault is gone: the next retry cleans the stuck sandbox away
        _wait_for("the stuck sandbox cleaned once freed", lambda: not _listed(running_box, box))
    assert box.user_lines() == []


def test_a_stuck_clean_up_does_not_hold_up_another_lease(
    running_box: RunningBox, private_box: Any
) -> None:
    with private_box(f"lease_seconds = {LONG_LEASE_S}") as box:
        _stuck_then_freed(running_box, box)


def test_a_reaper_killed_by_an_exception_is_restarted_and_still_ends_leases(
    running_box: RunningBox, private_box: Any
) -> None:
    config = f"lease_seconds = {LONG_LEASE_S}\nunsafe_test_reaper_crash_every = 2"
    with private_box(config) as box:
        _stuck_then_freed(running_box, box)
        log = (box.state_dir / "logs" / "controller.log").read_text()
        assert "unsafe_test_reaper_crash_every" in log  # the switch says it is on
        assert "reaper thread ended" in log and "restarted" in log
