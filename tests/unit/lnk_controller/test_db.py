"""lnk_controller.db: real SQLite files, real migrations, real concurrent processes."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text

from lnk_controller import db
from lnk_controller.models import Base
from lnk_shared.errors import StateError

NOBODY = 65534

# The newest revision, read from the migrations themselves so a new migration needs no edit here.
HEAD = ScriptDirectory(str(db.MIGRATIONS_DIR)).get_current_head()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "controller.db"


@pytest.fixture
def engine(db_path: Path) -> Iterator[Engine]:
    engine = db.open_database(db_path)
    yield engine
    engine.dispose()


@pytest.fixture
def no_umask() -> Iterator[None]:
    old = os.umask(0)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _table_names(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names())


def _alembic_versions(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())


# --- creation and modes -----------------------------------------------------------------------


@pytest.mark.usefixtures("no_umask")
def test_fresh_database_is_owner_only_even_with_umask_zero(db_path: Path) -> None:
    engine = db.open_database(db_path)
    try:
        with db.begin_write(engine) as conn:
            conn.execute(text("CREATE TABLE scratch (x INTEGER)"))
        assert _mode(db_path.parent) == 0o700
        assert _mode(db_path) == 0o600
        for sidecar in ("-wal", "-shm"):
            assert _mode(Path(f"{db_path}{sidecar}")) == 0o600
    finally:
        engine.dispose()


def test_missing_ancestors_are_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "state" / "controller.db"
    db.open_database(path).dispose()
    assert path.is_file()
    assert _mode(path.parent) == 0o700


def test_existing_directory_mode_is_kept(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o750)
    directory.chmod(0o750)
    db.open_database(directory / "controller.db").dispose()
    assert _mode(directory) == 0o750


# --- schema -----------------------------------------------------------------------------------


def test_open_applies_migrations_to_head(engine: Engine) -> None:
    assert _alembic_versions(engine) == [HEAD]
    assert db.current_revision(engine) == HEAD
    assert "remembered_specs" in _table_names(engine)
    columns = {c["name"] for c in inspect(engine).get_columns("remembered_specs")}
    assert columns == {
        "id",
        "owner_uid",
        "spec_key",
        "grants_hash",
        "grants_json",
        "approved_at",
    }
    uniques = inspect(engine).get_unique_constraints("remembered_specs")
    assert [u["column_names"] for u in uniques] == [["owner_uid", "spec_key"]]


def test_models_match_the_migrations(engine: Engine) -> None:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_every_connection_has_wal_foreign_keys_and_busy_timeout(engine: Engine) -> None:
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == db.BUSY_TIMEOUT_MS


def test_downgrade_base_then_upgrade_head_round_trips(engine: Engine) -> None:
    db.downgrade(engine, "base")
    assert "remembered_specs" not in _table_names(engine)
    assert _alembic_versions(engine) == []
    assert db.current_revision(engine) is None

    db.upgrade(engine, "head")
    assert "remembered_specs" in _table_names(engine)
    assert _alembic_versions(engine) == [HEAD]
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_a_migration_that_breaks_foreign_keys_is_rolled_back(engine: Engine) -> None:
    def orphaning_migration(config: Config, revision: str) -> None:
        conn = config.attributes["connection"]
        conn.exec_driver_sql("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        conn.exec_driver_sql(
            "CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES parent(id))"
        )
        conn.exec_driver_sql("INSERT INTO child VALUES (1, 42)")

    with pytest.raises(StateError, match="foreign keys point nowhere"):
        db._migrate(engine, "upgrade the schema of", orphaning_migration, "head")
    assert {"parent", "child"}.isdisjoint(_table_names(engine))
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_reopen_keeps_data_and_does_not_migrate_again(db_path: Path) -> None:
    engine = db.open_database(db_path)
    with db.begin_write(engine) as conn:
        conn.execute(
            text(
                "INSERT INTO remembered_specs "
                "(owner_uid, spec_key, grants_hash, grants_json, approved_at) "
                "VALUES (1000, '/s.toml', :h, '{}', '2025-01-01 00:00:00.000000')"
            ),
            {"h": "0" * 64},
        )
    engine.dispose()

    engine = db.open_database(db_path)
    try:
        with engine.connect() as conn:
            count = conn.execute(text("SELECT count(*) FROM remembered_specs")).scalar()
        assert count == 1
        assert _alembic_versions(engine) == [HEAD]
    finally:
        engine.dispose()


def test_a_write_transaction_is_atomic(engine: Engine) -> None:
    with pytest.raises(RuntimeError), db.begin_write(engine) as conn:
        conn.execute(text("CREATE TABLE scratch (x INTEGER)"))
        raise RuntimeError("abort")
    assert "scratch" not in _table_names(engine)


# --- concurrency ------------------------------------------------------------------------------

_OPEN_AND_WRITE = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from lnk_controller.db import open_database
    from lnk_controller.remembered import RememberedSpecs

    sys.stdin.read(1)  # start together: the parent writes one byte to every child at once
    engine = open_database(Path(sys.argv[1]))
    RememberedSpecs(engine).remember(int(sys.argv[2]), "/spec.toml", "a" * 64, "{}")
    engine.dispose()
    """
)


