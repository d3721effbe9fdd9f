"""An agent's calls to its store bridge, as its sandbox would make them: its socket opened at
the bridge's admin socket (as the controller does), each call signed with the agent's own key
(read from the controller's key folder) and made from READER_UID. For tests that check what a
new agent can read of an old one's store."""

from __future__ import annotations

import base64
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bridge_helpers import as_uid, bridge_admin
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_private_key,
)

from lnk_shared.proof_client import ProofSigner, call_bridge

__all__ = ["READER_UID", "as_agent", "read_conversation", "read_history", "write_history"]

READER_UID = 299_961  # stands for the agent's sandbox uid while a test holds its socket

Call = tuple[str, str, dict[str, Any]]  # (audience, action, args)


@contextmanager
def controller_paused(run_dir: Path) -> Iterator[None]:
    """The box's controller held still (SIGSTOP) while a test holds an agent socket with no
    sandbox: each second it closes every socket no live sandbox holds (bridge_reconcile)."""
    pid = int((run_dir / "controller.pid").read_text().strip())
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def as_agent(run_dir: Path, state_dir: Path, agent_id: str, calls: list[Call]) -> list[Any]:
    """Each call signed by the agent's key on its own socket; the results."""
    private = load_pem_private_key(
        (state_dir / "agent-keys" / f"{agent_id}.pem").read_bytes(), password=None
    )
    assert isinstance(private, Ed25519PrivateKey)
    with controller_paused(run_dir):
        return _as_agent(run_dir, agent_id, private, calls)


def _as_agent(
    run_dir: Path, agent_id: str, private: Ed25519PrivateKey, calls: list[Call]
) -> list[Any]:
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    opened = bridge_admin(
        run_dir,
        {
            "op": "open",
            "agent": agent_id,
            "public_key": base64.b64encode(raw).decode(),
            "host_uid": READER_UID,
        },
    )
    assert opened.get("ok") is True, opened
    path = Path(opened["socket"])
    folders = (path.parents[2], path.parents[1])
    for folder in folders:
        folder.chmod(0o711)  # for a moment, as the bind into its sandbox would let it reach
    try:

        def work() -> list[Any]:
            return [
                call_bridge(path, ProofSigner(agent_id, private, audience), action, args)
                for audience, action, args in calls
            ]

        results = as_uid(READER_UID, work)
    finally:
        for folder in folders:
            folder.chmod(0o700)
        bridge_admin(run_dir, {"op": "close", "agent": agent_id})
    assert isinstance(results, list), results
    return results


def write_history(run_dir: Path, state_dir: Path, agent_id: str, secret: str) -> None:
    """A conversation holding `secret`, a lease held for 60 s, a message in its inbox."""
    (lease,) = as_agent(
        run_dir, state_dir, agent_id, [("store", "lease.acquire", {"holder": "h", "ttl_s": 60})]
    )
    append = {
        "conversation": "c1",
        "expected_seq": 0,
        "token": lease["token"],
        "events": [{"text": secret}],
    }
    as_agent(run_dir, state_dir, agent_id, [("store", "append", append)])
    sent = bridge_admin(
        run_dir, {"op": "send", "agent": agent_id, "sender": "owner", "message": secret}
    )
    assert sent.get("ok") is True, sent


def read_history(run_dir: Path, state_dir: Path, agent_id: str) -> list[Any]:
    """The conversation, the inbox, and a lease taken (the old agent's, held for 60 s, would
    refuse it)."""
    return as_agent(
        run_dir,
        state_dir,
        agent_id,
        [
            ("store", "read", {"conversation": "c1", "from_seq": 1, "limit": 10}),
            ("inbox", "inbox.read", {"after_id": 0, "limit": 10}),
            ("store", "lease.acquire", {"holder": "h2", "ttl_s": 60}),
        ],
    )


def read_conversation(run_dir: Path, state_dir: Path, agent_id: str) -> Any:
    read = {"conversation": "c1", "from_seq": 1, "limit": 10}
    (page,) = as_agent(run_dir, state_dir, agent_id, [("store", "read", read)])
    return page
