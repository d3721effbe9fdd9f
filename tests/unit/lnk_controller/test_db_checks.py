"""The controller's database is checked when opened: a 0-byte file is not taken for a new one,
and a file with damaged pages is refused, each naming the file and how to restore or start
fresh; a sound database still opens."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from lnk_controller import db
from lnk_shared.errors import StateError

ROWS = 400  # enough rows to fill several pages, so a damaged page is one of the table's


def _made(path: Path) -> None:
    engine = db.open_database(path)
    with db.begin_write(engine) as conn:
        conn.execute(
            text(
                "INSERT INTO remembered_specs (owner_uid, spec_key, grants_hash, grants_json,"
                " approved_at) VALUES (:n, :key, :h, :j, '2026-12-01 00:00:00')"
            ),
            [{"n": n, "key": f"/spec/{n}", "h": "0" * 64, "j": "x" * 200} for n in range(ROWS)],
        )
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    engine.dispose()


def test_a_zero_byte_database_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "state" / "controller.db"
    path.parent.mkdir(mode=0o700)
    path.touch(mode=0o600)
    with pytest.raises(StateError) as caught:
        db.open_database(path)
    message = str(caught.value)
    assert str(path) in message and "0 bytes" in message
    assert "restore" in message and "move it aside" in message
    assert path.stat().st_size == 0  # nothing was written over it


def test_a_database_with_damaged_pages_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "state" / "controller.db"
    _made(path)
    with open(path, "r+b") as f:  # the header stays; the pages after the schema's do not
        size = f.seek(0, 2)
        page = 4096
        for offset in range(2 * page, size, 3 * page):
            f.seek(offset)
            f.write(b"\xa5" * page)
    with pytest.raises(StateError) as caught:
        db.open_database(path)
    message = str(caught.value)
    assert str(path) in message and ("damaged" in message or "malformed" in message)
    assert "restore" in message


def test_a_sound_database_opens_again(tmp_path: Path) -> None:
    path = tmp_path / "state" / "controller.db"
    _made(path)
    engine = db.open_database(path)
    with engine.connect() as conn:
        count = conn.execute(text("SELECT count(*) FROM remembered_specs")).scalar_one()
    engine.dispose()
    assert count == ROWS
