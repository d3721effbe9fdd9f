"""Helpers for the bridge's socket tests: calls made by a forked child under another uid (so
SO_PEERCRED is that uid's, as for a sandbox), and a bridge run as a real process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

import lnk_bridge_store
import lnk_shared
from lnk_shared.proof_client import ProofSigner, encode_body
from lnk_shared.unix import recv_frame, send_frame

CHILD_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TestAgent:
    name: str
    key: Ed25519PrivateKey
    uid: int

    @property
    def public_raw(self) -> bytes:
        return self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def signer(self, audience: str = "store") -> ProofSigner:
        return ProofSigner(self.name, self.key, audience)

    def frame(self, action: str, args: dict[str, Any], audience: str = "store") -> dict[str, Any]:
        return self.signer(audience).sign(action, encode_body(args))


def in_child_as(uid: int, work: Callable[[], Any]) -> Any:
    """Run `work` in a forked child with uid and gid `uid` (no groups); its JSON result, or
    {"exception": text} when it raised."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            try:
                result: Any = work()
            except Exception as exc:
                result = {"exception": f"{type(exc).__name__}: {exc}"}
            os.write(write_end, json.dumps(result).encode())
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as pipe:
        chunks.append(pipe.read())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child failed before answering"
    return json.loads(b"".join(chunks) or b"null")


def exchange(path: Path, frames: list[dict[str, Any] | bytes]) -> list[Any]:
    """Send each frame on one connection, read a reply after each; "closed" once it closes."""
    replies: list[Any] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(CHILD_TIMEOUT_S)
        sock.connect(str(path))
        for frame in frames:
            try:
                if isinstance(frame, bytes):
                    sock.sendall(frame)
                else:
                    send_frame(sock, frame)
                replies.append(recv_frame(sock)[0])
            except (EOFError, OSError):
                replies.append("closed")
    return replies


def raw_frame(payload: bytes, length: int | None = None) -> bytes:
    return struct.pack(">I", len(payload) if length is None else length) + payload


def short_tempdir(prefix: str) -> Path:
    # Short: a unix socket's path holds 107 bytes, and pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path


def open_to_children(bridge_dir: Path) -> None:
    """Let other uids traverse to the agents' sockets. On a box the folder stays 0700 and the
    controller binds each agent's socket into its sandbox; these tests connect by path."""
    for folder in (bridge_dir, bridge_dir / "agents"):
        if folder.exists():
            folder.chmod(0o711)


class BridgeProcess:
    """`python -m lnk_bridge_store` from this checkout, as `nobody`, in a temp box."""

    def __init__(self, root: Path) -> None:
        import pwd

        self.root = root
        self.user = pwd.getpwnam("nobody")
        for sub in ("etc", "state", "run"):
            (root / sub).mkdir(exist_ok=True)
            os.chown(root / sub, self.user.pw_uid, self.user.pw_gid)
        self.bridge_dir = root / "run" / "bridge-store"
        self.admin_socket = self.bridge_dir / "admin.sock"
        self.log = root / "bridge.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        sources = {
            str(Path(module.__file__ or "").resolve().parent.parent)
            for module in (lnk_bridge_store, lnk_shared)
        }
        env = {
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": ":".join(sorted(sources)),
            "LNK_CONFIG_DIR": str(self.root / "etc"),
            "LNK_STATE_DIR": str(self.root / "state"),
            "LNK_RUN_DIR": str(self.root / "run"),
        }
        argv = [
            "/usr/bin/setpriv",
            f"--reuid={self.user.pw_uid}",
            f"--regid={self.user.pw_gid}",
            "--clear-groups",
            "--",
            sys.executable,
            "-m",
            "lnk_bridge_store",
        ]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                argv, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd="/"
            )
        deadline = time.monotonic() + 20
        while not self._answers():  # a killed bridge leaves its socket file: ask, not look
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the bridge did not start: {self.log.read_text()}")
            time.sleep(0.02)
        open_to_children(self.bridge_dir)

    def _answers(self) -> bool:
        try:
            return bool(self.admin({"op": "ping"}).get("ok"))
        except (OSError, AttributeError):
            return False

    def admin(self, command: dict[str, Any]) -> dict[str, Any]:
        return dict(exchange(self.admin_socket, [command])[0])

    def open_agent(self, agent: TestAgent) -> Path:
        import base64

        reply = self.admin(
            {
                "op": "open",
                "agent": agent.name,
                "public_key": base64.b64encode(agent.public_raw).decode(),
                "host_uid": agent.uid,
            }
        )
        assert reply["ok"] is True, reply
        open_to_children(self.bridge_dir)
        return Path(reply["socket"])

    def kill(self, signum: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)
            self.process.wait(timeout=20)
        self.process = None


@pytest.fixture(scope="module")
def bridge_process() -> Iterator[BridgeProcess]:
    """One bridge per module (it takes a second or two to start): each test uses agents of
    its own names, and a test that kills it starts it again."""
    root = short_tempdir("lnkbs")
    bridge = BridgeProcess(root)
    try:
        bridge.start()
        yield bridge
    finally:
        bridge.kill(signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


def new_agent(name: str, uid: int) -> TestAgent:
    """A fresh key under a fresh name (`name` plus a random suffix): tests sharing a bridge
    never see each other's rows."""
    return TestAgent(f"{name}-{os.urandom(3).hex()}", Ed25519PrivateKey.generate(), uid)


def named_agent(agent_id: str, uid: int) -> TestAgent:
    """A fresh key under exactly `agent_id` (e.g. `u1000-alice`, an owner's agent's id)."""
    return TestAgent(agent_id, Ed25519PrivateKey.generate(), uid)


@dataclass(frozen=True)
class Kit:
    """The helpers above, for test modules (conftest is not importable under importlib)."""

    in_child_as: Callable[[int, Callable[[], Any]], Any] = in_child_as
    exchange: Callable[[Path, list[dict[str, Any] | bytes]], list[Any]] = exchange
    raw_frame: Callable[..., bytes] = raw_frame
    new_agent: Callable[[str, int], TestAgent] = new_agent
    named_agent: Callable[[str, int], TestAgent] = named_agent
    short_tempdir: Callable[[str], Path] = short_tempdir
    open_to_children: Callable[[Path], None] = open_to_children


@pytest.fixture
def kit() -> Kit:
    return Kit()
