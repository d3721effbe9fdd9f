"""Sandbox records in a real SQLite file: uid allocation against live rows, the database's own
guard against two live sandboxes on one host uid, leases on an injected clock, and a wire model
that cannot carry the controller's private columns."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from lnk_controller.db import open_database
from lnk_controller.models import SandboxRow
from lnk_controller.sandbox_store import SandboxPublic, SandboxStore
from lnk_shared.errors import StateError

FIRST_UID = 2_000_000_000
START = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
LEASE = timedelta(hours=1)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = open_database(tmp_path / "c.db")
    yield engine
    engine.dispose()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(engine: Engine, clock: Clock) -> SandboxStore:
    return SandboxStore(engine, clock=clock)


def lowest_free(seen: list[set[int]]) -> Callable[[set[int]], int]:
    def allocate(taken: set[int]) -> int:
        seen.append(set(taken))
        uid = FIRST_UID
        while uid in taken:
            uid += 1
        return uid

    return allocate


def always(uid: int) -> Callable[[set[int]], int]:
    return lambda taken: uid


def create(
    store: SandboxStore,
    allocate: Callable[[set[int]], int],
    *,
    owner_uid: int = 1000,
    lease: timedelta = LEASE,
    command: list[str] | None = None,
) -> SandboxRow:
    return store.create(
        owner_uid=owner_uid,
        allocate=allocate,
        host_name=lambda uid: f"lnk-sbx-{uid}",
        staging_root=Path("/run/lnk/sandboxes"),
        command=command or ["/usr/bin/python3", "-c", "print(1)"],
        spec_hash="ab" * 32,
        lease=lease,
    )


def test_new_record_is_starting_with_its_lease(store: SandboxStore) -> None:
    row = create(store, lowest_free([]))
    assert row.state == "starting"
    assert row.host_uid == FIRST_UID
    assert row.host_name == f"lnk-sbx-{FIRST_UID}"
    assert row.staging_dir == f"/run/lnk/sandboxes/{row.id}"
    assert json.loads(row.mounts_json) == []
    assert row.created_at == START
    assert row.lease_expires_at == START + LEASE
    assert store.get(row.id) is not None
    assert store.get("sbx-000000000000") is None


def test_the_row_create_returns_is_the_row_it_wrote(store: SandboxStore) -> None:
    """create builds its answer from what it wrote instead of reading it back: every column
    must still be what a read gives (types and timezones included)."""
    row = create(store, lowest_free([]))
    read = store.get(row.id)
    assert read is not None
    columns = [c.key for c in SandboxRow.__table__.columns]
    assert {k: getattr(row, k) for k in columns} == {k: getattr(read, k) for k in columns}
    assert read.created_at.tzinfo is not None


def test_staged_mounts_are_recorded_with_the_record(store: SandboxStore) -> None:
    row = store.create(
        owner_uid=1000,
        allocate=lowest_free([]),
        host_name=lambda uid: f"lnk-sbx-{uid}",
        staging_root=Path("/run/lnk/sandboxes"),
        command=["/bin/true"],
        spec_hash="ab" * 32,
        lease=LEASE,
        staged=("tmp", "home"),
    )
    expected = [f"/run/lnk/sandboxes/{row.id}/tmp", f"/run/lnk/sandboxes/{row.id}/home"]
    read = store.get(row.id)
    assert read is not None
    assert json.loads(read.mounts_json) == json.loads(row.mounts_json) == expected
    store.add_mount(row.id, f"/run/lnk/sandboxes/{row.id}/g0")  # later ones come after
    read = store.get(row.id)
    assert read is not None
    assert json.loads(read.mounts_json) == [*expected, f"/run/lnk/sandboxes/{row.id}/g0"]


def test_live_sandboxes_get_distinct_uids(store: SandboxStore) -> None:
    seen: list[set[int]] = []
    rows = [create(store, lowest_free(seen)) for _ in range(3)]
    assert [r.host_uid for r in rows] == [FIRST_UID, FIRST_UID + 1, FIRST_UID + 2]
    assert seen == [set(), {FIRST_UID}, {FIRST_UID, FIRST_UID + 1}]
    assert len({r.id for r in rows}) == 3


@pytest.mark.parametrize("state", ["starting", "running", "stopping"])
def test_every_live_state_holds_its_uid(store: SandboxStore, state: str) -> None:
    row = create(store, lowest_free([]))
    store.set(row.id, state=state)
    seen: list[set[int]] = []
    create(store, lowest_free(seen))
    assert seen == [{row.host_uid}]


def test_uid_of_an_ended_sandbox_can_be_reused(store: SandboxStore) -> None:
    first = create(store, lowest_free([]))
    store.mark_ended(first.id, 0)
    seen: list[set[int]] = []
    second = create(store, lowest_free(seen))
    assert seen == [set()]
    assert second.host_uid == first.host_uid


def test_database_refuses_two_live_sandboxes_on_one_uid(store: SandboxStore) -> None:
    create(store, always(FIRST_UID))
    with pytest.raises(StateError):
        create(store, always(FIRST_UID))  # an allocator that ignores `taken`
    assert len(store.find()) == 1


def test_database_allows_one_live_and_many_ended_on_one_uid(store: SandboxStore) -> None:
    for _ in range(3):
        store.mark_ended(create(store, always(FIRST_UID)).id, 0)
    live = create(store, always(FIRST_UID))
    assert [r.id for r in store.find()] == [live.id]
    assert len(store.find(live_only=False)) == 4


def test_reviving_an_ended_sandbox_whose_uid_was_reused_is_refused(store: SandboxStore) -> None:
    old = create(store, always(FIRST_UID))
    store.mark_ended(old.id, 0)
    create(store, always(FIRST_UID))
    with pytest.raises(StateError):
        store.set(old.id, state="running")


@pytest.mark.parametrize("exit_status", [0, 1, -9, None])
def test_mark_ended_records_when_and_how(
    store: SandboxStore, clock: Clock, exit_status: int | None
) -> None:
    row = create(store, lowest_free([]))
    clock.now = START + timedelta(minutes=5)
    store.mark_ended(row.id, exit_status)
    ended = store.get(row.id)
    assert ended is not None
    assert ended.state == "ended"
    assert ended.ended_at == START + timedelta(minutes=5)
    assert ended.exit_status == exit_status
    assert store.find() == []


def test_extend_lease_counts_from_now(store: SandboxStore, clock: Clock) -> None:
    row = create(store, lowest_free([]))
    clock.now = START + timedelta(minutes=50)
    until = store.extend_lease(row.id, 3600)
    assert until == START + timedelta(minutes=110)
    extended = store.get(row.id)
    assert extended is not None
    assert extended.lease_expires_at == until


def test_each_lease_written_is_told_after_its_write(engine: Engine, clock: Clock) -> None:
    """The reaper sleeps until the next lease's end it knows of: the store tells it each end it
    writes, a shortened one too, once the write is there to read."""
    told: list[tuple[datetime, datetime | None]] = []

    def lease_written(end: datetime) -> None:
        rows = store.find()
        told.append((end, rows[0].lease_expires_at if rows else None))

    store = SandboxStore(engine, clock=clock, lease_written=lease_written)
    row = create(store, lowest_free([]))
    clock.now = START + timedelta(minutes=1)
    store.extend_lease(row.id, 5)  # shorter than the lease it had
    shortened = START + timedelta(minutes=1, seconds=5)
    assert told == [(START + LEASE, START + LEASE), (shortened, shortened)]


def test_a_failed_clean_up_is_told_once_its_row_says_stopping(engine: Engine, clock: Clock) -> None:
    """Whoever's clean-up failed (a launch's, the API's stop), the reaper retries it: the store
    tells it once the row says so, as it sleeps otherwise until the next lease's end."""
    told: list[str] = []

    def stopping() -> None:
        told.append(store.find()[0].state)

    store = SandboxStore(engine, clock=clock, stopping=stopping)
    row = create(store, lowest_free([]))
    store.mark_stopping(row.id)
    assert told == ["stopping"]


