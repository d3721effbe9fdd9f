"""The agents' sockets, served in this process on real unix sockets: honest calls work; a bad
proof or an unreadable frame (huge, not UTF-8, too deep, duplicate keys) gets the one uniform
refusal, closes the connection and stores nothing."""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from lnk_bridge_store.config import StoreConfig
from lnk_bridge_store.db import open_store
from lnk_bridge_store.models import Event
from lnk_bridge_store.server import BridgeServer
from lnk_bridge_store.store import Store
from lnk_shared.errors import StateError
from lnk_shared.proof_client import BridgeError, call_bridge
from lnk_shared.proofs import REFUSAL, AgentKey, enroll_public_key
from lnk_shared.unix import MAX_FRAME

REFUSED = {"ok": False, "error": REFUSAL}


@dataclass
class Served:
    server: BridgeServer
    path: Path
    agent: Any


@pytest.fixture
def served(kit: Any) -> Iterator[Served]:
    root = kit.short_tempdir("lnkbsv")
    config = StoreConfig(
        config_dir=root / "etc",
        state_dir=root / "state",
        run_dir=root / "run",
        database_url=f"sqlite:///{root}/state/store.db",
    )
    engine = open_store(config.database_url)
    server = BridgeServer(config, Store(engine, "test"))
    agent = kit.new_agent("agent-a", os.getuid())  # this process is the agent's peer here
    path = server.open_agent(AgentKey(agent.name, enroll_public_key(agent.public_raw), agent.uid))
    try:
        yield Served(server, path, agent)
    finally:
        server.close_all()
        engine.dispose()
        shutil.rmtree(root, ignore_errors=True)


def stored_events(served: Served) -> int:
    with served.server.store.engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(Event)) or 0)


def take_lease(served: Served) -> int:
    result = call_bridge(
        served.path, served.agent.signer(), "lease.acquire", {"holder": "h", "ttl_s": 30}
    )
    return int(result["token"])


def test_the_agents_socket_is_0666_in_its_own_folder_inside_a_0700_one(served: Served) -> None:
    assert stat.S_IMODE(served.path.stat().st_mode) == 0o666
    assert stat.S_IMODE(served.path.parent.stat().st_mode) == 0o711  # reached through a bind
    assert stat.S_IMODE(served.path.parent.parent.stat().st_mode) == 0o700  # the host's guard


def test_honest_calls_through_the_socket_work(served: Served) -> None:
    token = take_lease(served)
    signer = served.agent.signer()
    args = {"conversation": "c1", "expected_seq": 0, "token": token, "events": [{"n": 1}]}
    assert call_bridge(served.path, signer, "append", args) == {"last_seq": 1}
    page = call_bridge(
        served.path, signer, "read", {"conversation": "c1", "from_seq": 1, "limit": 5}
    )
    assert page == {"events": [{"seq": 1, "event": {"n": 1}}], "last_seq": 1}


def test_many_calls_on_one_connection_each_with_its_own_proof(served: Served, kit: Any) -> None:
    frames = [served.agent.frame("inbox.read", {"after_id": 0, "limit": 5}, "inbox")] * 1
    frames += [served.agent.frame("inbox.read", {"after_id": 0, "limit": 5}, "inbox")]
    replies = kit.exchange(served.path, frames)
    assert [r["ok"] for r in replies] == [True, True]


def test_a_replayed_frame_on_the_same_connection_is_refused_and_closes_it(
    served: Served, kit: Any
) -> None:
    frame = served.agent.frame("lease.acquire", {"holder": "h", "ttl_s": 5})
    replies = kit.exchange(served.path, [frame, frame, frame])
    assert replies[0]["ok"] is True
    assert replies[1] == REFUSED
    assert replies[2] == "closed"


def test_a_replayed_frame_on_another_connection_is_refused(served: Served, kit: Any) -> None:
    frame = served.agent.frame("lease.acquire", {"holder": "h", "ttl_s": 5})
    assert kit.exchange(served.path, [frame])[0]["ok"] is True
    assert kit.exchange(served.path, [frame]) == [REFUSED]


def test_an_action_sent_to_the_wrong_bridge_is_refused(served: Served, kit: Any) -> None:
    frame = served.agent.frame("append", {"x": 1}, audience="inbox")
    reply = kit.exchange(served.path, [frame])[0]
    assert reply["ok"] is False and "another bridge" in reply["error"]


