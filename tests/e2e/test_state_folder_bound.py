"""A box's state folder over many launches against one folder: with a small ended_keep_count,
the ended records stay within the count and its slack after every launch, not only after the
hour's prune (before, a box kept every record of the hour: ~3 KB a launch), and SQLite's WAL is
checkpointed (it stays under its auto-checkpoint's size, not one frame set per launch)."""

from __future__ import annotations

import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from lnk_controller.retention import prune_slack

pytestmark = pytest.mark.needs_root

KEEP = 4  # the box's ended_keep_count: small, so the launches below pass it several times
LAUNCHES = 48  # past KEEP + its slack (20) twice over
WAL_MAX_BYTES = (1000 + 200) * 4096  # SQLite's auto-checkpoint (1000 pages) and a launch's writes
SETTLE_S = 60.0  # a hang guard for the last prune: the bound is the count, not a time
POLL_S = 0.05


def _ended_records(state_dir: Path) -> int:
    uri = f"file:{state_dir / 'controller.db'}?mode=ro"
    with sqlite3.connect(uri, uri=True) as conn:
        (count,) = conn.execute("SELECT count(*) FROM sandboxes WHERE state = 'ended'").fetchone()
    conn.close()
    return int(count)


def test_the_ended_records_stay_within_a_small_count_over_many_launches(
    private_box: Any,
) -> None:
    bound = KEEP + prune_slack(KEEP)
    with private_box(f"ended_keep_count = {KEEP}") as box, tempfile.TemporaryDirectory() as work:
        for _ in range(LAUNCHES):
            run = box.lnk("sandbox", "run", "--yes", "--write", work, "--", "/bin/true")
            assert run.returncode == 0, run.stderr
        deadline = time.monotonic() + SETTLE_S
        while _ended_records(box.state_dir) > bound and time.monotonic() < deadline:
            time.sleep(POLL_S)
        kept = _ended_records(box.state_dir)
        assert kept <= bound, f"{kept} ended records kept with ended_keep_count = {KEEP}"
        assert box.lnk("sandbox", "run", "--write", work, "--", "/bin/true").returncode == 0
        wal = box.state_dir / "controller.db-wal"
        assert wal.stat().st_size <= WAL_MAX_BYTES, "the WAL grows: it is not checkpointed"
