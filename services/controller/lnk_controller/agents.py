"""The agents' registry and their keys.

An agent belongs to its owner (a host uid) and has a name unique for that owner; its id,
`u<owner uid>-<name>`, is unique on the box and is what its proofs name. At creation the
controller generates the agent's Ed25519 key pair (it never accepts a key from anyone): the
public key, checked by `lnk_shared.proofs.enroll_public_key`, goes into the registry; the
private key into `<state dir>/agent-keys/<agent id>.pem`, mode 0600 in a 0700 folder, both
root's. It never appears in a reply, an argv, an environment or a log; a sandbox of that agent
gets a copy readable only by its host uid (`lnk_controller.agent_launch`).

Security limitations: root reads every private key; this does NOT encrypt them at rest.
Removing an agent deletes its key file (unlink, not a secure erase).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy import exc as sa_exc

from lnk_controller.db import begin_write, database_errors, database_path
from lnk_controller.models import AgentRow
from lnk_shared.errors import StateError, UsageError
from lnk_shared.proofs import AGENT_ID, enroll_public_key

__all__ = ["AGENT_NAME", "AgentPublic", "AgentRegistry", "agent_id_of"]

AGENT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")  # a folder name under ~/Link/Agents too
# Names an inbox message shows as its sender for someone else: no agent may take them.
RESERVED_NAMES = frozenset({"owner"})
KEY_DIR_MODE = 0o700
KEY_FILE_MODE = 0o600


def agent_id_of(owner_uid: int, name: str) -> str:
    agent_id = f"u{owner_uid}-{name}"
    assert AGENT_ID.fullmatch(agent_id), "owner uids and names make valid agent ids"
    return agent_id


@dataclass(frozen=True)
class AgentPublic:
    """What the API says of an agent: never its private key."""

    agent_id: str
    name: str
    owner_uid: int
    public_key: str
    spec: str
    spec_hash: str
    running: bool
    host_uid: int | None
    created_at: str

    @classmethod
    def of(cls, row: AgentRow) -> AgentPublic:
        return cls(
            agent_id=row.agent_id,
            name=row.name,
            owner_uid=row.owner_uid,
            public_key=row.public_key,
            spec=row.spec_path,
            spec_hash=row.spec_hash,
            running=row.host_uid is not None,
            host_uid=row.host_uid,
            created_at=row.created_at.isoformat(),
        )


class AgentRegistry:
    def __init__(
        self, engine: Engine, key_dir: Path, *, clock: Callable[[], datetime] | None = None
    ) -> None:
        self._engine = engine
        self._path = database_path(engine)
        self.key_dir = key_dir
        self._clock = clock or (lambda: datetime.now(UTC))

    def create(self, owner_uid: int, name: str, spec_path: str) -> AgentPublic:
        """Register a new agent with a fresh key pair; `UsageError` for a bad or taken name."""
        if not AGENT_NAME.fullmatch(name):
            raise UsageError(
                f"agent name {name!r}: use 1 to 40 lowercase letters, digits and '-', "
                "starting with a letter or digit"
            )
        if name in RESERVED_NAMES:
            raise UsageError(
                f"agent name {name!r} is reserved: its messages would read as the owner's"
            )
        if not spec_path.startswith("/") or "\x00" in spec_path or len(spec_path) > 4096:
            raise UsageError("the agent's spec must be an absolute path")
        agent_id = agent_id_of(owner_uid, name)
        key = Ed25519PrivateKey.generate()
        raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        enroll_public_key(raw)  # a generated key always passes; checked like any other
        row = AgentRow(
            agent_id=agent_id,
            owner_uid=owner_uid,
            name=name,
            public_key=base64.b64encode(raw).decode(),
            spec_path=spec_path,
            spec_hash="",
            host_uid=None,
            created_at=self._clock(),
        )
        try:  # the row first: a taken name stops here, before any key file is touched
            with database_errors(self._path, "write"), begin_write(self._engine) as conn:
                conn.execute(insert(AgentRow).values(**_columns(row)))
        except StateError as exc:
            if isinstance(exc.__cause__, sa_exc.IntegrityError):
                raise UsageError(f"you already have an agent named {name!r}") from None
            raise
        try:
            self._write_key(agent_id, key)
        except BaseException:
            with database_errors(self._path, "write"), begin_write(self._engine) as conn:
                conn.execute(delete(AgentRow).where(AgentRow.agent_id == agent_id))
            raise
        return AgentPublic.of(row)

    def find(self, owner_uid: int | None) -> list[AgentPublic]:
        """The owner's agents (every agent for None), by name."""
        query = select(AgentRow).order_by(AgentRow.owner_uid, AgentRow.name)
        if owner_uid is not None:
            query = query.where(AgentRow.owner_uid == owner_uid)
        with database_errors(self._path, "read"), self._engine.connect() as conn:
            rows = conn.execute(query).all()
        return [AgentPublic.of(AgentRow(**row._mapping)) for row in rows]

    def get(self, owner_uid: int, name: str) -> AgentPublic | None:
        if not AGENT_NAME.fullmatch(name):
            return None
        found = [a for a in self.find(owner_uid) if a.name == name]
        return found[0] if found else None

    def remove(self, owner_uid: int, name: str) -> None:
        """Forget the agent and delete its key; refused while it runs."""
        agent = self.get(owner_uid, name)
        if agent is None:
            raise UsageError(f"you have no agent named {name!r}")
        if agent.running:
            raise UsageError(f"agent {name!r} is running: `lnk agent stop {name}` first")
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            conn.execute(delete(AgentRow).where(AgentRow.agent_id == agent.agent_id))
        self._remove_key(agent.agent_id)

    def forget_all(self, owner_uid: int) -> list[str]:
        """Forget every agent of the owner and delete their keys, running or not (the account
        is gone: `lnk_controller.accounts`); their ids."""
        ids = [a.agent_id for a in self.find(owner_uid)]
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            conn.execute(delete(AgentRow).where(AgentRow.owner_uid == owner_uid))
        for agent_id in ids:
            self._remove_key(agent_id)
        return ids

    def set_running(self, agent_id: str, host_uid: int | None, spec_hash: str = "") -> None:
        values: dict[str, object] = {"host_uid": host_uid}
        if spec_hash:
            values["spec_hash"] = spec_hash
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            conn.execute(update(AgentRow).where(AgentRow.agent_id == agent_id).values(**values))

    def stopped(self, host_uid: int) -> None:
        """The sandbox of uid `host_uid` is over: no agent runs as it any more."""
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            conn.execute(
                update(AgentRow).where(AgentRow.host_uid == host_uid).values(host_uid=None)
            )

    def stopped_if_set(self, owner_uid: int, name: str) -> None:
        """Forget a stale host uid (its sandbox was cleaned away by a lease or a restart)."""
        agent = self.get(owner_uid, name)
        if agent is not None and agent.host_uid is not None:
            self.set_running(agent.agent_id, None)

    def key_file(self, agent_id: str) -> Path:
        return self.key_dir / f"{agent_id}.pem"

    def _write_key(self, agent_id: str, key: Ed25519PrivateKey) -> None:
        pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        try:
            self.key_dir.mkdir(mode=KEY_DIR_MODE, parents=True, exist_ok=True)
            os.chmod(self.key_dir, KEY_DIR_MODE)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self.key_file(agent_id), flags, KEY_FILE_MODE)
        except FileExistsError:
            raise StateError(
                f"{self.key_file(agent_id)} exists without an agent: remove it and try again"
            ) from None
        except OSError as exc:
            raise StateError(f"cannot write the agent's key in {self.key_dir}: {exc}") from None
        try:
            os.fchmod(fd, KEY_FILE_MODE)
            os.write(fd, pem)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _remove_key(self, agent_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.key_file(agent_id).unlink()


def _columns(row: AgentRow) -> dict[str, object]:
    return {c.name: getattr(row, c.name) for c in AgentRow.__table__.columns}