def test_switching_to_wal_waits_for_a_writer_instead_of_failing_at_once(db_path: Path) -> None:
    # SQLite answers a journal switch with SQLITE_BUSY at once, busy handler or not, while
    # another connection holds a write lock on a rollback-journal file: the race two fresh
    # controllers (or a controller and `lnk`) run into when they create the database together.
    db_path.parent.mkdir(mode=0o700)
    writer = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    try:
        os.chmod(db_path, 0o600)
        writer.execute("CREATE TABLE held (i INTEGER)")
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT INTO held VALUES (1)")
        release = threading.Timer(0.3, writer.execute, ("COMMIT",))
        release.start()
        engine = db.open_database(db_path)
        release.join()
    finally:
        writer.close()
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("SELECT i FROM held").scalar() == 1
    finally:
        engine.dispose()


@pytest.mark.parametrize("attempt", range(5))
def test_two_processes_opening_a_fresh_database_at_once_both_succeed(
    tmp_path: Path, attempt: int
) -> None:
    path = tmp_path / "state" / "controller.db"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN_AND_WRITE, str(path), str(owner)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for owner in (1000, 1001)
    ]
    for child in children:
        assert child.stdin is not None
        child.stdin.write(b"g")
        child.stdin.flush()
    # Reap every child before judging any, so a failure leaves no process behind.
    errors = [child.communicate(timeout=120)[1] for child in children]
    for child, err in zip(children, errors, strict=True):
        assert child.returncode == 0, err.decode(errors="replace")

    engine = db.open_database(path)
    try:
        assert _alembic_versions(engine) == [HEAD]
        with engine.connect() as conn:
            owners = conn.execute(text("SELECT owner_uid FROM remembered_specs")).scalars()
            assert sorted(owners) == [1000, 1001]
    finally:
        engine.dispose()


# --- failures are StateError with a message a person can act on ------------------------------


def _assert_readable(message: str, path: Path) -> None:
    assert str(path) in message
    assert "\n" not in message
    assert "Traceback" not in message
    assert "[SQL:" not in message


def test_a_corrupt_database_file_is_a_state_error(db_path: Path) -> None:
    db_path.parent.mkdir(mode=0o700)
    db_path.write_bytes(b"this is not an SQLite database, only garbage\x00\xff\n" * 200)
    db_path.chmod(0o600)
    with pytest.raises(StateError) as raised:
        db.open_database(db_path)
    message = str(raised.value)
    _assert_readable(message, db_path)
    assert "damaged or is not an SQLite database" in message
    assert "move it aside" in message


def test_a_database_from_a_newer_lnk_box_is_a_state_error(db_path: Path) -> None:
    engine = db.open_database(db_path)
    with db.begin_write(engine) as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(StateError) as raised:
        db.open_database(db_path)
    _assert_readable(str(raised.value), db_path)
    assert "newer lnk box" in str(raised.value)


