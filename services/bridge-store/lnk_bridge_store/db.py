"""The store's database: any SQLAlchemy URL, SQLite by default, migrated by Alembic at start.

For SQLite the file and its folder are created owner-only (0600 in 0700: the bridge's user;
no sandbox ever reaches them), every connection gets WAL, a busy timeout and
`synchronous = FULL` (an acknowledged append is on disk before the reply: a crash or a power
loss right after loses nothing acknowledged), and `write(engine)` starts its transaction with
`BEGIN IMMEDIATE` so a read-then-write never fails half-way on the lock. Errors of SQLAlchemy,
sqlite3 and Alembic become `StateError` naming the database and what to do.

Security limitations: this trusts the bridge's own uid and root with the database; it does NOT
encrypt it. A non-SQLite URL's credentials sit in the bridge's config, outside every sandbox.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import alembic.command
import alembic.util
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy import exc as sa_exc

from lnk_shared.errors import StateError

__all__ = ["BUSY_TIMEOUT_MS", "database_errors", "open_store", "write", "write_synced_later"]

BUSY_TIMEOUT_MS = 10_000  # the bridge is the only writer: a longer wait means a stuck peer
DB_DIR_MODE = 0o700
DB_FILE_MODE = 0o600
MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_BEGIN = "lnk_store_begin"


def open_store(url: str) -> Engine:
    """An engine on `url`, its schema upgraded to the newest revision. Raises `StateError`."""
    try:
        parsed = make_url(url)
    except sa_exc.ArgumentError:
        raise StateError(f"database_url {url!r} is not an SQLAlchemy URL") from None
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite:
        if not parsed.database or parsed.database == ":memory:":
            raise StateError("database_url: an SQLite store needs a file (sqlite:///PATH)")
        _prepare_file(Path(parsed.database))
    with database_errors(parsed.render_as_string(hide_password=True), "open"):
        engine = create_engine(parsed)
        if sqlite:
            event.listen(engine, "connect", _on_connect)
            event.listen(engine, "begin", _on_begin)
        try:
            with write(engine) as conn:
                config = Config()
                config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
                config.set_main_option("path_separator", "os")
                config.attributes["connection"] = conn
                alembic.command.upgrade(config, "head")
        except BaseException:
            engine.dispose()
            raise
    return engine


def write(engine: Engine) -> AbstractContextManager[Connection]:
    """A write transaction (`BEGIN IMMEDIATE` on SQLite): commits on success, else rolls back."""
    return engine.execution_options(**{_BEGIN: "IMMEDIATE"}).begin()


@contextmanager
def write_synced_later(engine: Engine) -> Iterator[Connection]:
    """A write transaction whose commit is not fsynced itself on SQLite (`synchronous =
    NORMAL` for it alone): it reaches the OS at once, so a crash of the bridge loses nothing,
    and the disk with the next synchronous commit (that fsync of the WAL covers every frame
    before it). A power loss may drop it. For the proofs' nonces: a signed call pays one
    fsync (its append's), not two."""
    with engine.connect() as conn:
        raw = conn.connection.driver_connection if engine.dialect.name == "sqlite" else None
        if raw is not None:
            raw.execute("PRAGMA synchronous = NORMAL")  # sqlite3 in autocommit: outside BEGIN
        try:
            with conn.execution_options(**{_BEGIN: "IMMEDIATE"}).begin():
                yield conn
        finally:
            if raw is not None:
                raw.execute("PRAGMA synchronous = FULL")


@contextmanager
def database_errors(where: str, doing: str) -> Iterator[None]:
    """Raise any database or migration error inside as `StateError` naming the store."""
    try:
        yield
    except StateError:
        raise
    except (sa_exc.SQLAlchemyError, sqlite3.Error, alembic.util.CommandError, OSError) as exc:
        detail = str(getattr(exc, "orig", None) or exc).strip() or type(exc).__name__
        raise StateError(
            f"cannot {doing} the store database {where} ({detail}): check that it is reachable "
            "and writable by the bridge's user, or move a damaged file aside"
        ) from exc


def _prepare_file(path: Path) -> None:
    with database_errors(str(path), "create"):
        path.parent.mkdir(mode=DB_DIR_MODE, parents=True, exist_ok=True)
        os.chmod(path.parent, DB_DIR_MODE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, DB_FILE_MODE)
        try:
            os.fchmod(fd, DB_FILE_MODE)
        finally:
            os.close(fd)


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # autocommit in sqlite3; _on_begin emits BEGIN
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS:d}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = FULL")
    finally:
        cursor.close()


def _on_begin(conn: Connection) -> None:
    mode = conn.get_execution_options().get(_BEGIN, "DEFERRED")
    conn.exec_driver_sql("BEGIN IMMEDIATE" if mode == "IMMEDIATE" else "BEGIN DEFERRED")
