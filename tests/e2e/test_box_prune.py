"""`lnk box prune`: root prunes ended sandboxes past the box's count (records and wire logs),
live ones never, and a second prune finds nothing; another user is refused."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from typing import Any

import pytest
from as_owner import run_lnk

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = pytest.mark.needs_root

KEEP = 2  # the box keeps its two newest ended sandboxes
RUNS = 4


def test_box_prune_keeps_the_newest_ended_and_is_idempotent(
    running_box: RunningBox, private_box: Any
) -> None:
    with private_box(f"ended_keep_count = {KEEP}") as box:
        for _ in range(RUNS):
            ran = run_lnk(running_box, "sandbox", "run", "--yes", "--", "/bin/true", box=box)
            assert ran.returncode == 0, ran.stderr
        wire = box.state_dir / "wire"
        with closing(
            sqlite3.connect(f"file:{box.state_dir / 'controller.db'}?mode=ro", uri=True)
        ) as db:
            ids = [r[0] for r in db.execute("SELECT id FROM sandboxes ORDER BY ended_at")]
        assert len(ids) == RUNS
        for sandbox_id in ids:  # as the proxy writes them
            (wire / f"{sandbox_id}.log").write_text("{}\n")
        (wire / "sbx-000000000000.log").write_text("{}\n")  # a log without a record

        refused = run_lnk(running_box, "box", "prune", box=box)
        assert refused.returncode == 1 and "for root" in refused.stderr
        assert "Traceback" not in refused.stderr

        pruned = box.lnk("box", "prune")
        assert pruned.returncode == 0, pruned.stderr
        assert f"pruned {RUNS - KEEP} ended record(s) and {RUNS - KEEP + 1} wire log(s)" in (
            pruned.stdout
        )
        listed = run_lnk(running_box, "sandbox", "list", "--all", "--json", box=box, check=True)
        assert sorted(r["id"] for r in json.loads(listed.stdout)) == sorted(ids[-KEEP:])
        assert sorted(p.name for p in wire.iterdir()) == sorted(f"{i}.log" for i in ids[-KEEP:])

        again = box.lnk("box", "prune")
        assert again.returncode == 0, again.stderr
        assert "pruned 0 ended record(s) and 0 wire log(s)" in again.stdout
