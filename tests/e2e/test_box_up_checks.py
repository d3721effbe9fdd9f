"""`lnk box up` checks the controller's database: a 0-byte file (a disk that filled, a copy cut
short) and a file with damaged pages are refused, naming the file and how to restore it or
start fresh, and the services this `box up` had started are stopped again."""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.needs_root

PAGE = 4096  # SQLite's default page size, the controller's


def _box_processes(run_dir: Path) -> list[int]:
    """Processes started for this box (their environment names its run folder)."""
    mark = f"LNK_RUN_DIR={run_dir}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if mark in environ:
            found.append(int(name))
    return found


def _refused(box: Any, database: Path) -> str:
    up = box.lnk("box", "up")
    assert up.returncode == 1, (up.stdout, up.stderr)
    assert str(database) in up.stderr
    assert "restore" in up.stderr and "Traceback" not in up.stderr
    assert _box_processes(box.run_dir) == [], "a failed box up left services running"
    assert not (box.run_dir / "proxy.pid").exists()
    return str(up.stderr)


def test_a_zero_byte_database_is_refused_at_box_up(private_box: Any) -> None:
    with private_box() as box:
        assert box.lnk("box", "down").returncode == 0
        database = box.state_dir / "controller.db"
        for sidecar in ("-wal", "-shm"):
            Path(f"{database}{sidecar}").unlink(missing_ok=True)
        os.truncate(database, 0)
        said = _refused(box, database)
        assert "0 bytes" in said
        assert database.stat().st_size == 0  # not taken for a new database


def test_a_database_with_damaged_pages_is_refused_at_box_up(private_box: Any) -> None:
    with private_box() as box:
        assert box.lnk("box", "down").returncode == 0
        database = box.state_dir / "controller.db"
        with closing(sqlite3.connect(database)) as db:  # every page into the file itself
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = database.stat().st_size
        assert size >= 4 * PAGE
        with open(database, "r+b") as f:  # the header page stays, the rest is overwritten
            for offset in range(PAGE, size, PAGE):
                if (offset // PAGE) % 2:
                    f.seek(offset)
                    f.write(b"\xa5" * PAGE)
        said = _refused(box, database)
        assert "damaged" in said
