"""The C `lnk bridge` client and the Python one side by side, for
tests/unit/lnk_cli/test_native_bridge*.py: a real store bridge serving one agent to this
process's uid (`RealBridge`), a fake one that records each call's frame and answers with the
bytes it is given (`FakeBridge`), and running the C client with an agent's environment.
The fixtures on them (`c_only`, `py`, `fake`) are in tests/unit/lnk_cli/conftest.py."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from hypothesis import HealthCheck, settings

from lnk_bridge_store.config import StoreConfig
from lnk_bridge_store.db import open_store
from lnk_bridge_store.server import BridgeServer
from lnk_bridge_store.store import Store
from lnk_shared.proofs import AgentKey, enroll_public_key
from lnk_shared.unix import recv_frame

AGENT = "u1001-helper"
TIMEOUT_S = 30.0  # a loaded 2-core machine
FAST = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def key_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def bridge_env(key_file: Path, bridge: Path | str) -> dict[str, str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LNK_AGENT": AGENT,
        "LNK_AGENT_KEY": str(key_file),
        "LNK_BRIDGE": str(bridge),
    }
    if "PYTHONPATH" in os.environ:  # scripts/dev-pytest: the checkout's sources
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def run_words(
    program: list[str], words: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*program, *words],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )


Result = tuple[int, bytes, bytes]


def c_answer(client: Path, words: list[str], env: dict[str, str]) -> Result:
    ran = run_words([str(client)], words, env)
    return ran.returncode, ran.stdout, ran.stderr


class RealBridge:
    """The store bridge's own server, serving AGENT to this process's uid."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="lnknb", dir="/tmp"))
        config = StoreConfig(
            config_dir=self.root,
            state_dir=self.root,
            run_dir=self.root,
            database_url=f"sqlite:///{self.root}/s.db",
        )
        self.engine = open_store(config.database_url)
        self.server = BridgeServer(config, Store(self.engine, "test"))
        self.key = Ed25519PrivateKey.generate()
        raw = self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.socket = self.server.open_agent(AgentKey(AGENT, enroll_public_key(raw), os.getuid()))
        self.key_file = self.root / "key.pem"
        self.key_file.write_bytes(key_pem(self.key))
        self.key_file.chmod(0o400)  # as agent_launch writes it inside

    def env(self) -> dict[str, str]:
        return bridge_env(self.key_file, self.socket)

    def close(self) -> None:
        self.server.close_all()
        self.engine.dispose()
        shutil.rmtree(self.root, ignore_errors=True)


class FakeBridge:
    """A unix socket that records each call's frame and answers with the bytes it is given."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "bridge.sock"
        self.listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listening.bind(str(self.path))
        self.listening.listen(4)
        self.listening.settimeout(TIMEOUT_S)
        self.calls: list[dict[str, Any]] = []
        self.thread: threading.Thread | None = None

    def serve(self, answer: bytes) -> None:
        def one() -> None:
            try:
                conn, _ = self.listening.accept()
            except OSError:  # closed with no client: a call that never came
                return
            with conn:
                conn.settimeout(TIMEOUT_S)
                frame, _ = recv_frame(conn)
                self.calls.append(frame)
                conn.sendall(answer)

        self.thread = threading.Thread(target=one, daemon=True)
        self.thread.start()

    def wait(self) -> None:
        assert self.thread is not None
        self.thread.join(TIMEOUT_S)
        self.thread = None

    def close(self) -> None:
        self.listening.shutdown(socket.SHUT_RDWR)  # wakes an accept still waiting
        self.listening.close()
        if self.thread is not None:
            self.thread.join(TIMEOUT_S)


def answer_frame(message: Any) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return len(data).to_bytes(4, "big") + data
