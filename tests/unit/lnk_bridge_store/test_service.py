"""The store bridge as a real process (`python -m lnk_bridge_store` as `nobody`), called on
real sockets by forked children under other uids, as sandboxes call it: each agent acts only
as itself; a kill mid-append loses no acknowledged event and stores no partial one; events and
nonces survive a restart."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from lnk_shared.proof_client import call_bridge
from lnk_shared.proofs import REFUSAL

pytestmark = pytest.mark.needs_root

UID_A, UID_B = 299_901, 299_902
REFUSED = {"ok": False, "error": REFUSAL}
BATCH = 8  # events per append in the kill test: a partial append would show as a short batch


def event(seq: int) -> dict[str, Any]:
    return {"seq": seq, "text": f"event {seq} " + "x" * 2000}


def call(path: Path, agent: Any, action: str, args: dict[str, Any]) -> Any:
    audience = "inbox" if action.startswith("inbox.") else "store"
    return call_bridge(path, agent.signer(audience), action, args)


def read_all(path: Path, agent: Any, conversation: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        args = {"conversation": conversation, "from_seq": len(out) + 1, "limit": 256}
        page = call(path, agent, "read", args)["events"]
        if not page:
            return out
        out += page


def test_two_agents_at_once_each_act_as_itself(bridge_process: Any, kit: Any) -> None:
    a, b = kit.new_agent("agent-a", UID_A), kit.new_agent("agent-b", UID_B)
    path_a, path_b = bridge_process.open_agent(a), bridge_process.open_agent(b)

    def work(agent: Any, path: Path) -> Any:
        token = call(path, agent, "lease.acquire", {"holder": "h", "ttl_s": 60})["token"]
        args = {"conversation": "c1", "expected_seq": 0, "token": token, "events": [agent.name]}
        call(path, agent, "append", args)
        return read_all(path, agent, "c1")

    assert kit.in_child_as(UID_A, lambda: work(a, path_a)) == [{"seq": 1, "event": a.name}]
    assert kit.in_child_as(UID_B, lambda: work(b, path_b)) == [{"seq": 1, "event": b.name}]


def test_a_valid_proof_sent_from_another_agents_uid_is_refused(
    bridge_process: Any, kit: Any
) -> None:
    a = kit.new_agent("agent-a", UID_A)
    path_a = bridge_process.open_agent(a)
    bridge_process.open_agent(kit.new_agent("agent-b", UID_B))
    frame = a.frame("lease.acquire", {"holder": "h", "ttl_s": 60})
    assert kit.in_child_as(UID_B, lambda: kit.exchange(path_a, [frame])) == [REFUSED]
    # Refused before its nonce was recorded: A itself may still use that very proof.
    assert kit.in_child_as(UID_A, lambda: kit.exchange(path_a, [frame]))[0]["ok"] is True


def test_agent_a_cannot_take_b_lease_nor_read_or_append_to_b_conversations(
    bridge_process: Any, kit: Any
) -> None:
    a, b = kit.new_agent("agent-a", UID_A), kit.new_agent("agent-b", UID_B)
    bridge_process.open_agent(a)
    path_b = bridge_process.open_agent(b)
    attempts = [
        a.frame("lease.acquire", {"holder": "a", "ttl_s": 60}),
        a.frame("read", {"conversation": "c1", "from_seq": 1, "limit": 5}),
        a.frame("append", {"conversation": "c1", "expected_seq": 0, "token": 1, "events": [1]}),
    ]
    for frame in attempts:  # A's own proofs, from A's uid, on B's socket
        assert kit.in_child_as(UID_A, lambda f=frame: kit.exchange(path_b, [f])) == [REFUSED]
    forged = dict(attempts[0], agent=b.name)  # A's proof claiming to be B
    assert kit.in_child_as(UID_A, lambda: kit.exchange(path_b, [forged])) == [REFUSED]
    # B's lease was never taken: B gets token 1.
    acquired = kit.in_child_as(
        UID_B, lambda: call(path_b, b, "lease.acquire", {"holder": "b", "ttl_s": 60})
    )
    assert acquired["token"] == 1


def test_only_the_controller_reaches_the_admin_socket(bridge_process: Any, kit: Any) -> None:
    def connect() -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(bridge_process.admin_socket))
        return "connected"

    assert "PermissionError" in kit.in_child_as(UID_A, connect)["exception"]
    answer = bridge_process.admin({"op": "ping"})
    open_now = answer.pop("open")  # the sockets other tests of this bridge opened
    assert answer == {"ok": True, "driver": "sqlite"}
    assert isinstance(open_now, list) and all(isinstance(a, str) for a in open_now)


def test_a_host_user_cannot_reach_an_agents_socket_through_the_bridge_folder(
    bridge_process: Any, kit: Any
) -> None:
    path = bridge_process.open_agent(kit.new_agent("agent-a", UID_A))
    bridge_process.bridge_dir.chmod(0o700)  # as on a box: only a bind into a sandbox reaches it

    def connect() -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(path))
        return "connected"

    try:
        assert "PermissionError" in kit.in_child_as(UID_A, connect)["exception"]
    finally:
        kit.open_to_children(bridge_process.bridge_dir)


def test_a_closed_agent_is_not_opened_again_at_restart(bridge_process: Any, kit: Any) -> None:
    a = kit.new_agent("agent-a", UID_A)
    path = bridge_process.open_agent(a)
    assert bridge_process.admin({"op": "close", "agent": a.name}) == {"ok": True}
    bridge_process.kill(signal.SIGTERM)
    bridge_process.start()
    assert not path.exists() and not path.parent.exists()


def test_killing_the_bridge_mid_append_loses_no_acknowledged_event_and_stores_no_partial_one(
    bridge_process: Any, kit: Any
) -> None:
    a = kit.new_agent("agent-a", UID_A)
    path = bridge_process.open_agent(a)

    def writer() -> Any:
        token = call(path, a, "lease.acquire", {"holder": "w", "ttl_s": 600})["token"]
        acked = 0
        try:
            while True:
                batch = [event(acked + 1 + i) for i in range(BATCH)]
                args = {"conversation": "c", "expected_seq": acked, "token": token, "events": batch}
                acked = call(path, a, "append", args)["last_seq"]
        except Exception as exc:
            return {"acked": acked, "error": str(exc)}

    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(kit.in_child_as(UID_A, writer)))
    thread.start()
    time.sleep(1.5)
    bridge_process.kill(signal.SIGKILL)
    thread.join(timeout=60)
    acked = outcome[0]["acked"]
    assert acked >= BATCH, outcome  # the writer was really appending when the bridge died

    bridge_process.start()
    path = bridge_process.open_agent(a)
    stored = kit.in_child_as(UID_A, lambda: read_all(path, a, "c"))
    assert len(stored) >= acked  # nothing acknowledged is lost
    assert len(stored) % BATCH == 0  # no append stored in part
    assert stored == [{"seq": n, "event": event(n)} for n in range(1, len(stored) + 1)]


def test_events_and_nonces_survive_a_restart(bridge_process: Any, kit: Any) -> None:
    a = kit.new_agent("agent-a", UID_A)
    path = bridge_process.open_agent(a)
    acquire = a.frame("lease.acquire", {"holder": "h", "ttl_s": 60})

    def before() -> Any:
        token = kit.exchange(path, [acquire])[0]["result"]["token"]
        args = {"conversation": "c", "expected_seq": 0, "token": token, "events": ["kept"]}
        return call(path, a, "append", args)

    assert kit.in_child_as(UID_A, before) == {"last_seq": 1}
    bridge_process.kill(signal.SIGTERM)
    bridge_process.start()  # the agent's socket is opened again at start, at the same path

    def after() -> Any:
        return {
            "replay": kit.exchange(path, [acquire]),
            "events": read_all(path, a, "c"),
        }

    result = kit.in_child_as(UID_A, after)
    assert result["replay"] == [REFUSED]  # the nonce was remembered across the restart
    assert result["events"] == [{"seq": 1, "event": "kept"}]
