"""Sandbox records: written before anything runs, read by the API, cleanup and reconcile.

The wire never sees a `SandboxRow`: `SandboxPublic` is what a caller is shown.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from sqlalchemy import (
    Engine,
    Select,
    Table,
    bindparam,
    delete,
    insert,
    literal_column,
    select,
    update,
)

from lnk_controller.db import begin_write, database_errors, database_path
from lnk_controller.models import SandboxRow

__all__ = [
    "ENDED",
    "LIVE",
    "LIVE_STATES",
    "LIVE_UIDS",
    "SandboxPublic",
    "SandboxStore",
    "find_query",
    "new_sandbox_id",
]

ID_BYTES = 6  # 12 hex digits: unguessable enough among one box's sandboxes, short to type
LIVE_STATES = ("starting", "running", "stopping")


def new_sandbox_id() -> str:
    return "sbx-" + secrets.token_hex(ID_BYTES)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class SandboxPublic:
    """What a caller may see of a sandbox. `command` (the argument vector it ran, which may
    hold whatever its owner typed) is its owner's to see only: None for any other viewer."""

    id: str
    owner_uid: int
    host_uid: int
    state: str
    paused: bool
    command: list[str] | None
    created_at: str
    lease_expires_at: str
    ended_at: str | None
    exit_status: int | None
    retrying: str | None = None  # why its clean-up failed and is being retried
    limits: str | None = None  # as set when it started
    limit_met: str | None = None  # the limit it reached, as its client was told
    # What the kernel denied it: a count and a few shown lines (its owner's to see only: the
    # paths it tried are its owner's business, as its command is).
    denials: dict[str, Any] | None = None

    @classmethod
    def of(cls, row: SandboxRow, *, viewer: int, retrying: str | None = None) -> SandboxPublic:
        return cls(
            id=row.id,
            owner_uid=row.owner_uid,
            host_uid=row.host_uid,
            state=row.state,
            paused=row.paused,
            command=json.loads(row.command_json) if viewer == row.owner_uid else None,
            created_at=row.created_at.isoformat(),
            lease_expires_at=row.lease_expires_at.isoformat(),
            ended_at=row.ended_at.isoformat() if row.ended_at else None,
            exit_status=row.exit_status,
            retrying=retrying,
            limits=row.limits,
            limit_met=row.limit_met,
            denials=json.loads(row.denials) if row.denials and viewer == row.owner_uid else None,
        )


# The launch path reads and writes its record several times per sandbox: these statements are
# built once, on the table (SQLAlchemy Core: no ORM unit of work), with the id as a parameter,
# so each call is one compiled-cache hit. An ORM round trip cost ~0.6 ms here, a launch ~10.
_TABLE = cast(Table, SandboxRow.__table__)
_BY_ID = _TABLE.c.id == bindparam("sandbox_id")
_GET = select(_TABLE).where(_BY_ID)
# "Not over", spelled as the partial indexes' WHERE (migration 0005): a literal, never a bound
# parameter or `IN (...)`, so SQLite sees that the query implies the index's WHERE and reads
# only the live rows however many ended ones there are. Equal to `state IN LIVE_STATES`.
LIVE = _TABLE.c.state != literal_column("'ended'")
ENDED = _TABLE.c.state == literal_column("'ended'")
_LIVE_UIDS = select(_TABLE.c.host_uid).where(LIVE)
_INSERT = insert(_TABLE)
_UPDATE = update(_TABLE).where(_BY_ID)
_MOUNTS = select(_TABLE.c.mounts_json).where(_BY_ID)


def find_query(*, owner_uid: int | None, live_only: bool) -> Select[Any]:
    """The records of one owner (or all), live ones only or all, oldest first."""
    query = select(_TABLE).order_by(_TABLE.c.created_at)
    if owner_uid is not None:
        query = query.where(_TABLE.c.owner_uid == owner_uid)
    if live_only:
        query = query.where(LIVE)
    return query


LIVE_UIDS = _LIVE_UIDS  # what a launch reads to pick a free uid


def _row(values: Mapping[Any, Any]) -> SandboxRow:
    return SandboxRow(**values)


def _nobody_told(*_: object) -> None:
    return None


