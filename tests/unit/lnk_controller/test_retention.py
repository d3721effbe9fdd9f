"""Retention on a real SQLite database: ended records (and their wire logs) pruned by age and by
count, live ones never, idempotent; 200,000 ended records pruned; and every query on a
launch's path or the reaper's served by a partial index on live rows only."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from lnk_controller import db
from lnk_controller.retention import (
    PruneDue,
    prune,
    prune_every,
    prune_slack,
    trim_wire,
)
from lnk_controller.sandbox_store import LIVE_UIDS, SandboxStore, find_query

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HISTORY = 200_000  # the issue's: a box after months of use
WAIT_S = 30.0  # generous: only a hang takes this long
_INSERT = text(
    "INSERT INTO sandboxes (id, owner_uid, host_uid, host_name, state, paused, stop_requested,"
    " staging_dir, mounts_json, command_json, spec_hash, created_at, lease_expires_at,"
    " ended_at, exit_status) VALUES (:id, :owner, :uid, 'lnk-x', :state, 0, 0, '/x', '[]',"
    " '[]', '', :at, :at, :ended, 0)"
)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = db.open_database(tmp_path / "state" / "controller.db")
    yield engine
    engine.dispose()


def _naive(at: datetime) -> str:
    return at.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ")


def _add(engine: Engine, rows: list[tuple[str, str, datetime | None]], owner: int = 1000) -> None:
    """Records (id, state, ended_at), each on a uid of its own."""
    with db.begin_write(engine) as conn:
        conn.execute(
            _INSERT,
            [
                {
                    "id": sandbox_id,
                    "owner": owner,
                    "uid": 2_000_000_000 + n,
                    "state": state,
                    "at": _naive(NOW - timedelta(days=400)),
                    "ended": _naive(ended) if ended else None,
                }
                for n, (sandbox_id, state, ended) in enumerate(rows)
            ],
        )


def _ids(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT id FROM sandboxes")).scalars())


def _logs(wire: Path, *ids: str) -> None:
    wire.mkdir(exist_ok=True)
    for sandbox_id in ids:
        (wire / f"{sandbox_id}.log").write_text("line\n")


def test_ended_records_older_than_the_age_are_pruned_with_their_logs(
    engine: Engine, tmp_path: Path
) -> None:
    wire = tmp_path / "wire"
    _add(
        engine,
        [
            ("sbx-old", "ended", NOW - timedelta(days=31)),
            ("sbx-recent", "ended", NOW - timedelta(days=29)),
            ("sbx-live", "running", None),  # created 400 days ago: live is never pruned
        ],
    )
    _logs(wire, "sbx-old", "sbx-recent", "sbx-live", "sbx-never-recorded")
    done = prune(engine, wire, now=NOW, keep_days=30, keep_count=100)
    assert (done.records, done.logs) == (1, 2)
    assert _ids(engine) == {"sbx-recent", "sbx-live"}
    assert sorted(os.listdir(wire)) == ["sbx-live.log", "sbx-recent.log"]
    again = prune(engine, wire, now=NOW, keep_days=30, keep_count=100)
    assert (again.records, again.logs) == (0, 0)


def test_only_the_newest_ended_records_past_the_count_are_kept(
    engine: Engine, tmp_path: Path
) -> None:
    rows = [(f"sbx-{n:03d}", "ended", NOW - timedelta(minutes=n)) for n in range(10)]
    _add(engine, [*rows, ("sbx-live", "stopping", None)])
    done = prune(engine, tmp_path / "wire", now=NOW, keep_days=30, keep_count=3)
    assert done.records == 7
    assert _ids(engine) == {"sbx-000", "sbx-001", "sbx-002", "sbx-live"}


def test_a_wire_log_that_is_a_link_is_removed_not_followed(engine: Engine, tmp_path: Path) -> None:
    wire = tmp_path / "wire"
    wire.mkdir()
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    (wire / "sbx-gone.log").symlink_to(target)
    assert prune(engine, wire, now=NOW, keep_days=30, keep_count=100).logs == 1
    assert not (wire / "sbx-gone.log").is_symlink()
    assert target.read_text() == "keep me\n"


def test_two_hundred_thousand_ended_records_are_pruned_by_age_and_count_idempotently(
    engine: Engine, tmp_path: Path
) -> None:
    rows = [
        (f"sbx-{n:06d}", "ended", NOW - timedelta(days=60) + timedelta(seconds=n))
        for n in range(HISTORY)
    ]
    rows[-500:] = [(i, s, NOW - timedelta(hours=1)) for i, s, _ in rows[-500:]]
    _add(engine, [*rows, ("sbx-live", "running", None)])
    by_age = prune(engine, tmp_path / "wire", now=NOW, keep_days=30, keep_count=HISTORY)
    assert by_age.records == HISTORY - 500
    by_count = prune(engine, tmp_path / "wire", now=NOW, keep_days=30, keep_count=100)
    assert by_count.records == 400
    assert len(_ids(engine)) == 101 and "sbx-live" in _ids(engine)
    assert prune(engine, tmp_path / "wire", now=NOW, keep_days=30, keep_count=100).records == 0


def _plan(engine: Engine, statement: object) -> list[str]:
    with engine.connect() as conn:
        compiled = statement.compile(conn)  # type: ignore[attr-defined]
        params = tuple(1000 for _ in compiled.positiontup or ())
        rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}", params).all()
    return [str(row[-1]) for row in rows]


@pytest.mark.parametrize(
    ("name", "statement"),
    [
        ("a launch's free uid", LIVE_UIDS),
        ("the reaper's and the agents' live rows", find_query(owner_uid=None, live_only=True)),
        ("an owner's live sandboxes", find_query(owner_uid=1000, live_only=True)),
    ],
)
def test_each_live_query_reads_a_partial_index_of_live_rows_only(
    engine: Engine, name: str, statement: object
) -> None:
    _add(engine, [(f"sbx-{n}", "ended", NOW) for n in range(50)] + [("sbx-live", "running", None)])
    with engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE")
    plan = _plan(engine, statement)
    assert plan and all("ix_sandboxes_live_" in step for step in plan), (name, plan)


def test_the_wire_folder_is_trimmed_oldest_ended_first_and_never_a_live_log(
    engine: Engine, tmp_path: Path
) -> None:
    """Past `keep_bytes`, the logs of the sandboxes that ended longest ago go first, their
    records stay; a running sandbox's log is never removed, even when it alone is over."""
    wire = tmp_path / "wire"
    wire.mkdir()
    _add(
        engine,
        [
            ("sbx-oldest", "ended", NOW - timedelta(days=3)),
            ("sbx-middle", "ended", NOW - timedelta(days=2)),
            ("sbx-newest", "ended", NOW - timedelta(days=1)),
            ("sbx-live", "running", None),
        ],
    )
    for sandbox_id in ("sbx-oldest", "sbx-middle", "sbx-newest", "sbx-live"):
        (wire / f"{sandbox_id}.log").write_bytes(b"x" * 1000)
    (wire / "notes.txt").write_bytes(b"y" * 5000)  # not a wire log: neither counted nor removed
    assert trim_wire(engine, wire, keep_bytes=4000) == 0  # at the bound: nothing goes
    assert trim_wire(engine, wire, keep_bytes=2500) == 2  # the two oldest ended ones
    assert sorted(p.name for p in wire.iterdir()) == ["notes.txt", "sbx-live.log", "sbx-newest.log"]
    assert trim_wire(engine, wire, keep_bytes=0) == 1  # the newest ended one; never the live
    assert sorted(p.name for p in wire.iterdir()) == ["notes.txt", "sbx-live.log"]
    assert _ids(engine) == {"sbx-oldest", "sbx-middle", "sbx-newest", "sbx-live"}  # records stay
    assert trim_wire(engine, tmp_path / "none", keep_bytes=0) == 0  # no folder yet


