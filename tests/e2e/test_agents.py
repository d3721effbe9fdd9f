"""Agents in a real box: the owner creates one (the controller makes its key pair, keeps the
private key root-only, never prints it), lists it, sends it a message that lands in its inbox
at the store bridge and is read back with a call signed by that agent's key, removes it."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from agent_store import controller_paused
from bridge_helpers import as_uid, bridge_admin
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from lnk_shared.proof_client import ProofSigner, call_bridge

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

READER_UID = 299_960  # stands for the agent's sandbox uid when the test opens its socket


def test_an_agent_is_created_listed_sent_to_and_removed(running_box: Any) -> None:
    box, owner = running_box, running_box.owner
    name = "helper-" + os.urandom(2).hex()
    spec = owner.home / "agent.toml"
    spec.write_text("# an agent's spec\n")
    os.chown(spec, owner.uid, owner.gid)
    created = box.as_owner("agent", "create", name, "--spec", str(spec))
    assert created.returncode == 0, created.stderr
    agent_id = f"u{owner.uid}-{name}"
    try:
        folder = owner.home / "Link" / "Agents" / name
        info = folder.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (owner.uid, 0o700)

        listed = box.as_owner("agent", "list", "--json")
        (agent,) = [a for a in json.loads(listed.stdout) if a["name"] == name]
        assert agent["agent_id"] == agent_id and agent["running"] is False
        assert "PRIVATE" not in listed.stdout + created.stdout + created.stderr

        key_file = box.state_dir / "agent-keys" / f"{agent_id}.pem"
        assert (key_file.stat().st_uid, stat.S_IMODE(key_file.stat().st_mode)) == (0, 0o600)
        assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
        owner_reads = as_uid(owner.uid, key_file.read_text)
        assert "PermissionError" in owner_reads["exception"]  # not even its owner reads it
        private = load_pem_private_key(key_file.read_bytes(), password=None)
        assert isinstance(private, Ed25519PrivateKey)

        again = box.as_owner("agent", "create", name, "--spec", str(spec))
        assert again.returncode != 0 and "already have" in again.stderr

        sent = box.as_owner("agent", "send", name, "hello agent")
        assert sent.returncode == 0, sent.stderr

        # The agent's side: its socket opened as the controller would for a sandbox of uid
        # READER_UID, and the inbox read with a call signed by the agent's own key; the
        # controller held still meanwhile, or its bridge reconcile closes a socket no live
        # sandbox holds within a second (the flake this test had under load).
        with controller_paused(box.run_dir):
            read, refused = _read_inbox_as_agent(box.run_dir, agent_id, agent, private)
        assert [(m["from"], m["message"]) for m in read["messages"]] == [("owner", "hello agent")]
        assert "refused the call" in refused["exception"]
        assert base64.b64decode(agent["public_key"])  # registered, 32 bytes
    finally:
        removed = box.as_owner("agent", "remove", name)
    assert removed.returncode == 0, removed.stderr
    assert not (box.state_dir / "agent-keys" / f"{agent_id}.pem").exists()
    assert name not in box.as_owner("agent", "list").stdout


def _read_inbox_as_agent(
    run_dir: Path, agent_id: str, agent: dict[str, Any], private: Ed25519PrivateKey
) -> tuple[Any, Any]:
    """The inbox read with the agent's key and with a forged one, from READER_UID."""
    opened = bridge_admin(
        run_dir,
        {
            "op": "open",
            "agent": agent_id,
            "public_key": agent["public_key"],
            "host_uid": READER_UID,
        },
    )
    path = Path(opened["socket"])
    folders = (path.parents[2], path.parents[1])  # bridge-store/, agents/
    for folder_ in folders:
        folder_.chmod(0o711)  # for a moment, as the bind into its sandbox would let it reach
    try:
        signer = ProofSigner(agent_id, private, "inbox")
        read = as_uid(
            READER_UID,
            lambda: call_bridge(path, signer, "inbox.read", {"after_id": 0, "limit": 5}),
        )
        forged = ProofSigner(agent_id, Ed25519PrivateKey.generate(), "inbox")
        refused = as_uid(
            READER_UID,
            lambda: call_bridge(path, forged, "inbox.read", {"after_id": 0, "limit": 5}),
        )
    finally:
        for folder_ in folders:
            folder_.chmod(0o700)
    bridge_admin(run_dir, {"op": "close", "agent": agent_id})
    return read, refused


def test_an_unknown_agent_cannot_be_sent_to_or_removed(running_box: Any) -> None:
    for args in (("send", "nobody-here", "hi"), ("remove", "nobody-here")):
        result = running_box.as_owner("agent", *args)
        assert result.returncode == 1 and "no agent named" in result.stderr
