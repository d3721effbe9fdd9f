"""Leases: a sandbox whose lease runs out is stopped and cleaned away by the controller, without
its client doing anything; `lnk sandbox` shows and extends a lease only for its owner."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
from as_owner import lnk_argv, owner_env

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = pytest.mark.needs_root

LEASE_S = 2  # the private box's lease: short, so the test sees it run out
WAIT_S = 15.0  # the reaper kills at the lease's end; cleaning takes well under a second


def test_an_expired_lease_stops_and_cleans_the_sandbox(
    running_box: RunningBox, private_box: Any
) -> None:
    with private_box(f"lease_seconds = {LEASE_S}") as box:
        env = owner_env(running_box, box)
        started = time.monotonic()
        client = subprocess.run(
            lnk_argv(
                running_box,
                "sandbox",
                "run",
                "--yes",
                "--command=sleep",
                "--",
                "/bin/sh",
                "-c",
                "sleep 60; echo survived",
            ),
            env=env,
            cwd=str(running_box.owner.home),
            capture_output=True,
            text=True,
            timeout=WAIT_S + 30,
            check=False,
        )
        took = time.monotonic() - started
        assert "survived" not in client.stdout
        assert client.returncode != 0
        assert took < LEASE_S + WAIT_S, f"the lease of {LEASE_S} s ended the run after {took:.0f} s"
        assert box.user_lines() == []
        listed = subprocess.run(
            lnk_argv(running_box, "sandbox", "list", "--json"),
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(listed.stdout) == []


def test_a_lease_cannot_be_extended_past_the_box_limit(running_box: RunningBox) -> None:
    owner = running_box.owner
    client = subprocess.Popen(
        lnk_argv(
            running_box,
            "sandbox",
            "run",
            "--yes",
            "--command=sleep",
            "--",
            "/usr/bin/sleep",
            "30",
        ),
        env=running_box.owner_env(),
        cwd=str(owner.home),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not rows:
            listed = running_box.as_owner("sandbox", "list", "--json")
            rows = [
                r
                for r in json.loads(listed.stdout or "[]")
                if r["state"] == "running" and r["command"][-1] == "30"
            ]
            time.sleep(0.1)
        assert rows, "the sandbox never showed as running"
        sandbox_id = rows[0]["id"]
        too_long = running_box.as_owner("sandbox", "lease", sandbox_id, "--seconds", "99999999")
        assert too_long.returncode != 0 and "at most" in too_long.stderr
        ok = running_box.as_owner("sandbox", "lease", sandbox_id, "--seconds", "600")
        assert ok.returncode == 0, ok.stderr
    finally:
        client.terminate()
        client.wait(timeout=30)
