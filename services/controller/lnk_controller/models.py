"""The controller's database tables, as SQLAlchemy 2 typed declarative models.

These are database models only: nothing here is sent over the wire as is. The schema itself is
owned by the hand-written migrations in `lnk_controller/migrations/versions/`; these classes must
match them, and a test checks that they do.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import DateTime, Dialect, Integer, MetaData, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

__all__ = ["NAMING_CONVENTION", "Base", "RememberedSpec", "UTCDateTime"]


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

    `spec_key` is the spec file's absolute path, or a pseudo key such as "<flags>" for a spec
    given only by flags. `grants_json` is the canonical grants document that was approved, so a
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