def test_a_link_in_the_wire_folder_is_removed_never_followed(
    engine: Engine, tmp_path: Path
) -> None:
    wire = tmp_path / "wire"
    wire.mkdir()
    precious = tmp_path / "precious"
    precious.write_bytes(b"z" * 10_000)
    _add(engine, [("sbx-a", "ended", NOW - timedelta(days=1))])
    (wire / "sbx-a.log").symlink_to(precious)  # its size does not count: nothing over
    assert trim_wire(engine, wire, keep_bytes=100) == 0
    assert precious.read_bytes() == b"z" * 10_000


def test_the_retention_thread_trims_the_wire_folder_too(engine: Engine, tmp_path: Path) -> None:
    wire = tmp_path / "wire"
    wire.mkdir()
    _add(engine, [("sbx-ended", "ended", datetime.now(UTC)), ("sbx-live", "running", None)])
    for sandbox_id in ("sbx-ended", "sbx-live"):
        (wire / f"{sandbox_id}.log").write_bytes(b"x" * 1000)
    stop = threading.Event()
    stop.set()  # one prune and one trim, then it returns
    prune_every(engine, wire, keep_days=30, keep_count=100, wire_keep_bytes=1500)(stop)
    assert sorted(p.name for p in wire.iterdir()) == ["sbx-live.log"]
    assert _ids(engine) == {"sbx-ended", "sbx-live"}  # its record is young: kept


