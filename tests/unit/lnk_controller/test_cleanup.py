"""Clean-up from the record alone, on a real SQLite store and the real host: one that leaves
nothing marks the sandbox ended in a single write; one that cannot finish marks it `stopping`,
says what is left, and the next clean-up (once the cause is gone) ends it."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event

from lnk_controller.cleanup import clean_sandbox
from lnk_controller.config import ControllerConfig
from lnk_controller.db import open_database
from lnk_controller.models import SandboxRow
from lnk_controller.sandbox_store import SandboxStore
from lnk_shared.errors import StateError

pytestmark = pytest.mark.needs_root  # it edits /etc/passwd under its lock and scans /proc

# A uid no test and no box uses: clean-up looks for its processes and its passwd line.
UID = 2_099_000_000 + secrets.randbelow(999_000)


@pytest.fixture
def cfg(tmp_path: Path) -> ControllerConfig:
    cfg = ControllerConfig(
        run_dir=tmp_path / "run", state_dir=tmp_path / "state", config_dir=tmp_path
    )
    cfg.homes_dir.mkdir(parents=True, mode=0o711)
    cfg.homes_dir.chmod(0o711)
    return cfg


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = open_database(tmp_path / "c.db")
    yield engine
    engine.dispose()


@pytest.fixture
def updates(engine: Engine) -> list[str]:
    """Every UPDATE the store sends, as the database driver sees it."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE"):
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    return seen


def _record(store: SandboxStore, cfg: ControllerConfig) -> SandboxRow:
    row = store.create(
        owner_uid=1000,
        allocate=lambda taken: UID,
        host_name=lambda uid: f"lnk-sbx-{uid}",
        staging_root=cfg.staging_root,
        command=["/bin/true"],
        spec_hash="ab" * 32,
        lease=timedelta(hours=1),
    )
    Path(row.staging_dir).mkdir(parents=True)
    return row


def test_a_clean_up_that_leaves_nothing_ends_the_sandbox_in_one_write(
    engine: Engine, cfg: ControllerConfig, updates: list[str]
) -> None:
    store = SandboxStore(engine)
    row = _record(store, cfg)
    clean_sandbox(row.id, store, cfg, exit_status=3)
    ended = store.get(row.id)
    assert ended is not None
    assert (ended.state, ended.exit_status) == ("ended", 3)
    assert not Path(row.staging_dir).exists()
    assert len(updates) == 1


def test_a_clean_up_that_cannot_finish_leaves_it_stopping_then_a_retry_ends_it(
    engine: Engine, cfg: ControllerConfig
) -> None:
    store = SandboxStore(engine)
    row = _record(store, cfg)
    stray = Path(row.staging_dir) / "stray"
    stray.write_text("x")  # the staging folder cannot be removed while this is in it
    with pytest.raises(StateError, match=f"{row.id} is not fully cleaned.*{row.staging_dir}"):
        clean_sandbox(row.id, store, cfg)
    left = store.get(row.id)
    assert left is not None and left.state == "stopping"
    assert [r.id for r in store.find(live_only=True)] == [row.id]  # the next reconcile's

    stray.unlink()
    clean_sandbox(row.id, store, cfg)
    ended = store.get(row.id)
    assert ended is not None and ended.state == "ended"
    assert store.find(live_only=True) == []
