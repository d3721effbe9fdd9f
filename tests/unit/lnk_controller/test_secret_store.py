"""lnk_controller.secret_store: each owner's secrets on real SQLite, sealed under the box key."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, update

from lnk_controller import db
from lnk_controller.models import SecretRow
from lnk_controller.secret_store import (
    KEY_BYTES,
    MAX_SECRETS_PER_OWNER,
    SecretStore,
    load_box_key,
)
from lnk_shared.errors import StateError, UsageError

VALUE = b"1234567890:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
ADA, BOB = 1501, 1502


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = db.open_database(tmp_path / "state" / "controller.db")
    yield engine
    engine.dispose()


@pytest.fixture
def store(engine: Engine, tmp_path: Path) -> SecretStore:
    return SecretStore(engine, load_box_key(tmp_path / "secrets.key"))


def _database_bytes(engine: Engine) -> bytes:
    path = db.database_path(engine)
    return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())


def test_a_secret_is_kept_revealed_listed_and_removed(store: SecretStore) -> None:
    assert store.set(ADA, "telegram-bot", VALUE) is True
    assert store.reveal(ADA, "telegram-bot") == VALUE
    assert [s.name for s in store.list_for(ADA)] == ["telegram-bot"]
    assert store.set(ADA, "telegram-bot", b"replaced-value") is False
    assert store.reveal(ADA, "telegram-bot") == b"replaced-value"
    assert store.remove(ADA, "telegram-bot") is True
    assert store.remove(ADA, "telegram-bot") is False
    assert store.list_for(ADA) == []


def test_the_database_holds_no_value(store: SecretStore, engine: Engine) -> None:
    store.set(ADA, "telegram-bot", VALUE)
    assert VALUE not in _database_bytes(engine)
    assert VALUE[-20:] not in _database_bytes(engine)


def test_another_owner_neither_sees_nor_opens_it(store: SecretStore) -> None:
    store.set(ADA, "telegram-bot", VALUE)
    assert store.list_for(BOB) == []
    with pytest.raises(StateError, match="keeps no secret"):
        store.reveal(BOB, "telegram-bot")
    assert store.remove(BOB, "telegram-bot") is False
    assert store.reveal(ADA, "telegram-bot") == VALUE


@pytest.mark.parametrize("moved", [{"owner_uid": BOB}, {"name": "other"}])
def test_a_sealed_value_moved_to_another_row_does_not_open(
    store: SecretStore, engine: Engine, moved: dict[str, object]
) -> None:
    """An attacker with write access to the database (not the key) moves ada's sealed value
    to bob's row, or renames it: the tag binds owner and name, so it does not open."""
    store.set(ADA, "telegram-bot", VALUE)
    with db.begin_write(engine) as conn:
        conn.execute(update(SecretRow).values(**moved))
    owner = int(moved.get("owner_uid", ADA))  # type: ignore[call-overload]
    name = str(moved.get("name", "telegram-bot"))
    with pytest.raises(StateError, match="does not open") as raised:
        store.reveal(owner, name)
    assert VALUE.decode() not in str(raised.value)


def test_another_box_key_does_not_open_it(engine: Engine, tmp_path: Path) -> None:
    SecretStore(engine, load_box_key(tmp_path / "a.key")).set(ADA, "k", VALUE)
    other = SecretStore(engine, load_box_key(tmp_path / "b.key"))
    with pytest.raises(StateError, match="does not open"):
        other.reveal(ADA, "k")


def test_a_recycled_account_forgets_every_secret(store: SecretStore) -> None:
    store.set(ADA, "a", VALUE)
    store.set(ADA, "b", VALUE)
    store.set(BOB, "a", VALUE)
    assert store.forget_all(ADA) == 2
    assert store.list_for(ADA) == []
    assert store.reveal(BOB, "a") == VALUE


def test_bad_names_and_values_are_refused_before_anything_is_kept(store: SecretStore) -> None:
    with pytest.raises(UsageError):
        store.set(ADA, "bad name", VALUE)
    with pytest.raises(UsageError) as raised:
        store.set(ADA, "ok", b"two\r\nlines")
    assert b"two" not in str(raised.value).encode()
    assert store.list_for(ADA) == []


def test_an_owner_keeps_at_most_the_limit(store: SecretStore) -> None:
    for i in range(MAX_SECRETS_PER_OWNER):
        store.set(ADA, f"s{i}", b"v")
    with pytest.raises(StateError, match="the most there may be"):
        store.set(ADA, "one-more", b"v")
    store.set(ADA, "s0", b"replacing-is-fine")
    store.set(BOB, "s0", b"another-owner-has-its-own-count")


def test_the_box_key_is_made_once_owner_only(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        key = load_box_key(tmp_path / "secrets.key")
    finally:
        os.umask(old)
    assert len(key) == KEY_BYTES
    assert (tmp_path / "secrets.key").stat().st_mode & 0o777 == 0o600
    assert load_box_key(tmp_path / "secrets.key") == key


def test_a_box_key_others_may_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secrets.key"
    load_box_key(path)
    path.chmod(0o640)
    with pytest.raises(StateError, match="others may read it"):
        load_box_key(path)


def test_a_linked_box_key_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "planted.key"
    target.write_bytes(b"k" * KEY_BYTES)
    target.chmod(0o600)
    (tmp_path / "secrets.key").symlink_to(target)
    with pytest.raises(StateError, match="link"):
        load_box_key(tmp_path / "secrets.key")


def test_a_box_key_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secrets.key"
    path.write_bytes(b"short")
    path.chmod(0o600)
    with pytest.raises(StateError, match="holds 5 bytes"):
        load_box_key(path)
