"""The store on a real SQLite file: append-only conversations with compare-and-set, a lease
whose fencing token only grows, limits that refuse whole calls, nonces kept across restarts,
each agent's rows out of every other agent's reach."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from lnk_bridge_store import limits, store
from lnk_bridge_store.calls import Acquire, Append, Read, Release, Renew
from lnk_bridge_store.db import open_store
from lnk_bridge_store.models import Event
from lnk_bridge_store.store import Conflict, LimitReached, StaleToken, Store
from lnk_shared.errors import StateError


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/store/store.db"


@pytest.fixture
def st(db_url: str, clock: Clock) -> Iterator[Store]:
    engine = open_store(db_url)
    yield Store(engine, "test", clock)
    engine.dispose()


def events(*texts: str) -> tuple[str, ...]:
    return tuple(json.dumps({"text": t}) for t in texts)


def lease(st: Store, agent: str = "a", holder: str = "h1", ttl: int = 30) -> int:
    token: int = st.acquire(agent, Acquire(holder, ttl))["token"]
    return token


def test_the_database_file_and_folder_are_owner_only(st: Store, tmp_path: Path) -> None:
    assert stat.S_IMODE(os.stat(tmp_path / "store").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "store" / "store.db").st_mode) == 0o600


def test_append_then_read_gives_the_events_in_order(st: Store) -> None:
    token = lease(st)
    assert st.append("a", Append("c1", 0, token, events("one", "two"))) == 2
    assert st.append("a", Append("c1", 2, token, events("three"))) == 3
    page = st.read("a", Read("c1", 2, 10))
    assert page == {
        "events": [{"seq": 2, "event": {"text": "two"}}, {"seq": 3, "event": {"text": "three"}}],
        "last_seq": 3,
    }


def test_an_append_with_a_stale_expected_seq_is_a_conflict_and_stores_nothing(st: Store) -> None:
    token = lease(st)
    st.append("a", Append("c1", 0, token, events("one")))
    with pytest.raises(Conflict, match="at seq 1"):
        st.append("a", Append("c1", 0, token, events("again")))
    assert st.read("a", Read("c1", 1, 10))["last_seq"] == 1


def test_pages_are_bounded_by_the_limit(st: Store) -> None:
    token = lease(st)
    st.append("a", Append("c1", 0, token, events(*map(str, range(10)))))
    page = st.read("a", Read("c1", 1, 4))["events"]
    assert [e["seq"] for e in page] == [1, 2, 3, 4]


def test_pages_are_bounded_in_bytes(st: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "MAX_PAGE_BYTES", 120)
    token = lease(st)
    st.append("a", Append("c1", 0, token, events("x" * 40, "y" * 40, "z" * 40)))
    assert len(st.read("a", Read("c1", 1, 10))["events"]) == 2


def test_a_read_of_an_unknown_conversation_is_empty(st: Store) -> None:
    assert st.read("a", Read("nothing", 1, 10)) == {"events": [], "last_seq": 0}


def test_an_agent_cannot_read_or_append_to_another_agents_conversation(st: Store) -> None:
    st.append("b", Append("shared-name", 0, lease(st, "b"), events("b's secret")))
    assert st.read("a", Read("shared-name", 1, 10)) == {"events": [], "last_seq": 0}
    with pytest.raises(StaleToken):  # B's token means nothing for A
        st.append("a", Append("shared-name", 1, 1, events("a")))
    token_a = lease(st, "a")
    st.append("a", Append("shared-name", 0, token_a, events("a's own")))  # a separate log
    assert st.read("b", Read("shared-name", 1, 10))["events"][0]["event"] == {"text": "b's secret"}


# --- the lease ---


def test_an_append_without_a_lease_is_refused(st: Store) -> None:
    with pytest.raises(StaleToken):
        st.append("a", Append("c1", 0, 1, events("x")))


def test_a_held_lease_cannot_be_taken_until_it_expires(st: Store, clock: Clock) -> None:
    lease(st, holder="h1", ttl=10)
    with pytest.raises(Conflict, match="held by 'h1'"):
        lease(st, holder="h2")
    clock.now += 10.001
    assert lease(st, holder="h2") == 2


def test_a_writer_with_a_stale_fencing_token_is_refused(st: Store, clock: Clock) -> None:
    old = lease(st, holder="h1", ttl=5)
    st.append("a", Append("c1", 0, old, events("by h1")))
    clock.now += 6  # h1 stalls past its lease; h2 takes it
    new = lease(st, holder="h2")
    assert new > old
    with pytest.raises(StaleToken, match=f"token {old}"):
        st.append("a", Append("c1", 1, old, events("late write by h1")))
    st.append("a", Append("c1", 1, new, events("by h2")))
    assert [e["event"]["text"] for e in st.read("a", Read("c1", 1, 10))["events"]] == [
        "by h1",
        "by h2",
    ]


def test_an_expired_lease_refuses_writes_even_with_its_current_token(
    st: Store, clock: Clock
) -> None:
    token = lease(st, ttl=5)
    clock.now += 5
    with pytest.raises(StaleToken, match="expired"):
        st.append("a", Append("c1", 0, token, events("x")))


def test_renew_extends_and_release_ends_the_lease(st: Store, clock: Clock) -> None:
    token = lease(st, ttl=5)
    clock.now += 4
    st.renew("a", Renew(token, 5))
    clock.now += 4
    st.append("a", Append("c1", 0, token, events("x")))
    st.release("a", Release(token))
    with pytest.raises(StaleToken):
        st.append("a", Append("c1", 1, token, events("y")))
    with pytest.raises(StaleToken):
        st.renew("a", Renew(token, 5))


def test_the_fencing_token_grows_at_every_acquire_also_after_release(st: Store) -> None:
    tokens = []
    for _ in range(4):
        token = lease(st)
        tokens.append(token)
        st.release("a", Release(token))
    assert tokens == [1, 2, 3, 4]


def test_renew_with_an_old_token_is_refused(st: Store, clock: Clock) -> None:
    old = lease(st, ttl=1)
    clock.now += 2
    lease(st, holder="h2")
    with pytest.raises(StaleToken):
        st.renew("a", Renew(old, 30))


# --- limits: refused whole ---


def test_the_store_size_per_agent_is_bounded_and_nothing_is_half_stored(
    st: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "MAX_STORE_BYTES_PER_AGENT", 100)
    token = lease(st)
    st.append("a", Append("c1", 0, token, events("x" * 50)))
    with pytest.raises(LimitReached, match="limit of 100"):
        st.append("a", Append("c1", 1, token, events("y", "z" * 50)))
    with st.engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Event)) == 1
    st.append("b", Append("c1", 0, lease(st, "b"), events("x" * 50)))  # b has its own budget


def test_the_limits_have_their_documented_sizes() -> None:
    assert limits.MAX_EVENT_BYTES == 64 * 1024
    assert limits.MAX_PAGE_EVENTS * 1 <= 1024
    assert limits.MAX_PAGE_BYTES < 1 << 20  # a page fits one frame


# --- nonces ---


def test_a_nonce_is_accepted_once_and_refused_after_a_restart(
    db_url: str, st: Store, clock: Clock
) -> None:
    nonce = os.urandom(16)
    assert st.record("a", nonce, int(clock.now) + 60)
    assert not st.record("a", nonce, int(clock.now) + 60)
    assert st.record("b", nonce, int(clock.now) + 60)  # per agent
    reopened = open_store(db_url)
    try:
        assert not Store(reopened, "test", clock).record("a", nonce, int(clock.now) + 60)
    finally:
        reopened.dispose()


def test_expired_nonces_are_forgotten(st: Store, clock: Clock) -> None:
    nonce = os.urandom(16)
    st.record("a", nonce, int(clock.now) + 60)
    clock.now += 62
    assert st.record("a", nonce, int(clock.now) + 60)


# --- the inbox ---


def test_the_inbox_keeps_messages_until_acknowledged(st: Store) -> None:
    first = st.send("a", "owner", "hello")
    st.send("a", "owner", "again")
    st.send("b", "owner", "for b only")
    messages = st.inbox_read("a", 0, 10)
    assert [m["message"] for m in messages] == ["hello", "again"]
    assert st.inbox_ack("a", first) == 1
    assert [m["message"] for m in st.inbox_read("a", 0, 10)] == ["again"]
    assert st.inbox_ack("a", 10**9) == 1 and st.inbox_read("b", 0, 10)


def test_the_inbox_is_bounded(st: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "MAX_INBOX_PENDING", 2)
    st.send("a", "owner", "1")
    st.send("a", "owner", "2")
    with pytest.raises(LimitReached):
        st.send("a", "owner", "3")
    with pytest.raises(LimitReached):
        st.send("b", "owner", "x" * (limits.MAX_INBOX_MESSAGE_BYTES + 1))


# --- the database ---


def test_an_unusable_url_is_a_state_error(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="not an SQLAlchemy URL"):
        open_store("::nonsense")
    with pytest.raises(StateError, match="needs a file"):
        open_store("sqlite://")
    (tmp_path / "bad.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(StateError, match="cannot open the store database"):
        open_store(f"sqlite:///{tmp_path}/bad.db")


def test_a_forgotten_agent_leaves_nothing_for_a_new_agent_of_its_name(st: Store) -> None:
    token = lease(st)
    st.append("a", Append("c1", 0, token, events("secret of the old agent")))
    st.send("a", "owner", "for the old agent")
    assert st.record("a", b"n" * 16, 2_000_000_000)
    st.remember_open("a", "key", 70000)
    b_token = lease(st, "b")
    st.append("b", Append("c1", 0, b_token, events("b's own")))

    assert st.forget("a") >= 6
    assert st.read("a", Read("c1", 0, 10)) == {"events": [], "last_seq": 0}
    assert st.inbox_read("a", 0, 10) == []
    assert st.opened() == []
    assert lease(st) == 1  # no lease left: a new one starts its tokens again
    assert st.record("a", b"n" * 16, 2_000_000_000)  # its nonces went with it
    assert st.read("b", Read("c1", 0, 10))["last_seq"] == 1  # another agent keeps its own
