"""Retention: ended sandboxes' records and their wire logs are pruned once they are older than
`ended_keep_days`, or beyond the newest `ended_keep_count`, so the database and the wire folder
stay the size of recent use, not of the box's whole history.

Pruned at the controller's start, every PRUNE_INTERVAL_S after, when the admin runs
`lnk box prune`, and as soon as more than `ended_keep_count` plus `prune_slack` ended records
may be kept (`PruneDue`: the store tells it each sandbox's end; before, a box with a small count
and many launches kept up to an hour's records past its count, ~3 KB each). Records go in
batches of PRUNE_BATCH, each its own short write transaction, so a launch never waits long
behind a prune; the wire log of each pruned record goes with it, and a wire log whose record is
gone (pruned before, or never written) goes too. Idempotent: a second prune with nothing new
to prune removes nothing.

The wire folder as a whole is kept under `wire_keep_bytes` (`trim_wire`, every
`WIRE_CHECK_S`): past it, the logs of the sandboxes that ended longest ago go first (their
records stay, saying the sandbox ended), until the folder is back under it. The proxy refuses
running sandboxes' new exchanges when the folder reaches its own bound (`lnk_proxy.wire_log`,
`wire_box_max_bytes`, set above this one), so a log is never cut, only removed whole once its
sandbox ended.

What the state folder holds besides (measured with bench/state_growth.py): SQLite's WAL, which
its auto-checkpoint (every 1000 pages) keeps near 4 MiB, filled by about 40 launches and then
reused from its start, not grown; `logs/`, the services' output under `lnk box up`, each log
rotated by size by its keeper (`lnk_admin.log_keeper`: `log_max_bytes`, `log_keep_count`; under
systemd the journal holds the output instead).

Does NOT: prune a live
sandbox's record or log (only `state = 'ended'`, whatever its age); keep a copy of what it
prunes (an admin who wants the history backs the database and the wire folder up); bound a live
sandbox's own wire log (the proxy caps it: lnk_proxy.wire_log).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

from sqlalchemy import Engine, Table, bindparam, delete, func, select

from lnk_controller.db import begin_write, database_errors, database_path
from lnk_controller.models import SandboxRow
from lnk_controller.sandbox_store import ENDED
from lnk_shared.errors import StateError

__all__ = [
    "PRUNE_BATCH",
    "PRUNE_INTERVAL_S",
    "PruneDue",
    "Pruned",
    "prune",
    "prune_every",
    "prune_slack",
    "trim_wire",
]

log = logging.getLogger(__name__)

PRUNE_INTERVAL_S = 3600.0  # an hour: history grows by at most an hour's sandboxes in between
PRUNE_BATCH = 2000  # records per write transaction: ~10 ms of lock, a launch barely waits
WIRE_CHECK_S = 10.0  # the wire folder's size is checked this often: a flood fills it in minutes
WIRE_SUFFIX = ".log"
# Ended records past ended_keep_count before a prune is due at once: at least this many, so a
# box at its count does not prune (read every ended id) at each sandbox's end ...
PRUNE_SLACK_MIN = 16
PRUNE_SLACK_SHARE = 8  # ... and an eighth of the count: 10,000 kept, a prune every 1,250 ends

_TABLE = cast(Table, SandboxRow.__table__)
_OLDEST_ENDED = (
    select(_TABLE.c.id, _TABLE.c.ended_at).where(ENDED).order_by(_TABLE.c.ended_at.desc())
)
_ENDED_FIRST = select(_TABLE.c.id).where(ENDED).order_by(_TABLE.c.ended_at.asc())
_DELETE = delete(_TABLE).where(ENDED, _TABLE.c.id.in_(bindparam("ids", expanding=True)))
_COUNT_ENDED = select(func.count()).select_from(_TABLE).where(ENDED)


def prune_slack(keep_count: int) -> int:
    """How many ended records past `keep_count` wait for the next prune at most."""
    return max(PRUNE_SLACK_MIN, keep_count // PRUNE_SLACK_SHARE)


class PruneDue:
    """Whether the ended records may exceed `keep_count` plus its slack: the count a prune left
    (`pruned`), plus each end since (`ended`, from the store's mark_ended, any thread). It
    counts over, never under: an end during a prune's count is counted twice, and a record
    pruned by `lnk box prune` or an owner's forgetting is not taken off (a prune that finds
    nothing to do then recounts)."""

    def __init__(self, keep_count: int) -> None:
        self._limit = keep_count + prune_slack(keep_count)
        self._guard = threading.Lock()
        self._ends = 0  # every end told, a running total
        self._kept = 0  # ended records now, at most (0 until the first prune counts them)
        self._due = threading.Event()

    def ended(self) -> None:
        with self._guard:
            self._ends += 1
            self._kept += 1
            if self._kept > self._limit:
                self._due.set()

    def mark(self) -> int:
        """Before a prune: the ends told so far (give it back to `pruned`)."""
        with self._guard:
            return self._ends

    def pruned(self, kept: int, mark: int) -> None:
        """A prune begun at `mark` left `kept` ended records (counted after it)."""
        with self._guard:
            self._kept = kept + (self._ends - mark)
            if self._kept > self._limit:
                self._due.set()
            else:
                self._due.clear()

    def wait(self, timeout: float) -> bool:
        """Whether a prune is due, waiting up to `timeout` for one."""
        return self._due.wait(timeout)

    def wake(self) -> None:
        """Wake the retention thread (to see its `stop`; else it prunes once more)."""
        self._due.set()


@dataclass(frozen=True)
class Pruned:
    records: int
    logs: int


def _due(engine: Engine, *, before: datetime, keep_count: int) -> list[str]:
    """The ids of the ended records to prune: ended before `before`, or past the newest
    `keep_count` (both read through the ended rows' partial index, newest first)."""
    with engine.connect() as conn:
        rows = conn.execute(_OLDEST_ENDED).all()
    return [row.id for n, row in enumerate(rows) if n >= keep_count or row.ended_at < before]


def prune(
    engine: Engine, wire_dir: Path, *, now: datetime, keep_days: int, keep_count: int
) -> Pruned:
    """Prune the ended records (and their wire logs) older than `keep_days` or past the newest
    `keep_count`, then every wire log whose record is gone. Raises StateError."""
    path = database_path(engine)
    with database_errors(path, "prune"):
        ids = _due(engine, before=now - timedelta(days=keep_days), keep_count=keep_count)
        records = 0
        for start in range(0, len(ids), PRUNE_BATCH):
            batch = ids[start : start + PRUNE_BATCH]
            with begin_write(engine) as conn:
                records += conn.execute(_DELETE, {"ids": batch}).rowcount
        with engine.connect() as conn:
            kept = set(conn.execute(select(_TABLE.c.id)).scalars())
    logs = _prune_wire(wire_dir, kept)
    return Pruned(records, logs)


def _prune_wire(wire_dir: Path, kept: set[str]) -> int:
    """Remove each `<id>.log` in `wire_dir` whose record is not in `kept`."""
    removed = 0
    try:
        names = os.listdir(wire_dir)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise StateError(f"cannot list the wire logs in {wire_dir}: {exc.strerror}") from exc
    for name in names:
        if not name.endswith(WIRE_SUFFIX) or name[: -len(WIRE_SUFFIX)] in kept:
            continue
        try:
            os.unlink(wire_dir / name)  # a link is removed, never followed
            removed += 1
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.error("retention: cannot remove the wire log %s: %s", wire_dir / name, exc)
    return removed


def _log_sizes(wire_dir: Path) -> dict[str, int]:
    """Each `<id>.log` regular file's size, by id (links are not followed)."""
    sizes: dict[str, int] = {}
    try:
        entries = list(os.scandir(wire_dir))
    except FileNotFoundError:
        return sizes
    except OSError as exc:
        raise StateError(f"cannot list the wire logs in {wire_dir}: {exc.strerror}") from exc
    for entry in entries:
        if not entry.name.endswith(WIRE_SUFFIX):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode):
            sizes[entry.name[: -len(WIRE_SUFFIX)]] = info.st_size
    return sizes


