"""`lnk box prune`: root prunes ended sandboxes past the box's count (records and wire logs),
live ones never, and a second prune finds nothing; another user is refused."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from contextlib import closing
from typing import Any

import install_prefix
import pytest
from as_user import as_user

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = pytest.mark.needs_root

LNK = str(install_prefix.LNK)
KEEP = 2  # the box keeps its two newest ended sandboxes
RUNS = 4


def _owner_env(running_box: RunningBox, box: Any) -> dict[str, str]:
    return {**running_box.owner_env(), **{k: v for k, v in box.env.items() if k.startswith("LNK_")}}


def test_box_prune_keeps_the_newest_ended_and_is_idempotent(
    running_box: RunningBox, private_box: Any
) -> None:
    owner = running_box.owner
    with private_box(f"ended_keep_count = {KEEP}") as box:
        env = _owner_env(running_box, box)
        for _ in range(RUNS):
            ran = subprocess.run(
                as_user(owner.uid, owner.gid, LNK, "sandbox", "run", "--yes", "--", "/bin/true"),
                env=env,
                cwd=str(owner.home),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
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

        refused = subprocess.run(
            as_user(owner.uid, owner.gid, LNK, "box", "prune"),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode == 1 and "for root" in refused.stderr
        assert "Traceback" not in refused.stderr

        pruned = box.lnk("box", "prune")
        assert pruned.returncode == 0, pruned.stderr
        assert f"pruned {RUNS - KEEP} ended record(s) and {RUNS - KEEP + 1} wire log(s)" in (
            pruned.stdout
        )
        listed = subprocess.run(
            as_user(owner.uid, owner.gid, LNK, "sandbox", "list", "--all", "--json"),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert sorted(r["id"] for r in json.loads(listed.stdout)) == sorted(ids[-KEEP:])
        assert sorted(p.name for p in wire.iterdir()) == sorted(f"{i}.log" for i in ids[-KEEP:])

        again = box.lnk("box", "prune")
        assert again.returncode == 0, again.stderr
        assert "pruned 0 ended record(s) and 0 wire log(s)" in again.stdout
