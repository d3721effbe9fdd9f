"""The store bridge in a real box: `lnk box up` runs it as its own system user, its socket and
its store out of every other user's reach; only the controller's uid gets an answer; a signed
call reaches it only on an agent's socket the controller opened, from that agent's uid."""

from __future__ import annotations

import base64
import os
import pwd
import signal
import socket
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from bridge_helpers import as_uid, bridge_admin
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from lnk_shared.proof_client import ProofSigner, call_bridge

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

AGENT_UID = 299_950
STOP_S = 30.0  # the controller cleans its sandboxes before it exits; none run here


def test_box_up_runs_the_store_bridge_as_its_own_user(private_box: Any) -> None:
    with private_box() as box:
        status = box.lnk("box", "status")
        assert "bridge-store" in status.stdout and "lnk-bridge-store" in status.stdout
        user = pwd.getpwnam("lnk-bridge-store")
        pid = int((box.run_dir / "bridge-store.pid").read_text())
        assert os.stat(f"/proc/{pid}").st_uid == user.pw_uid
        for folder in (box.run_dir / "bridge-store", box.state_dir / "bridge-store"):
            info = folder.stat()
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (user.pw_uid, 0o700)
        store = (box.state_dir / "bridge-store" / "store.db").stat()
        assert stat.S_IMODE(store.st_mode) == 0o600
        assert bridge_admin(box.run_dir, {"op": "ping"}) == {
            "ok": True,
            "driver": "sqlite",
            "open": [],
        }

        def reach_admin() -> str:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(box.run_dir / "bridge-store" / "admin.sock"))
            return "connected"

        assert "PermissionError" in as_uid(AGENT_UID, reach_admin)["exception"]
        down = box.lnk("box", "down")
        assert "bridge-store: down" in down.stdout
        try:  # gone, or a zombie its reaper has not collected yet (no cmdline then)
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            cmdline = b""
        assert b"lnk_bridge_store" not in cmdline


def _stop_controller(run_dir: Path) -> None:
    """The box's controller closes every agent socket no live sandbox holds (it reconciles each
    second): the test opens one as the controller would, with no sandbox, so it stops it."""
    pid = int((run_dir / "controller.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_S
    while Path(f"/proc/{pid}").exists() and b"lnk_controller" in _cmdline(pid):
        assert time.monotonic() < deadline, "the controller did not stop"
        time.sleep(0.05)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_an_agent_socket_opened_by_the_controller_serves_only_that_agent(
    private_box: Any,
) -> None:
    with private_box() as box:
        _stop_controller(box.run_dir)
        _serves_only_that_agent(box.run_dir)


def _serves_only_that_agent(run_dir: Path) -> None:
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    agent = "e2e-agent-" + os.urandom(2).hex()
    opened = bridge_admin(
        run_dir,
        {
            "op": "open",
            "agent": agent,
            "public_key": base64.b64encode(public).decode(),
            "host_uid": AGENT_UID,
        },
    )
    assert opened["ok"] is True
    path = Path(opened["socket"])
    folders = (path.parents[2], path.parents[1])  # bridge-store/, agents/
    try:
        # On a box only a bind into the agent's sandbox reaches it; here root lets the
        # agent's uid traverse the bridge's folders for a moment, as that bind would.
        for folder in folders:
            folder.chmod(0o711)
        signer = ProofSigner(agent, key, "store")

        def acquire() -> Any:
            return call_bridge(path, signer, "lease.acquire", {"holder": "e2e", "ttl_s": 30})

        assert as_uid(AGENT_UID, acquire)["token"] == 1
        assert "refused" in as_uid(AGENT_UID + 1, acquire)["exception"]
    finally:
        for folder in folders:
            folder.chmod(0o700)
    assert bridge_admin(run_dir, {"op": "close", "agent": agent}) == {"ok": True}
    assert not path.exists()