def trim_wire(engine: Engine, wire_dir: Path, keep_bytes: int) -> int:
    """Remove the logs of the sandboxes that ended longest ago until the wire folder holds at
    most `keep_bytes` (a live sandbox's log never); how many went. Raises StateError."""
    sizes = _log_sizes(wire_dir)
    total = sum(sizes.values())
    if total <= keep_bytes:
        return 0
    with database_errors(database_path(engine), "trim the wire logs"), engine.connect() as conn:
        ended = list(conn.execute(_ENDED_FIRST).scalars())
    removed = 0
    for sandbox_id in ended:
        if total <= keep_bytes:
            break
        size = sizes.get(sandbox_id)
        if size is None:
            continue
        try:
            os.unlink(wire_dir / f"{sandbox_id}{WIRE_SUFFIX}")  # a link is removed, never followed
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("retention: cannot remove the wire log of %s: %s", sandbox_id, exc)
            continue
        total -= size
        removed += 1
    if total > keep_bytes:
        log.warning(
            "retention: the wire logs hold %d bytes, over wire_keep_bytes (%d), with no ended "
            "sandbox's log left to remove: running sandboxes' logs are never cut",
            total,
            keep_bytes,
        )
    return removed


def prune_every(
    engine: Engine,
    wire_dir: Path,
    *,
    keep_days: int,
    keep_count: int,
    wire_keep_bytes: int | None = None,
    due: PruneDue | None = None,
) -> Callable[[threading.Event], None]:
    """The body of the retention thread (for `supervisor.supervise`): a prune now, then every
    PRUNE_INTERVAL_S, or sooner when `due` says so, until stopped, and the wire folder trimmed
    to `wire_keep_bytes` every WIRE_CHECK_S; a failed prune or trim is logged and tried again
    at the next. With `due`, `stop` is seen at `due.wake()`, else within WIRE_CHECK_S."""

    def body(stop: threading.Event) -> None:
        while True:
            failed = not _prune_once()
            next_prune = time.monotonic() + PRUNE_INTERVAL_S
            while time.monotonic() < next_prune:
                if wire_keep_bytes is not None:
                    _trim_once()
                timeout = min(WIRE_CHECK_S, max(0.0, next_prune - time.monotonic()))
                if due is None or failed:  # a failed prune is not tried again at once
                    failed = False
                    if stop.wait(timeout):
                        return
                    continue
                if stop.is_set():
                    return
                rung = due.wait(timeout)
                if stop.is_set():
                    return
                if rung:
                    break

    def _trim_once() -> None:
        assert wire_keep_bytes is not None
        try:
            removed = trim_wire(engine, wire_dir, wire_keep_bytes)
        except StateError as exc:
            log.error("retention: %s", exc)
        else:
            if removed:
                log.info("retention: removed %d ended sandbox(es)' wire log(s) for room", removed)

    def _prune_once() -> bool:
        mark = due.mark() if due is not None else 0
        try:
            done = prune(
                engine, wire_dir, now=datetime.now(UTC), keep_days=keep_days, keep_count=keep_count
            )
            if due is not None:
                what = "count the ended records"
                with database_errors(database_path(engine), what), engine.connect() as conn:
                    due.pruned(conn.execute(_COUNT_ENDED).scalar_one(), mark)
        except StateError as exc:
            log.error("retention: %s", exc)
            return False
        if done.records or done.logs:
            log.info("retention: pruned %d record(s), %d wire log(s)", *astuple(done))
        return True

    return body