class SandboxStore:
    """`lease_written` is told each lease's end once it is written (`create`, `extend_lease`):
    the lease reaper sleeps until the next end it knows of (lnk_controller.reap_wait).
    `ended` is told each sandbox's end once written (`mark_ended`): retention prunes when the
    ended records may exceed their count (lnk_controller.retention.PruneDue). `stopping` is told
    each clean-up that failed (`mark_stopping`): the reaper retries it, whoever ran it."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Callable[[], datetime] = _now,
        lease_written: Callable[[datetime], None] = _nobody_told,
        ended: Callable[[], None] = _nobody_told,
        stopping: Callable[[], None] = _nobody_told,
    ) -> None:
        self._engine = engine
        self._path: Path = database_path(engine)
        self._clock = clock
        self._lease_written = lease_written
        self._ended = ended
        self._stopping = stopping

    def create(
        self,
        *,
        owner_uid: int,
        allocate: Callable[[set[int]], int],
        host_name: Callable[[int], str],
        staging_root: Path,
        command: list[str],
        spec_hash: str,
        lease: timedelta,
        staged: tuple[str, ...] = (),
    ) -> SandboxRow:
        """Pick a free host uid and write the record, in one write transaction. `staged` names
        mounts to be made in the sandbox's staging folder, recorded with it (before they exist:
        clean-up passes over one never made)."""
        now = self._clock().astimezone(UTC)
        sandbox_id = new_sandbox_id()
        staging_dir = staging_root / sandbox_id
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            uid = allocate(set(conn.execute(_LIVE_UIDS).scalars()))
            values: dict[str, Any] = {
                "id": sandbox_id,
                "owner_uid": owner_uid,
                "host_uid": uid,
                "host_name": host_name(uid),
                "state": "starting",
                "paused": False,
                "stop_requested": False,
                "pid": None,
                "pid_start": None,
                "staging_dir": str(staging_dir),
                "mounts_json": json.dumps([str(staging_dir / name) for name in staged]),
                "command_json": json.dumps(command),
                "spec_hash": spec_hash,
                "created_at": now,
                "lease_expires_at": now + lease,
                "ended_at": None,
                "exit_status": None,
                "limits": None,
                "limit_met": None,
                "denials": None,
            }
            conn.execute(_INSERT, values)
        self._lease_written(values["lease_expires_at"])
        return _row(values)

    def get(self, sandbox_id: str) -> SandboxRow | None:
        with database_errors(self._path, "read"), self._engine.connect() as conn:
            found = conn.execute(_GET, {"sandbox_id": sandbox_id}).mappings().first()
        return None if found is None else _row(found)

    def find(self, *, owner_uid: int | None = None, live_only: bool = True) -> list[SandboxRow]:
        query = find_query(owner_uid=owner_uid, live_only=live_only)
        with database_errors(self._path, "read"), self._engine.connect() as conn:
            return [_row(found) for found in conn.execute(query).mappings()]

    def set(self, sandbox_id: str, **values: Any) -> None:
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            conn.execute(_UPDATE, {"sandbox_id": sandbox_id, **values})

    def add_mount(self, sandbox_id: str, target: str) -> None:
        """Record a staged mount (or placeholder) before making it, so a crash can undo it."""
        self.add_mounts(sandbox_id, [target])

    def add_mounts(self, sandbox_id: str, targets: list[str]) -> None:
        """Record several, in one transaction, before making any (clean-up passes over a
        recorded target that was never made)."""
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            raw = conn.execute(_MOUNTS, {"sandbox_id": sandbox_id}).scalar_one()
            mounts = json.loads(raw) + targets
            conn.execute(_UPDATE, {"sandbox_id": sandbox_id, "mounts_json": json.dumps(mounts)})

    def mark_stopping(self, sandbox_id: str) -> None:
        """Its clean-up failed (by a launch, the API's stop, a forgetting or the reaper): the
        reaper's to retry from now on."""
        self.set(sandbox_id, state="stopping")
        self._stopping()

    def mark_ended(self, sandbox_id: str, exit_status: int | None) -> None:
        self.set(sandbox_id, state="ended", ended_at=self._clock(), exit_status=exit_status)
        self._ended()

    def expired(self) -> list[SandboxRow]:
        now = self._clock()
        return [r for r in self.find() if r.lease_expires_at <= now]

    def extend_lease(self, sandbox_id: str, seconds: int) -> datetime:
        until = self._clock() + timedelta(seconds=seconds)
        self.set(sandbox_id, lease_expires_at=until)
        self._lease_written(until)
        return until

    def forget_ended(self, owner_uid: int) -> list[str]:
        """Delete the records of the owner's ended sandboxes (their commands with them); their
        ids. Live ones stay: they are cleaned first, and a record is what cleans them."""
        ended = (_TABLE.c.owner_uid == owner_uid) & ~_TABLE.c.state.in_(LIVE_STATES)
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            ids = list(conn.execute(select(_TABLE.c.id).where(ended)).scalars())
            conn.execute(delete(_TABLE).where(ended))
        return ids
