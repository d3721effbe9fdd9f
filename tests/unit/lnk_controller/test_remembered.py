"""lnk_controller.remembered: the store of approved specs, on real SQLite files."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import Engine

from lnk_controller import db
from lnk_controller.remembered import (
    MAX_FLAG_APPROVALS,
    MAX_SPEC_KEY_CHARS,
    MAX_UID,
    Remembered,
    RememberedSpecs,
    flags_key,
)
from lnk_shared.errors import StateError

HASH_A = "a" * 64
HASH_B = "0123456789abcdef" * 4
GRANTS_A = '{"read":["/home/ada/project"]}'
GRANTS_B = '{"read":["/home/ada/project"],"write":["/home/ada/project/out"]}'
SPEC = "/home/ada/project/lnk.toml"


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "controller.db"


@pytest.fixture
def engine(db_path: Path) -> Iterator[Engine]:
    engine = db.open_database(db_path)
    yield engine
    engine.dispose()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(engine: Engine, clock: FakeClock) -> RememberedSpecs:
    return RememberedSpecs(engine, clock=clock)


def test_nothing_is_remembered_at_first(store: RememberedSpecs) -> None:
    assert store.lookup(1000, SPEC) is None
    assert store.list_for(1000) == []


def test_remember_then_lookup(store: RememberedSpecs, clock: FakeClock) -> None:
    made = store.remember(1000, SPEC, HASH_A, GRANTS_A)
    expected = Remembered(
        owner_uid=1000,
        spec_key=SPEC,
        grants_hash=HASH_A,
        grants_json=GRANTS_A,
        approved_at=clock.now,
    )
    assert made == expected
    assert store.lookup(1000, SPEC) == expected


def test_approved_at_comes_back_aware_utc(store: RememberedSpecs, clock: FakeClock) -> None:
    clock.now = datetime(2025, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    store.remember(1000, SPEC, HASH_A, GRANTS_A)
    found = store.lookup(1000, SPEC)
    assert found is not None
    assert found.approved_at.tzinfo is UTC
    assert found.approved_at == datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def test_remember_again_replaces_hash_grants_and_time(
    store: RememberedSpecs, clock: FakeClock
) -> None:
    store.remember(1000, SPEC, HASH_A, GRANTS_A)
    clock.now += timedelta(days=1)
    replaced = store.remember(1000, SPEC, HASH_B, GRANTS_B)
    assert replaced.grants_hash == HASH_B
    assert replaced.grants_json == GRANTS_B
    assert replaced.approved_at == clock.now
    assert store.list_for(1000) == [replaced]
    assert store.lookup(1000, SPEC) == replaced


def test_a_pseudo_key_for_a_spec_given_by_flags(store: RememberedSpecs) -> None:
    store.remember(1000, "<flags>", HASH_A, GRANTS_A)
    found = store.lookup(1000, "<flags>")
    assert found is not None
    assert found.spec_key == "<flags>"


def test_owner_cannot_see_another_owners_spec(store: RememberedSpecs) -> None:
    store.remember(1001, SPEC, HASH_A, GRANTS_A)
    assert store.lookup(1000, SPEC) is None
    assert store.list_for(1000) == []
    assert [r.owner_uid for r in store.list_for(1001)] == [1001]


def test_owner_cannot_forget_another_owners_spec(store: RememberedSpecs) -> None:
    store.remember(1001, SPEC, HASH_A, GRANTS_A)
    assert store.forget(1000, SPEC) is False
    assert store.lookup(1001, SPEC) is not None


def test_owner_cannot_replace_another_owners_spec(store: RememberedSpecs) -> None:
    store.remember(1001, SPEC, HASH_A, GRANTS_A)
    store.remember(1000, SPEC, HASH_B, GRANTS_B)
    theirs = store.lookup(1001, SPEC)
    assert theirs is not None
    assert theirs.grants_hash == HASH_A


def test_forget(store: RememberedSpecs) -> None:
    store.remember(1000, SPEC, HASH_A, GRANTS_A)
    assert store.forget(1000, SPEC) is True
    assert store.lookup(1000, SPEC) is None
    assert store.forget(1000, SPEC) is False


def test_list_for_is_ordered_by_spec_key(store: RememberedSpecs) -> None:
    for key in ("/b/lnk.toml", "<flags>", "/a/lnk.toml"):
        store.remember(1000, key, HASH_A, GRANTS_A)
    assert [r.spec_key for r in store.list_for(1000)] == ["/a/lnk.toml", "/b/lnk.toml", "<flags>"]


def test_reopen_keeps_remembered_specs(db_path: Path, clock: FakeClock) -> None:
    engine = db.open_database(db_path)
    made = RememberedSpecs(engine, clock=clock).remember(1000, SPEC, HASH_A, GRANTS_A)
    engine.dispose()

    engine = db.open_database(db_path)
    try:
        assert RememberedSpecs(engine).lookup(1000, SPEC) == made
    finally:
        engine.dispose()


def test_concurrent_upserts_of_one_spec_leave_one_row(engine: Engine) -> None:
    store = RememberedSpecs(engine)
    errors: list[BaseException] = []

    def approve(n: int) -> None:
        try:
            for i in range(10):
                store.remember(1000, SPEC, f"{n:x}{i:x}".ljust(64, "0"), GRANTS_A)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=approve, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(store.list_for(1000)) == 1


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "grants_hash",
    [
        "",
        "a" * 63,
        "a" * 65,
        "A" * 64,
        "g" * 64,
        "a" * 63 + "\n",
        "a" * 64 + "\n",
        " " + "a" * 63,
        "\uff41" * 64,  # fullwidth "a"
        "\u0660" * 64,  # Arabic-Indic zero: a digit to \\d, not to [0-9]
    ],
)
def test_a_bad_grants_hash_is_refused(store: RememberedSpecs, grants_hash: str) -> None:
    with pytest.raises(ValueError, match="64 lowercase hex"):
        store.remember(1000, SPEC, grants_hash, GRANTS_A)


@pytest.mark.parametrize(
    ("spec_key", "why"),
    [
        ("", "empty"),
        ("/spec\x00.toml", "NUL"),
        ("/" + "a" * MAX_SPEC_KEY_CHARS, "characters long"),
    ],
)
def test_a_bad_spec_key_is_refused(store: RememberedSpecs, spec_key: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        store.remember(1000, spec_key, HASH_A, GRANTS_A)
    with pytest.raises(ValueError, match=why):
        store.lookup(1000, spec_key)
    with pytest.raises(ValueError, match=why):
        store.forget(1000, spec_key)


def test_the_longest_spec_key_is_accepted(store: RememberedSpecs) -> None:
    key = "/" + "a" * (MAX_SPEC_KEY_CHARS - 1)
    store.remember(1000, key, HASH_A, GRANTS_A)
    assert store.lookup(1000, key) is not None


@pytest.mark.parametrize("owner_uid", [-1, MAX_UID + 1, 2**63, True, "1000", 1000.0])
def test_a_bad_owner_uid_is_refused(store: RememberedSpecs, owner_uid: object) -> None:
    with pytest.raises(ValueError, match="owner_uid"):
        store.remember(owner_uid, SPEC, HASH_A, GRANTS_A)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="owner_uid"):
        store.list_for(owner_uid)  # type: ignore[arg-type]


@pytest.mark.parametrize("grants_json", ["", "{", "not json", "{'single': 'quotes'}"])
def test_grants_that_are_not_json_are_refused(store: RememberedSpecs, grants_json: str) -> None:
    with pytest.raises(ValueError, match="grants_json"):
        store.remember(1000, SPEC, HASH_A, grants_json)


def test_a_naive_clock_is_refused(engine: Engine) -> None:
    store = RememberedSpecs(engine, clock=lambda: datetime(2025, 1, 1))
    with pytest.raises(ValueError, match="naive"):
        store.remember(1000, SPEC, HASH_A, GRANTS_A)
    assert store.lookup(1000, SPEC) is None


# --- database failures ------------------------------------------------------------------------


def test_a_database_without_the_table_is_a_state_error(engine: Engine, db_path: Path) -> None:
    store = RememberedSpecs(engine)
    db.downgrade(engine, "base")
    for call in (
        lambda: store.lookup(1000, SPEC),
        lambda: store.remember(1000, SPEC, HASH_A, GRANTS_A),
        lambda: store.forget(1000, SPEC),
        lambda: store.list_for(1000),
    ):
        with pytest.raises(StateError) as raised:
            call()
        assert str(db_path) in str(raised.value)
        assert "[SQL:" not in str(raised.value)


# -- flag-only specs: remembered by what they open, several per owner ------------------------


def _hash(n: int) -> str:
    return f"{n:064x}"


def test_two_flag_sets_are_remembered_side_by_side(store: RememberedSpecs) -> None:
    store.remember(1000, flags_key(HASH_A), HASH_A, GRANTS_A)
    store.remember(1000, flags_key(HASH_B), HASH_B, GRANTS_B)
    a, b = store.lookup(1000, flags_key(HASH_A)), store.lookup(1000, flags_key(HASH_B))
    assert a is not None and a.grants_json == GRANTS_A
    assert b is not None and b.grants_json == GRANTS_B
    assert store.lookup(1001, flags_key(HASH_A)) is None  # another owner's are not these


def test_past_the_bound_the_oldest_flag_approval_is_forgotten(
    store: RememberedSpecs, clock: FakeClock
) -> None:
    store.remember(1000, SPEC, HASH_A, GRANTS_A)  # a spec file's approval is never evicted
    store.remember(1001, flags_key(_hash(999)), _hash(999), GRANTS_A)  # nor another owner's
    for n in range(MAX_FLAG_APPROVALS + 2):
        clock.now += timedelta(seconds=1)
        store.remember(1000, flags_key(_hash(n)), _hash(n), GRANTS_A)
    keys = {r.spec_key for r in store.list_for(1000)}
    assert flags_key(_hash(0)) not in keys and flags_key(_hash(1)) not in keys
    assert {flags_key(_hash(n)) for n in range(2, MAX_FLAG_APPROVALS + 2)} <= keys
    assert len(keys) == MAX_FLAG_APPROVALS + 1 and SPEC in keys
    assert store.lookup(1001, flags_key(_hash(999))) is not None


def test_approving_a_flag_set_again_makes_it_the_newest(
    store: RememberedSpecs, clock: FakeClock
) -> None:
    for n in range(MAX_FLAG_APPROVALS):
        clock.now += timedelta(seconds=1)
        store.remember(1000, flags_key(_hash(n)), _hash(n), GRANTS_A)
    clock.now += timedelta(seconds=1)
    store.remember(1000, flags_key(_hash(0)), _hash(0), GRANTS_A)  # again: now the newest
    clock.now += timedelta(seconds=1)
    store.remember(1000, flags_key(_hash(100)), _hash(100), GRANTS_A)
    assert store.lookup(1000, flags_key(_hash(0))) is not None
    assert store.lookup(1000, flags_key(_hash(1))) is None


def test_forget_flags_forgets_one_by_its_hash_or_every_one(store: RememberedSpecs) -> None:
    store.remember(1000, SPEC, HASH_A, GRANTS_A)
    store.remember(1000, "<flags>", HASH_A, GRANTS_A)  # one kept before several were
    store.remember(1000, flags_key(HASH_A), HASH_A, GRANTS_A)
    store.remember(1000, flags_key(HASH_B), HASH_B, GRANTS_B)
    store.remember(1001, flags_key(HASH_B), HASH_B, GRANTS_B)
    assert store.forget_flags(1000, "<flags>:" + HASH_B[:8]) == 1
    assert store.lookup(1000, flags_key(HASH_B)) is None
    assert store.lookup(1001, flags_key(HASH_B)) is not None  # another owner's stays
    assert store.forget_flags(1000, "<flags>") == 2
    assert [r.spec_key for r in store.list_for(1000)] == [SPEC]


@pytest.mark.parametrize(
    "which", ["<flags>:abc", "<flags>:" + "A" * 8, "<flags>:%%%%%%%%", "<flags>:_" * 8, "x"]
)
def test_forget_flags_of_another_form_is_refused(store: RememberedSpecs, which: str) -> None:
    store.remember(1000, flags_key(HASH_A), HASH_A, GRANTS_A)
    with pytest.raises(ValueError, match="hex digits"):
        store.forget_flags(1000, which)
    assert store.lookup(1000, flags_key(HASH_A)) is not None


def test_forget_flags_by_a_prefix_two_share_is_refused(store: RememberedSpecs) -> None:
    first, second = "abcdef01" + "0" * 56, "abcdef01" + "1" * 56
    store.remember(1000, flags_key(first), first, GRANTS_A)
    store.remember(1000, flags_key(second), second, GRANTS_A)
    with pytest.raises(ValueError, match="names 2 approvals"):
        store.forget_flags(1000, "<flags>:abcdef01")
    assert len(store.list_for(1000)) == 2
    assert store.forget_flags(1000, "<flags>:abcdef010") == 1
