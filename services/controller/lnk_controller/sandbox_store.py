"""Sandbox records: written before anything runs, read by the API, cleanup and reconcile.

The wire never sees a `SandboxRow`: `SandboxPublic` is what a caller is shown.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.orm import Session

from lnk_controller.db import begin_write, database_errors, database_path
from lnk_controller.models import SandboxRow

__all__ = ["SandboxPublic", "SandboxStore", "new_sandbox_id"]

ID_BYTES = 6  # 12 hex digits: unguessable enough among one box's sandboxes, short to type
LIVE_STATES = ("starting", "running", "stopping")


def new_sandbox_id() -> str:
    return "sbx-" + secrets.token_hex(ID_BYTES)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class SandboxPublic:
    """What a caller may see of a sandbox."""

    id: str
    owner_uid: int
    host_uid: int
    state: str
    paused: bool
    command: list[str]
    created_at: str
    lease_expires_at: str
    ended_at: str | None
    exit_status: int | None

    @classmethod
    def of(cls, row: SandboxRow) -> SandboxPublic:
        return cls(
            id=row.id,
            owner_uid=row.owner_uid,
            host_uid=row.host_uid,
            state=row.state,
            paused=row.paused,
            command=json.loads(row.command_json),
            created_at=row.created_at.isoformat(),
            lease_expires_at=row.lease_expires_at.isoformat(),
            ended_at=row.ended_at.isoformat() if row.ended_at else None,
            exit_status=row.exit_status,
        )


class SandboxStore:
    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = _now) -> None:
        self._engine = engine
        self._path: Path = database_path(engine)
        self._clock = clock

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
    ) -> SandboxRow:
        """Pick a free host uid and write the record, in one write transaction."""
        now = self._clock()
        sandbox_id = new_sandbox_id()
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            taken = set(
                conn.execute(
                    select(SandboxRow.host_uid).where(SandboxRow.state.in_(LIVE_STATES))
                ).scalars()
            )
            uid = allocate(taken)
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
                "staging_dir": str(staging_root / sandbox_id),
                "mounts_json": "[]",
                "command_json": json.dumps(command),
                "spec_hash": spec_hash,
                "created_at": now,
                "lease_expires_at": now + lease,
                "ended_at": None,
                "exit_status": None,
            }
            conn.execute(insert(SandboxRow).values(**values))
        row = self.get(sandbox_id)
        assert row is not None
        return row

    def get(self, sandbox_id: str) -> SandboxRow | None:
        with database_errors(self._path, "read"), self._session() as session:
            return session.scalars(select(SandboxRow).where(SandboxRow.id == sandbox_id)).first()

    def _session(self) -> Session:
        return Session(self._engine, expire_on_commit=False)

    def find(self, *, owner_uid: int | None = None, live_only: bool = True) -> list[SandboxRow]:
        query = select(SandboxRow).order_by(SandboxRow.created_at)
        if owner_uid is not None:
            query = query.where(SandboxRow.owner_uid == owner_uid)
        if live_only:
            query = query.where(SandboxRow.state.in_(LIVE_STATES))
        with database_errors(self._path, "read"), self._session() as session:
            return list(session.scalars(query).all())

    def set(self, sandbox_id: str, **values: Any) -> None:
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            conn.execute(update(SandboxRow).where(SandboxRow.id == sandbox_id).values(**values))

    def add_mount(self, sandbox_id: str, target: str) -> None:
        """Record a staged mount (or placeholder) before making it, so a crash can undo it."""
        self.add_mounts(sandbox_id, [target])

    def add_mounts(self, sandbox_id: str, targets: list[str]) -> None:
        """Record several, in one transaction, before making any (clean-up passes over a
        recorded target that was never made)."""
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            raw = conn.execute(
                select(SandboxRow.mounts_json).where(SandboxRow.id == sandbox_id)
            ).scalar_one()
            mounts = json.loads(raw)
            mounts += targets
            conn.execute(
                update(SandboxRow)
                .where(SandboxRow.id == sandbox_id)
                .values(mounts_json=json.dumps(mounts))
            )

    def mark_ended(self, sandbox_id: str, exit_status: int | None) -> None:
        self.set(sandbox_id, state="ended", ended_at=self._clock(), exit_status=exit_status)

    def expired(self) -> list[SandboxRow]:
        now = self._clock()
        return [r for r in self.find() if r.lease_expires_at <= now]

    def extend_lease(self, sandbox_id: str, seconds: int) -> datetime:
        until = self._clock() + timedelta(seconds=seconds)
        self.set(sandbox_id, lease_expires_at=until)
        return until
