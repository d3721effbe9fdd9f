"""`lnk agent remove` forgets what the store bridge kept for the agent: a new agent of the same
name reads none of the old conversations, inbox or lease. `--keep-store` keeps them, for the
owner's own next agent of that name."""

from __future__ import annotations

import os
from typing import Any

import pytest
from agent_store import read_conversation, read_history, write_history

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

SECRET = "the old agent's conversation " + os.urandom(4).hex()


def create(box: Any, name: str) -> str:
    spec = box.owner.home / "agent-forget.toml"
    spec.write_text("# an agent's spec\n")
    os.chown(spec, box.owner.uid, box.owner.gid)
    created = box.as_owner("agent", "create", name, "--spec", str(spec))
    assert created.returncode == 0, created.stderr
    return f"u{box.owner.uid}-{name}"


def test_a_new_agent_of_a_removed_agents_name_reads_none_of_its_conversations(
    running_box: Any,
) -> None:
    box = running_box
    name = "forget-" + os.urandom(2).hex()
    agent_id = create(box, name)
    try:
        write_history(box.run_dir, box.state_dir, agent_id, SECRET)
        removed = box.as_owner("agent", "remove", name)
        assert removed.returncode == 0, removed.stderr
        assert create(box, name) == agent_id  # the same id: only the store's forgetting helps
        page, inbox, lease = read_history(box.run_dir, box.state_dir, agent_id)
        assert page == {"events": [], "last_seq": 0}
        assert inbox["messages"] == []
        assert lease["token"] == 1  # no lease of the old agent's is left either
        assert "conversations and lease removed" in removed.stdout
    finally:
        box.as_owner("agent", "remove", name)


def test_keep_store_keeps_the_conversations_for_the_owners_next_agent(running_box: Any) -> None:
    box = running_box
    name = "keep-" + os.urandom(2).hex()
    agent_id = create(box, name)
    try:
        write_history(box.run_dir, box.state_dir, agent_id, SECRET)
        removed = box.as_owner("agent", "remove", name, "--keep-store")
        assert removed.returncode == 0, removed.stderr
        assert "conversations and lease kept" in removed.stdout
        create(box, name)
        page = read_conversation(box.run_dir, box.state_dir, agent_id)
        assert [e["event"]["text"] for e in page["events"]] == [SECRET]
    finally:
        box.as_owner("agent", "remove", name)


def test_remove_help_says_what_it_removes(running_box: Any) -> None:
    shown = running_box.as_owner("agent", "remove", "--help")
    assert "conversations" in shown.stdout and "--keep-store" in shown.stdout
