"""The controller's SQLite database: create it safely, configure every connection, migrate it.

`open_database(path)` is the only way in. It creates the directory (0700) and the file (0600)
if missing, refuses an existing file or directory that others could read or replace, gives each
connection WAL, foreign keys and a busy timeout, and upgrades the schema to the newest Alembic
revision inside one `BEGIN IMMEDIATE` transaction, so processes that open the same fresh file at
once take turns instead of racing. Every SQLAlchemy, sqlite3, Alembic and OS error on the way is
raised as `StateError`, naming the file and what to do; `database_errors` does the same for the
modules that query the database.

Transactions: every connection runs sqlite3 in autocommit mode and this module emits the BEGIN
itself (the SQLAlchemy recipe for pysqlite), so a transaction really starts where SQLAlchemy
says it does. `begin_write(engine)` starts one with `BEGIN IMMEDIATE`: use it for any transaction
that writes, so it takes the write lock before it reads (a deferred transaction that reads and
then writes can fail with "database is locked" without waiting).

Security limitations: this trusts the process's own uid and root. It does NOT protect the file
from root, does NOT encrypt it, and checks the directory only when opening: a directory whose
owner later changes its mode is not noticed.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import alembic.command
import alembic.util
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script.revision import RevisionError
from sqlalchemy import URL, Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc

from lnk_shared.errors import StateError

__all__ = [
    "BUSY_TIMEOUT_MS",
    "DB_DIR_MODE",
    "DB_FILE_MODE",
    "MIGRATIONS_DIR",
    "begin_write",
    "current_revision",
    "database_errors",
    "database_path",
    "downgrade",
    "open_database",
    "upgrade",
]

log = logging.getLogger(__name__)

# Long enough to wait out another process's migration or a burst of writes; short enough that a
# lock someone holds forever is reported instead of hanging the controller.
BUSY_TIMEOUT_MS = 30_000
# Owner only: the database says which specs each user approved.
DB_FILE_MODE = 0o600
DB_DIR_MODE = 0o700
# Files SQLite keeps next to the database in WAL mode; they hold the same data.
_SIDECAR_SUFFIXES = ("-wal", "-shm")

MIGRATIONS_DIR = Path(__file__).parent / "migrations"

_BEGIN_OPTION = "lnk_sqlite_begin"
_BEGIN_MODES = frozenset({"DEFERRED", "IMMEDIATE"})

# SQLite's primary result codes (the low byte of sqlite_errorcode), grouped by what to do.
_SQLITE_DAMAGED = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB
_SQLITE_UNWRITABLE = frozenset({3, 8, 10, 14, 23})  # PERM, READONLY, IOERR, CANTOPEN, AUTH
_SQLITE_BUSY = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED
_SQLITE_FULL = 13


def open_database(path: Path) -> Engine:
    """Open (creating if missing) the controller database at `path`, migrated to the newest schema.

    Safe for several processes to call at once on the same fresh path. Raises `StateError`.
    """
    _prepare_directory(path)
    created = _prepare_file(path)
    if not created:
        _refuse_empty(path)
    engine = _make_engine(path)
    try:
        with database_errors(path, "open"), engine.connect() as conn:
            # The first connection checks the file and switches it to WAL; quick_check reads
            # every page (milliseconds at the size retention keeps it), so a damaged file is
            # refused here, naming it, rather than failing every launch later.
            _quick_check(path, conn)
        upgrade(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade the schema to `revision` in one write transaction. Raises `StateError`."""
    _migrate(engine, "upgrade the schema of", alembic.command.upgrade, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Downgrade the schema to `revision` ("base" drops every table). Raises `StateError`.

    Loses the data of the tables it drops: for tests and for an operator undoing an upgrade.
    """
    _migrate(engine, "downgrade the schema of", alembic.command.downgrade, revision)


def _migrate(
    engine: Engine, doing: str, command: Callable[[Config, str], None], revision: str
) -> None:
    """Run an Alembic command in one `BEGIN IMMEDIATE` transaction, foreign keys off meanwhile.

    SQLite applies ON DELETE actions when a batch migration drops and recreates a referenced
    table, and `PRAGMA foreign_keys` cannot change inside a transaction: so it is turned off
    before BEGIN, the keys are checked with `PRAGMA foreign_key_check` before COMMIT, and it is
    turned on again before the connection goes back to the pool.
    """
    path = database_path(engine)
    with database_errors(path, doing), engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None, "a checked-out connection has a driver connection"
        raw.execute("PRAGMA foreign_keys = OFF")  # sqlite3 is in autocommit: outside any BEGIN
        try:
            with conn.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"}).begin():
                command(_alembic_config(conn), revision)
                broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
                if broken:
                    table, rowid, parent, _ = broken[0]
                    raise StateError(
                        f"cannot {doing} the controller database {path}: the migration to "
                        f"{revision} would leave {len(broken)} rows whose foreign keys point "
                        f"nowhere (first: {table} row {rowid} -> {parent}). Nothing was "
                        "changed; this is a bug in lnk box's migrations, please report it"
                    )
        finally:
            raw.execute("PRAGMA foreign_keys = ON")


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database is at, or None before the first migration."""
    with (
        database_errors(database_path(engine), "read the schema revision of"),
        engine.connect() as conn,
    ):
        return MigrationContext.configure(conn).get_current_revision()


def begin_write(engine: Engine) -> AbstractContextManager[Connection]:
    """A transaction that starts with `BEGIN IMMEDIATE`: commits on success, rolls back on error."""
    return engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"}).begin()


def database_path(engine: Engine) -> Path:
    database = engine.url.database
    if not database:
        raise ValueError(f"{engine.url!r} is not a file database")
    return Path(database)


@contextmanager
def database_errors(path: Path, doing: str) -> Iterator[None]:
    """Raise any database, migration or OS error inside as `StateError` naming `path`.

    `doing` completes "cannot {doing} the controller database {path}", e.g. "read".
    """
    try:
        yield
    except StateError:
        raise
    except (sa_exc.SQLAlchemyError, sqlite3.Error) as exc:
        raise StateError(_sqlite_message(path, doing, exc)) from exc
    except (alembic.util.CommandError, RevisionError) as exc:
        raise StateError(_alembic_message(path, doing, exc)) from exc
    except OSError as exc:
        raise StateError(_os_message(path, doing, exc)) from exc


def _prepare_directory(path: Path) -> None:
    directory = path.parent
    with database_errors(path, "create the directory of"):
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            directory.mkdir(mode=DB_DIR_MODE)
        except FileExistsError:
            pass
        else:
            directory.chmod(DB_DIR_MODE)  # mkdir's mode is filtered by the umask
            return
        st = directory.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise StateError(
            f"cannot create the controller database {path}: {directory} is not a directory. "
            "Remove it, or set a database path in another directory"
        )
    _check_owner_and_mode(directory, st, allowed_bits=0o755, others_may_own=True)


def _prepare_file(path: Path) -> bool:
    """Create the file if missing (whether it did), and check it and its sidecars."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    created = False
    with database_errors(path, "create"):
        try:
            fd = os.open(path, flags, DB_FILE_MODE)
        except FileExistsError:
            pass
        else:
            created = True
            try:
                os.fchmod(fd, DB_FILE_MODE)  # os.open's mode is filtered by the umask
            finally:
                os.close(fd)
            log.info("created the controller database %s", path)
    for candidate in (path, *(Path(f"{path}{suffix}") for suffix in _SIDECAR_SUFFIXES)):
        with database_errors(candidate, "check"):
            try:
                st = os.lstat(candidate)
            except FileNotFoundError:
                continue
        if not stat.S_ISREG(st.st_mode):
            raise StateError(
                f"the controller database {candidate} is not a regular file (a link, a directory "
                "or a device): remove it, or set the database path to a regular file"
            )
        _check_owner_and_mode(candidate, st, allowed_bits=DB_FILE_MODE, others_may_own=False)
    return created


def _restore_hint(path: Path) -> str:
    sidecars = " and ".join(f"{path.name}{suffix}" for suffix in _SIDECAR_SUFFIXES)
    return (
        f"Stop the box (`lnk box down`), then restore {path} from a backup, or move it aside "
        f"(with any {sidecars} next to it) to start with an empty database: approved specs, "
        "agents and sandbox history are then lost"
    )


# Another process that made the file just now writes its header within milliseconds: an
# empty file is looked at this long before it is refused.
EMPTY_GRACE_S = 2.0
_EMPTY_POLL_S = 0.01


def _refuse_empty(path: Path) -> None:
    """An existing 0-byte database is not taken as a new one: its approvals would be lost
    silently (a disk that filled, a copy cut short). A fresh database is made by this module,
    and only when no file is there (or by another process that made it this moment)."""
    wal = Path(f"{path}-wal")
    deadline = time.monotonic() + EMPTY_GRACE_S
    while True:
        with database_errors(path, "check"):
            size = os.stat(path, follow_symlinks=False).st_size
            wal_size = wal.stat().st_size if wal.exists() else 0
        if size or wal_size:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(_EMPTY_POLL_S)
    if size == 0 and wal_size == 0:
        raise StateError(
            f"the controller database {path} is empty (0 bytes), so its approvals, agents and "
            f"history are gone, and it is not taken for a new database. {_restore_hint(path)}"
        )


QUICK_CHECK_ERRORS = 5  # problems quick_check lists: the first few say enough


def _quick_check(path: Path, conn: Connection) -> None:
    rows = conn.exec_driver_sql(f"PRAGMA quick_check({QUICK_CHECK_ERRORS})")
    found = [" ".join(str(r[0]).split()) for r in rows]  # one line, for logs and errors
    if found != ["ok"]:
        raise StateError(
            f"the controller database {path} is damaged (SQLite's quick_check: "
            f"{'; '.join(found)}). {_restore_hint(path)}"
        )


def _check_owner_and_mode(
    path: Path, st: os.stat_result, *, allowed_bits: int, others_may_own: bool
) -> None:
    euid = os.geteuid()
    if st.st_uid != euid and not (others_may_own and st.st_uid == 0):
        raise StateError(
            f"the controller database path {path} is owned by uid {st.st_uid}, but the "
            f"controller runs as uid {euid}: chown it to uid {euid}"
        )
    extra = stat.S_IMODE(st.st_mode) & ~allowed_bits & 0o777
    if extra:
        raise StateError(
            f"the controller database path {path} has mode {stat.S_IMODE(st.st_mode):04o}, "
            f"which lets other users read or replace it: chmod {allowed_bits:o} {path}"
        )


def _make_engine(path: Path) -> Engine:
    engine = create_engine(URL.create("sqlite+pysqlite", database=str(path)))
    event.listen(engine, "connect", _on_connect)
    event.listen(engine, "begin", _on_begin)
    return engine


def _on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    # Autocommit at the sqlite3 level; _on_begin emits BEGIN where SQLAlchemy begins.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS:d}")
        cursor.execute("PRAGMA foreign_keys = ON")
        _switch_to_wal(cursor)
        # WAL with NORMAL: a commit reaches the OS at once (a controller crash loses nothing)
        # but is not fsynced until a checkpoint, so launches do not wait on the disk. A power
        # loss may drop the last records; reconcile then finds their users by name and cleans.
        cursor.execute("PRAGMA synchronous = NORMAL")
    finally:
        cursor.close()


def _switch_to_wal(cursor: sqlite3.Cursor) -> None:
    # Switching the journal takes an exclusive lock, and SQLite returns SQLITE_BUSY at once,
    # without calling the busy handler, when two fresh connections race for it: retry within
    # the same budget the busy handler would have had.
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            (mode,) = cursor.execute("PRAGMA journal_mode = WAL").fetchone()
            break
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF not in _SQLITE_BUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    if str(mode).lower() != "wal":
        raise sqlite3.OperationalError(f"cannot switch the journal to WAL (it stays {mode})")


def _on_begin(conn: Connection) -> None:
    mode = conn.get_execution_options().get(_BEGIN_OPTION, "DEFERRED")
    if mode not in _BEGIN_MODES:
        raise ValueError(f"{_BEGIN_OPTION} must be one of {sorted(_BEGIN_MODES)}, not {mode!r}")
    conn.exec_driver_sql(f"BEGIN {mode}")


def _alembic_config(conn: Connection) -> Config:
    config = Config()
    # configparser reads "%" as interpolation: escape it in the path.
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    config.attributes["connection"] = conn
    return config


def _sqlite_message(path: Path, doing: str, exc: Exception) -> str:
    orig = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
    detail = str(orig).strip() or type(orig).__name__
    code = getattr(orig, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    lowered = detail.lower()
    where = f"cannot {doing} the controller database {path} ({detail})"
    if primary in _SQLITE_DAMAGED or "not a database" in lowered or "malformed" in lowered:
        sidecars = " and ".join(f"{path.name}{suffix}" for suffix in _SIDECAR_SUFFIXES)
        return (
            f"{where}: the file is damaged or is not an SQLite database. Stop the controller, "
            f"move it aside (with any {sidecars} next to it) and start again to begin with an "
            "empty database, or restore it from a backup"
        )
    if primary in _SQLITE_BUSY or "locked" in lowered:
        return (
            f"{where}: another process holds it locked (waited up to "
            f"{BUSY_TIMEOUT_MS // 1000}s). Stop any other program using this file and try again"
        )
    if primary == _SQLITE_FULL or "full" in lowered:
        return f"{where}: the disk is full. Free space on {path.parent} and try again"
    if primary in _SQLITE_UNWRITABLE or "readonly" in lowered or "unable to open" in lowered:
        return (
            f"{where}: make {path.parent} and the files in it writable by uid {os.geteuid()}, "
            "which the controller runs as, or set a database path on a writable disk"
        )
    return f"{where}: check the file, or move it aside to start with an empty database"


def _alembic_message(path: Path, doing: str, exc: Exception) -> str:
    detail = str(exc).strip() or type(exc).__name__
    where = f"cannot {doing} the controller database {path} ({detail})"
    if "can't locate revision" in detail.lower():
        return (
            f"{where}: its schema was written by a newer lnk box. Run that version, or restore "
            "a backup made by this one"
        )
    return f"{where}: the installed migrations are broken; reinstall lnk box"


def _os_message(path: Path, doing: str, exc: OSError) -> str:
    detail = exc.strerror or str(exc)
    return (
        f"cannot {doing} the controller database {path} ({detail}): check that {path.parent} "
        f"is a directory writable by uid {os.geteuid()}, which the controller runs as, or set "
        "a database path on a writable disk"
    )
