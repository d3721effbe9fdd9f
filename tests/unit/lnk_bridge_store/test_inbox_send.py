"""`inbox.send`, agent to agent, served in this process on real unix sockets: an agent reaches
the running agents of its own owner and no one else, whatever it writes in `to`; a stopped or
unknown recipient gets one `not-running` answer; a full inbox refuses and stores nothing; a bad
proof still gets the one uniform refusal."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from lnk_bridge_store import store as store_module
from lnk_bridge_store.config import StoreConfig
from lnk_bridge_store.db import open_store
from lnk_bridge_store.models import InboxMessage
from lnk_bridge_store.server import BridgeServer
from lnk_bridge_store.store import Store
from lnk_shared.proof_client import BridgeError, call_bridge
from lnk_shared.proofs import REFUSAL, AgentKey, enroll_public_key

OWNER = 1000
OTHER_OWNER = 1001


@dataclass
class Box:
    server: BridgeServer
    kit: Any
    paths: dict[str, Path]

    def open(self, owner: int, name: str) -> Any:
        """An agent `u{owner}-{name}` with its socket open (running); this process is its peer."""
        agent = self.kit.named_agent(f"u{owner}-{name}", os.getuid())
        key = AgentKey(agent.name, enroll_public_key(agent.public_raw), agent.uid)
        self.paths[agent.name] = self.server.open_agent(key)
        return agent

    def send(self, sender: Any, to: Any, message: Any = "hi") -> Any:
        frame = sender.frame("inbox.send", {"to": to, "message": message}, "inbox")
        return self.kit.exchange(self.paths[sender.name], [frame])[0]

    def inbox(self, agent: Any) -> list[dict[str, Any]]:
        signer = agent.signer("inbox")
        page = call_bridge(
            self.paths[agent.name], signer, "inbox.read", {"after_id": 0, "limit": 50}
        )
        return list(page["messages"])

    def stored(self) -> int:
        with self.server.store.engine.connect() as conn:
            return int(conn.scalar(select(func.count()).select_from(InboxMessage)) or 0)


@pytest.fixture
def box(kit: Any) -> Iterator[Box]:
    root = kit.short_tempdir("lnkbsi")
    config = StoreConfig(
        config_dir=root / "etc",
        state_dir=root / "state",
        run_dir=root / "run",
        database_url=f"sqlite:///{root}/state/store.db",
    )
    engine = open_store(config.database_url)
    server = BridgeServer(config, Store(engine, "test"))
    try:
        yield Box(server, kit, {})
    finally:
        server.close_all()
        engine.dispose()
        shutil.rmtree(root, ignore_errors=True)


def test_an_agent_sends_to_a_running_agent_of_its_owner(box: Box) -> None:
    alice, bob = box.open(OWNER, "alice"), box.open(OWNER, "bob")
    assert box.send(alice, "bob", "hi bob") == {"ok": True, "result": {"sent": True, "to": "bob"}}
    messages = box.inbox(bob)
    assert [(m["from"], m["message"]) for m in messages] == [("alice", "hi bob")]
    assert box.inbox(alice) == []


def test_an_agent_may_send_to_itself(box: Box) -> None:
    alice = box.open(OWNER, "alice")
    assert box.send(alice, "alice", "note to self")["ok"] is True
    assert [(m["from"], m["message"]) for m in box.inbox(alice)] == [("alice", "note to self")]


@pytest.mark.parametrize(
    "to",
    [f"u{OTHER_OWNER}-carol", "carol", f"../u{OTHER_OWNER}-carol", f"u{OTHER_OWNER}/carol"],
    ids=["full-id", "bare-name", "dotdot", "slash"],
)
def test_an_agent_cannot_reach_another_owners_agent(box: Box, to: str) -> None:
    alice = box.open(OWNER, "alice")
    carol = box.open(OTHER_OWNER, "carol")
    reply = box.send(alice, to, "hello carol")
    assert reply["ok"] is False and reply["code"] in ("not-running", "invalid"), reply
    assert box.inbox(carol) == [] and box.stored() == 0


def test_the_granted_path_across_owners_is_only_the_owners_own(box: Box) -> None:
    # The attack's control: carol's own sibling reaches her, so the refusal above is the owner rule.
    carol, dave = box.open(OTHER_OWNER, "carol"), box.open(OTHER_OWNER, "dave")
    assert box.send(dave, "carol")["ok"] is True
    assert [m["from"] for m in box.inbox(carol)] == ["dave"]


def test_a_stopped_or_unknown_recipient_gets_the_same_answer(box: Box) -> None:
    alice, bob = box.open(OWNER, "alice"), box.open(OWNER, "bob")
    box.server.close_agent(bob.name)
    stopped, unknown = box.send(alice, "bob"), box.send(alice, "nobody-here")
    assert stopped["code"] == unknown["code"] == "not-running"
    assert "not running" in stopped["error"]
    assert stopped["error"].replace("'bob'", "N") == unknown["error"].replace("'nobody-here'", "N")
    assert box.stored() == 0


def test_a_full_inbox_refuses_and_stores_nothing(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "MAX_INBOX_PENDING", 2)
    alice, bob = box.open(OWNER, "alice"), box.open(OWNER, "bob")
    assert box.send(alice, "bob", "1")["ok"] and box.send(alice, "bob", "2")["ok"]
    reply = box.send(alice, "bob", "3")
    assert reply["ok"] is False and reply["code"] == "limit"
    assert [m["message"] for m in box.inbox(bob)] == ["1", "2"] and box.stored() == 2


def test_an_over_long_message_is_refused_whole(box: Box) -> None:
    alice, bob = box.open(OWNER, "alice"), box.open(OWNER, "bob")
    reply = box.send(alice, "bob", "x" * (64 * 1024 + 1))
    assert reply["ok"] is False and reply["code"] == "invalid"
    assert box.inbox(bob) == []


def test_an_agent_named_owner_cannot_send_as_the_owner(box: Box) -> None:
    fake, bob = box.open(OWNER, "owner"), box.open(OWNER, "bob")
    reply = box.send(fake, "bob", "from your owner, honest")
    assert reply["ok"] is False and "cannot send" in reply["error"]
    assert box.inbox(bob) == []


def test_an_agent_whose_id_names_no_owner_cannot_send(box: Box, kit: Any) -> None:
    plain = kit.new_agent("plain", os.getuid())
    key = AgentKey(plain.name, enroll_public_key(plain.public_raw), plain.uid)
    box.paths[plain.name] = box.server.open_agent(key)
    box.open(OWNER, "bob")
    reply = box.send(plain, "bob")
    assert reply["ok"] is False and "names no owner" in reply["error"]
    assert box.stored() == 0


def test_a_send_with_a_bad_proof_gets_the_uniform_refusal(box: Box, kit: Any) -> None:
    alice, bob = box.open(OWNER, "alice"), box.open(OWNER, "bob")
    frame = alice.frame("inbox.send", {"to": "bob", "message": "hi"}, "inbox")
    # On bob's socket (a valid proof, not bob's), then as bob (the agent id swapped):
    assert kit.exchange(box.paths[bob.name], [frame]) == [{"ok": False, "error": REFUSAL}]
    forged = {**frame, "agent": bob.name}
    assert kit.exchange(box.paths[bob.name], [forged]) == [{"ok": False, "error": REFUSAL}]
    # Signed for the store, not the inbox:
    store_frame = alice.frame("inbox.send", {"to": "bob", "message": "hi"}, "store")
    reply = kit.exchange(box.paths[alice.name], [store_frame])[0]
    assert reply["ok"] is False and "another bridge" in reply["error"]
    assert box.stored() == 0


def test_the_cli_style_client_gets_a_named_error(box: Box) -> None:
    alice = box.open(OWNER, "alice")
    with pytest.raises(BridgeError, match="not running"):
        call_bridge(
            box.paths[alice.name],
            alice.signer("inbox"),
            "inbox.send",
            {"to": "bob", "message": "x"},
        )
