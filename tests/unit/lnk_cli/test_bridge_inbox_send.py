"""`lnk bridge inbox send NAME MESSAGE` inside an agent's sandbox, against the store bridge's
server on a real socket (served in this process): it reaches a running sibling (same owner),
and another owner's agent, even named by its full id, is refused."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from lnk_bridge_store.config import StoreConfig
from lnk_bridge_store.db import open_store
from lnk_bridge_store.server import BridgeServer
from lnk_bridge_store.store import Store
from lnk_cli.app import run
from lnk_shared.proofs import AgentKey, enroll_public_key

SENDER, SIBLING, STRANGER = "u1001-helper", "u1001-peer", "u1002-peer"


@dataclass
class Inside:
    server: BridgeServer

    def inbox(self, agent: str) -> list[tuple[str, str]]:
        return [(m["from"], m["message"]) for m in self.server.store.inbox_read(agent, 0, 10)]


def open_agent(server: BridgeServer, agent: str) -> tuple[Path, Ed25519PrivateKey]:
    key = Ed25519PrivateKey.generate()
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return server.open_agent(AgentKey(agent, enroll_public_key(raw), os.getuid())), key


@pytest.fixture
def inside(monkeypatch: pytest.MonkeyPatch) -> Iterator[Inside]:
    """SENDER's sandbox environment; SIBLING and STRANGER running on the same bridge."""
    root = Path(tempfile.mkdtemp(prefix="lnkbis", dir="/tmp"))
    config = StoreConfig(
        config_dir=root, state_dir=root, run_dir=root, database_url=f"sqlite:///{root}/s.db"
    )
    engine = open_store(config.database_url)
    server = BridgeServer(config, Store(engine, "test"))
    path, key = open_agent(server, SENDER)
    open_agent(server, SIBLING)
    open_agent(server, STRANGER)
    key_file = root / "key.pem"
    key_file.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    key_file.chmod(0o600)  # the caller's alone, as the box writes it (load_private_key)
    monkeypatch.setenv("LNK_AGENT", SENDER)
    monkeypatch.setenv("LNK_AGENT_KEY", str(key_file))
    monkeypatch.setenv("LNK_BRIDGE", str(path))
    try:
        yield Inside(server)
    finally:
        server.close_all()
        engine.dispose()
        shutil.rmtree(root, ignore_errors=True)


def lnk(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    status = run(list(args))
    out = capsys.readouterr()
    return status, (json.loads(out.out) if status == 0 else out.err)


def test_send_reaches_a_running_sibling(inside: Inside, capsys: pytest.CaptureFixture[str]) -> None:
    assert lnk(capsys, "bridge", "inbox", "send", "peer", "hi") == (0, {"sent": True, "to": "peer"})
    assert inside.inbox(SIBLING) == [("helper", "hi")]


@pytest.mark.parametrize("name", [STRANGER, "../u1002-peer"])
def test_send_cannot_reach_another_owners_agent(
    inside: Inside, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    status, err = lnk(capsys, "bridge", "inbox", "send", name, "hi")
    assert status == 1 and ("not running" in err or "agent's name" in err), err
    assert inside.inbox(STRANGER) == [] and inside.inbox(SIBLING) == []


def test_send_needs_a_name_and_a_message(
    inside: Inside, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["bridge", "inbox", "send", "peer"]) == 2
    assert "required: MESSAGE" in capsys.readouterr().err
    assert inside.inbox(SIBLING) == []
