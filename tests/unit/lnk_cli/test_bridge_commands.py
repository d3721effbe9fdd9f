"""`lnk bridge …` inside an agent's sandbox: each call signed with the agent's key file,
against the store bridge's server on a real socket (served in this process)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
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

AGENT = "u1001-helper"


@pytest.fixture
def inside(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A bridge serving AGENT to this process's uid, and the env its sandbox would have."""
    root = Path(tempfile.mkdtemp(prefix="lnkbc", dir="/tmp"))
    config = StoreConfig(
        config_dir=root, state_dir=root, run_dir=root, database_url=f"sqlite:///{root}/s.db"
    )
    engine = open_store(config.database_url)
    server = BridgeServer(config, Store(engine, "test"))
    key = Ed25519PrivateKey.generate()
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    import os

    path = server.open_agent(AgentKey(AGENT, enroll_public_key(raw), os.getuid()))
    key_file = root / "key.pem"
    key_file.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    key_file.chmod(0o600)  # the caller's alone, as the box writes it (load_private_key)
    monkeypatch.setenv("LNK_AGENT", AGENT)
    monkeypatch.setenv("LNK_AGENT_KEY", str(key_file))
    monkeypatch.setenv("LNK_BRIDGE", str(path))
    try:
        yield root
    finally:
        server.close_all()
        engine.dispose()
        shutil.rmtree(root, ignore_errors=True)


def lnk(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    status = run(list(args))
    out = capsys.readouterr()
    return status, (json.loads(out.out) if status == 0 else out.err)


def test_lease_append_read_through_the_cli(
    inside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, lease = lnk(capsys, "bridge", "store", "lease", "acquire", "--ttl", "30")
    assert status == 0 and lease["token"] == 1
    token = str(lease["token"])
    args = ("bridge", "store", "append", "c1", '{"a": 1}', '"two"', "--expected-seq", "0")
    assert lnk(capsys, *args, "--token", token) == (0, {"last_seq": 2})
    status, page = lnk(capsys, "bridge", "store", "read", "c1", "--from", "2")
    assert page["events"] == [{"seq": 2, "event": "two"}]
    status, err = lnk(capsys, *args, "--token", token)  # stale expected seq
    assert status == 1 and "at seq 2" in err
    assert lnk(capsys, "bridge", "store", "lease", "release", "--token", token)[0] == 0


def test_inbox_read_and_ack(inside: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert lnk(capsys, "bridge", "inbox", "read") == (0, {"messages": []})
    assert lnk(capsys, "bridge", "inbox", "ack", "5") == (0, {"acknowledged": 0})


def test_another_key_is_refused(
    inside: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    other = inside / "other.pem"
    other.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        )
    )
    other.chmod(0o600)
    monkeypatch.setenv("LNK_AGENT_KEY", str(other))
    status, err = lnk(capsys, "bridge", "store", "lease", "acquire")
    assert status == 1 and "refused the call" in err


def test_outside_an_agent_it_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LNK_AGENT", raising=False)
    status, err = lnk(capsys, "bridge", "inbox", "read")
    assert status == 2 and "LNK_AGENT" in err