def test_a_stale_conflict_and_a_stale_token_are_named(served: Served) -> None:
    token = take_lease(served)
    signer = served.agent.signer()
    args = {"conversation": "c1", "expected_seq": 0, "token": token, "events": [1]}
    call_bridge(served.path, signer, "append", args)
    with pytest.raises(BridgeError, match="at seq 1"):
        call_bridge(served.path, signer, "append", args)
    with pytest.raises(BridgeError, match="fencing token"):
        call_bridge(served.path, signer, "append", {**args, "expected_seq": 1, "token": 99})


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff" * 64,  # not UTF-8
        b"[" * 200_000 + b"]" * 200_000,  # deep JSON in the frame itself
        b'{"v": 1, "v": 1}',  # duplicate keys
        b"[1, 2, 3]",  # not an object
    ],
    ids=["not-utf8", "deep", "duplicate-keys", "not-object"],
)
def test_an_unreadable_frame_gets_the_uniform_refusal(
    served: Served, kit: Any, payload: bytes
) -> None:
    assert kit.exchange(served.path, [kit.raw_frame(payload)]) == [REFUSED]
    assert stored_events(served) == 0


def test_a_frame_over_the_limit_is_refused_before_it_is_read(served: Served, kit: Any) -> None:
    assert kit.exchange(served.path, [kit.raw_frame(b"{}", MAX_FRAME + 1)]) == [REFUSED]


def test_a_duplicate_key_in_a_signed_frame_is_refused_before_verification(
    served: Served, kit: Any
) -> None:
    frame = served.agent.frame("lease.acquire", {"holder": "h", "ttl_s": 5})
    text = json.dumps(frame)[:-1] + f', "agent": "{served.agent.name}"}}'
    assert kit.exchange(served.path, [kit.raw_frame(text.encode())]) == [REFUSED]


def test_a_hostile_body_under_a_valid_proof_is_refused_whole(served: Served, kit: Any) -> None:
    token = take_lease(served)
    good = [{"n": i} for i in range(5)]
    deep: Any = 1
    for _ in range(100):
        deep = [deep]
    body_frames = [
        served.agent.frame(
            "append",
            {"conversation": "c1", "expected_seq": 0, "token": token, "events": [*good, deep]},
        ),
        served.agent.signer().sign(  # an escaped lone surrogate: JSON, but not Unicode
            "append",
            json.dumps(
                {
                    "conversation": "c1",
                    "expected_seq": 0,
                    "token": token,
                    "events": [*good, "\ud800"],
                }
            ).encode(),
        ),
    ]
    for frame in body_frames:
        reply = kit.exchange(served.path, [frame])[0]
        assert reply["ok"] is False and reply["code"] == "invalid"
    assert stored_events(served) == 0


def test_a_closed_agent_has_no_socket(served: Served) -> None:
    served.server.close_agent(served.agent.name)
    assert not served.path.exists()
    with pytest.raises(StateError, match="cannot reach the bridge"):
        take_lease(served)


def _accept_thread(agent: str) -> threading.Thread | None:
    return next((t for t in threading.enumerate() if t.name == f"agent-{agent}"), None)


def test_an_open_agents_accept_thread_sleeps_and_ends_at_its_close(served: Served) -> None:
    """No poll for its close: a second at rest wakes the thread not once (a 0.5 s accept
    timeout woke it twice), and closing the agent ends the thread at once."""
    thread = _accept_thread(served.agent.name)
    assert thread is not None and thread.native_id is not None
    status = Path(f"/proc/self/task/{thread.native_id}/status")
    time.sleep(0.2)

    def wakes() -> int:
        return int(status.read_text().split("voluntary_ctxt_switches:")[1].split()[0])

    before = wakes()
    time.sleep(1.0)  # at rest: nobody connects
    woken = wakes() - before
    t0 = time.monotonic()
    served.server.close_agent(served.agent.name)
    thread.join(5.0)
    took = time.monotonic() - t0
    assert woken == 0, f"the idle accept thread woke {woken} times in a second"
    assert not thread.is_alive() and took < 1.0, f"it took {took:.2f} s to end"
