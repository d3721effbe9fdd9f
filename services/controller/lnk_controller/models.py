"""The controller's database tables, as SQLAlchemy 2 typed declarative models.

These are database models only: nothing here is sent over the wire as is. The schema itself is
owned by the hand-written migrations in `lnk_controller/migrations/versions/`; these classes must
match them, and a test checks that they do.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

__all__ = [
    "NAMING_CONVENTION",
    "AccountRow",
    "AgentRow",
    "Base",
    "RememberedSpec",
    "SandboxRow",
    "SecretRow",
    "UTCDateTime",
]


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime, stored naive (SQLite has no timezones) and read back aware.

    A naive datetime is refused on the way in, so local time can never be stored by mistake.
    """

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                f"refusing to store a naive datetime ({value.isoformat()}): give a UTC one"
            )
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC)


# Named constraints, so a later batch migration on SQLite can find and drop them by name.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class RememberedSpec(Base):
    """A spec whose grants its owner approved, so an unchanged spec runs without asking again.

    `spec_key` is the spec file's absolute path, or for a spec given only by flags `<flags>:`
    and its grants' hash (migration 0009), one row per set of flags approved.
    `grants_json` is the canonical grants document that was approved, so a
    changed spec can show what changed; `grants_hash` is its 64-hex-digit hash.
    """

    __tablename__ = "remembered_specs"
    __table_args__ = (UniqueConstraint("owner_uid", "spec_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_uid: Mapped[int] = mapped_column(Integer, nullable=False)
    spec_key: Mapped[str] = mapped_column(String(4096), nullable=False)
    grants_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    grants_json: Mapped[str] = mapped_column(Text, nullable=False)
    approved_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class SandboxRow(Base):
    """One sandbox, written before anything of it runs, so a crash leaves a record to clean.

    `state`: starting -> running -> ended (`stopping` while being cleaned). `pid` and
    `pid_start` (the process's start time in clock ticks) together name the sandbox's bwrap
    process even after a pid is reused. `mounts_json` lists every staged mount and placeholder
    made for it, so cleanup can undo them after a crash.
    """

    __tablename__ = "sandboxes"
    __table_args__ = (
        Index(
            "ix_sandboxes_live_host_uid",
            "host_uid",
            unique=True,
            sqlite_where=text("state != 'ended'"),
        ),
        Index("ix_sandboxes_owner_uid", "owner_uid"),
        # Live rows only (migration 0005): the launch path's and the reaper's queries.
        Index("ix_sandboxes_live_created_at", "created_at", sqlite_where=text("state != 'ended'")),
        Index(
            "ix_sandboxes_live_owner_uid",
            "owner_uid",
            "created_at",
            sqlite_where=text("state != 'ended'"),
        ),
        Index("ix_sandboxes_ended_ended_at", "ended_at", sqlite_where=text("state = 'ended'")),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_uid: Mapped[int] = mapped_column(Integer, nullable=False)
    host_uid: Mapped[int] = mapped_column(Integer, nullable=False)
    host_name: Mapped[str] = mapped_column(String(32), nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    paused: Mapped[bool] = mapped_column(Boolean, nullable=False)
    stop_requested: Mapped[bool] = mapped_column(Boolean, nullable=False)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pid_start: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    staging_dir: Mapped[str] = mapped_column(String(4096), nullable=False)
    mounts_json: Mapped[str] = mapped_column(Text, nullable=False)
    command_json: Mapped[str] = mapped_column(Text, nullable=False)
    spec_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    lease_expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    exit_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Its limits as set ("512 processes, 1 GiB memory, ..."), and the one it met, if any.
    limits: Mapped[str | None] = mapped_column(Text, nullable=True)
    limit_met: Mapped[str | None] = mapped_column(Text, nullable=True)
    # What the kernel denied it (denials.py: {"count": N, "examples": [shown lines]}), if any.
    denials: Mapped[str | None] = mapped_column(Text, nullable=True)


class AgentRow(Base):
    """An agent: its owner's name for it, its public key (the private key is a root-only file,
    `lnk_controller.agents`), the host uid of its sandbox while one runs, its spec."""

    __tablename__ = "agents"
    __table_args__ = (UniqueConstraint("owner_uid", "name"),)

    agent_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner_uid: Mapped[int] = mapped_column(Integer, nullable=False)
    name: Mapped[str] = mapped_column(String(40), nullable=False)
    public_key: Mapped[str] = mapped_column(String(64), nullable=False)
    spec_path: Mapped[str] = mapped_column(String(4096), nullable=False)
    spec_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    host_uid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class AccountRow(Base):
    """The account a uid's records belong to (`lnk_controller.accounts`): its user name and its
    home folder's identity (device, inode, and the inode's generation, which a new folder that
    reuses a freed inode number does not share), recorded at first use and compared at each call.
    """

    __tablename__ = "accounts"

    uid: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(256), nullable=False)
    home: Mapped[str] = mapped_column(String(4096), nullable=False)
    home_dev: Mapped[int] = mapped_column(BigInteger, nullable=False)
    home_ino: Mapped[int] = mapped_column(BigInteger, nullable=False)
    home_generation: Mapped[int] = mapped_column(BigInteger, nullable=False)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class SecretRow(Base):
    """One secret of an owner (`lnk_controller.secrets`): its name, and its value sealed with
    the box's secret key (AES-256-GCM, bound to the owner and the name), never the value itself.
    """

    __tablename__ = "secrets"
    __table_args__ = (UniqueConstraint("owner_uid", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_uid: Mapped[int] = mapped_column(Integer, nullable=False)
    name: Mapped[str] = mapped_column(String(64), nullable=False)
    nonce: Mapped[bytes] = mapped_column(LargeBinary(), nullable=False)
    sealed: Mapped[bytes] = mapped_column(LargeBinary(), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