def test_a_parent_that_is_a_file_is_a_state_error(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the directory should be")
    path = blocker / "controller.db"
    with pytest.raises(StateError) as raised:
        db.open_database(path)
    _assert_readable(str(raised.value), path)


def test_a_database_path_that_is_a_directory_is_a_state_error(db_path: Path) -> None:
    db_path.mkdir(parents=True)
    with pytest.raises(StateError, match="not a regular file"):
        db.open_database(db_path)


def test_a_symlinked_database_file_is_refused(db_path: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.db"
    db.open_database(elsewhere).dispose()
    db_path.parent.mkdir(mode=0o700)
    db_path.symlink_to(elsewhere)
    with pytest.raises(StateError, match="not a regular file"):
        db.open_database(db_path)


def test_a_database_file_others_can_read_is_refused(db_path: Path) -> None:
    db.open_database(db_path).dispose()
    db_path.chmod(0o644)
    with pytest.raises(StateError, match=r"mode 0644.*chmod 600"):
        db.open_database(db_path)


def test_a_directory_others_can_write_is_refused(db_path: Path) -> None:
    db_path.parent.mkdir()
    db_path.parent.chmod(0o777)
    with pytest.raises(StateError, match="chmod 755"):
        db.open_database(db_path)


_OPEN_EXPECTING_STATE_ERROR = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from lnk_shared.errors import StateError
    from lnk_controller.db import open_database

    try:
        open_database(Path(sys.argv[1])).dispose()
    except StateError as exc:
        print(exc)
        sys.exit(0)
    print("opened a database in a directory it cannot write")
    sys.exit(1)
    """
)


@pytest.fixture
def unwritable_dir() -> Iterator[Path]:
    """A directory the test's user (or, as root, `nobody`) cannot write."""
    base = Path(tempfile.mkdtemp(prefix="lnk-db-"))
    try:
        base.chmod(0o755)
        directory = base / "state"
        directory.mkdir()
        directory.chmod(0o555 if os.geteuid() == 0 else 0o500)
        yield directory
    finally:
        directory.chmod(0o700)
        shutil.rmtree(base)


def test_an_unwritable_directory_is_a_state_error(unwritable_dir: Path) -> None:
    path = unwritable_dir / "controller.db"
    if os.geteuid() != 0:
        with pytest.raises(StateError) as raised:
            db.open_database(path)
        message = str(raised.value)
    else:
        # Root writes anywhere: show it from a process that runs as nobody instead.
        done = subprocess.run(
            [sys.executable, "-c", _OPEN_EXPECTING_STATE_ERROR, str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        message = done.stdout.strip()
    _assert_readable(message, path)
    assert "writable" in message


def _remember_row(engine: Engine, owner: int, key: str, digest: str, at: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO remembered_specs (owner_uid, spec_key, grants_hash, grants_json, "
                "approved_at) VALUES (:o, :k, :h, '{}', :t)"
            ),
            {"o": owner, "k": key, "h": digest, "t": at},
        )


def _keys(engine: Engine) -> set[tuple[int, str]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT owner_uid, spec_key FROM remembered_specs"))
        return {(int(r[0]), str(r[1])) for r in rows}


def test_migration_0009_keys_the_one_flag_approval_by_its_hash_and_back(engine: Engine) -> None:
    """What an owner approved by flags before several were kept stays approved after the
    upgrade; the downgrade keeps each owner's newest as the one `<flags>` row."""
    first, second, third = "a" * 64, "b" * 64, "c" * 64
    db.downgrade(engine, "0008")
    _remember_row(engine, 1000, "<flags>", first, "2026-12-01 10:00:00")
    _remember_row(engine, 1001, "<flags>", second, "2026-12-01 10:00:00")
    _remember_row(engine, 1000, "/home/ada/spec.toml", third, "2026-12-01 10:00:00")
    db.upgrade(engine, "0009")
    assert _keys(engine) == {
        (1000, f"<flags>:{first}"),
        (1001, f"<flags>:{second}"),
        (1000, "/home/ada/spec.toml"),
    }
    _remember_row(engine, 1000, f"<flags>:{third}", third, "2026-12-01 11:00:00")  # newer
    db.downgrade(engine, "0008")
    assert _keys(engine) == {(1000, "<flags>"), (1001, "<flags>"), (1000, "/home/ada/spec.toml")}
    with engine.connect() as conn:
        kept = conn.execute(
            text(
                "SELECT grants_hash FROM remembered_specs "
                "WHERE owner_uid = 1000 AND spec_key = '<flags>'"
            )
        ).scalar()
    assert kept == third
    db.upgrade(engine, "head")
    assert _alembic_versions(engine) == [HEAD]