@pytest.mark.parametrize(
    ("elapsed", "is_expired"),
    [
        (timedelta(0), False),
        (LEASE - timedelta(seconds=1), False),
        (LEASE, True),
        (LEASE + timedelta(days=3), True),
    ],
)
def test_expired_on_the_injected_clock(
    store: SandboxStore, clock: Clock, elapsed: timedelta, is_expired: bool
) -> None:
    row = create(store, lowest_free([]))
    clock.now = START + elapsed
    assert [r.id for r in store.expired()] == ([row.id] if is_expired else [])


def test_ended_sandboxes_never_expire(store: SandboxStore, clock: Clock) -> None:
    store.mark_ended(create(store, lowest_free([])).id, 0)
    clock.now = START + LEASE * 10
    assert store.expired() == []


def test_extended_lease_is_not_expired(store: SandboxStore, clock: Clock) -> None:
    row = create(store, lowest_free([]))
    clock.now = START + LEASE - timedelta(seconds=1)
    store.extend_lease(row.id, 3600)
    clock.now = START + LEASE + timedelta(minutes=30)
    assert store.expired() == []


def test_add_mount_appends_in_order_to_its_own_sandbox(store: SandboxStore) -> None:
    row = create(store, lowest_free([]))
    other = create(store, lowest_free([]))
    targets = [
        "placeholder:64768:1234:/home/owner/project/.git",
        f"/run/lnk/sandboxes/{row.id}/g0",
        f"/run/lnk/sandboxes/{row.id}/tmp",
    ]
    for target in targets:
        store.add_mount(row.id, target)
    got = store.get(row.id)
    untouched = store.get(other.id)
    assert got is not None and untouched is not None
    assert json.loads(got.mounts_json) == targets
    assert json.loads(untouched.mounts_json) == []