def test_a_prune_is_due_once_the_ended_records_may_pass_the_count_and_its_slack() -> None:
    due = PruneDue(keep_count=10)
    limit = 10 + prune_slack(10)
    due.pruned(kept=10, mark=due.mark())
    for _ in range(limit - 10):
        due.ended()
    assert not due.wait(0.0)  # at the count plus its slack: not yet
    due.ended()
    assert due.wait(0.0)
    due.pruned(kept=10, mark=due.mark())
    assert not due.wait(0.0)


def test_an_end_during_a_prune_is_counted_not_lost() -> None:
    due = PruneDue(keep_count=0)
    mark = due.mark()
    for _ in range(prune_slack(0) + 1):
        due.ended()  # ends while the prune runs, after its count or before: counted
    due.pruned(kept=0, mark=mark)
    assert due.wait(0.0)


@pytest.mark.parametrize(("keep", "slack"), [(0, 16), (10, 16), (10_000, 1250)])
def test_the_slack_is_an_eighth_of_the_count_at_least_sixteen(keep: int, slack: int) -> None:
    assert prune_slack(keep) == slack


def test_a_box_with_a_small_count_keeps_it_between_the_hourly_prunes(
    engine: Engine, tmp_path: Path
) -> None:
    """The count bounds the records after any number of sandboxes' ends, not only at the
    hour's prune: before, 200 ends in an hour left 200 records with ended_keep_count = 10."""
    keep, ends = 10, 200
    due = PruneDue(keep)
    store = SandboxStore(engine, ended=due.ended)
    stop = threading.Event()
    body = prune_every(engine, tmp_path / "wire", keep_days=30, keep_count=keep, due=due)
    retention = threading.Thread(target=body, args=(stop,))
    retention.start()
    try:
        for n in range(ends):
            row = store.create(
                owner_uid=1000,
                allocate=lambda _taken, n=n: 2_000_000_000 + n,
                host_name=lambda uid: f"lnk-sbx-{uid}",
                staging_root=tmp_path,
                command=["/bin/true"],
                spec_hash="ab" * 32,
                lease=timedelta(hours=1),
            )
            store.mark_ended(row.id, 0)
        bound = keep + prune_slack(keep)
        deadline = time.monotonic() + WAIT_S  # a hang guard: the bound is the count
        while len(_ids(engine)) > bound and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(_ids(engine)) <= bound, f"{len(_ids(engine))} records kept for {keep}"
    finally:
        stop.set()
        due.wake()
        retention.join(WAIT_S)
    assert not retention.is_alive()