def test_add_mounts_records_several_at_once_after_the_earlier_ones(store: SandboxStore) -> None:
    row = create(store, lowest_free([]))
    store.add_mount(row.id, f"/run/lnk/sandboxes/{row.id}/g0")
    trio = [f"/run/lnk/sandboxes/{row.id}/{name}" for name in ("tmp", "shm", "home")]
    store.add_mounts(row.id, trio)
    got = store.get(row.id)
    assert got is not None
    assert json.loads(got.mounts_json) == [f"/run/lnk/sandboxes/{row.id}/g0", *trio]


def test_find_by_owner(store: SandboxStore) -> None:
    mine = create(store, lowest_free([]), owner_uid=1000)
    create(store, lowest_free([]), owner_uid=1001)
    assert [r.id for r in store.find(owner_uid=1000)] == [mine.id]


PRIVATE = {"staging_dir", "mounts_json", "host_name", "pid", "pid_start", "stop_requested"}


def test_wire_model_has_no_private_field() -> None:
    fields = {f.name for f in dataclasses.fields(SandboxPublic)}
    assert not {"staging_dir", "mounts_json"} & fields
    assert not PRIVATE & fields


def test_wire_model_of_a_row_carries_no_private_value(store: SandboxStore) -> None:
    row = create(store, lowest_free([]), command=["/usr/bin/make", "-j4"])
    store.add_mount(row.id, "placeholder:1:2:/home/owner/secret-project/.envrc")
    stored = store.get(row.id)
    assert stored is not None
    public = SandboxPublic.of(stored, viewer=stored.owner_uid)
    wire = json.dumps(dataclasses.asdict(public))
    assert "/run/lnk/sandboxes" not in wire
    assert "secret-project" not in wire
    assert public.command == ["/usr/bin/make", "-j4"]
    assert public.created_at == START.isoformat()
    assert public.lease_expires_at == (START + LEASE).isoformat()
    assert (public.ended_at, public.exit_status) == (None, None)


@pytest.mark.parametrize("viewer", [0, 1234, 65534])
def test_the_command_is_shown_to_its_owner_only(store: SandboxStore, viewer: int) -> None:
    row = create(store, lowest_free([]), command=["/usr/bin/curl", "-H", "token: s3cret"])
    assert row.owner_uid != viewer
    public = SandboxPublic.of(row, viewer=viewer)
    assert public.command is None
    assert "s3cret" not in json.dumps(dataclasses.asdict(public))
    assert SandboxPublic.of(row, viewer=row.owner_uid).command == row_command(row)


def row_command(row: SandboxRow) -> list[str]:
    return list(json.loads(row.command_json))
