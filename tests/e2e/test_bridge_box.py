"""The store bridge in a real box: `lnk box up` runs it as its own system user, its socket and
its store out of every other user's reach; only the controller's uid gets an answer; a signed
call reaches it only on an agent's socket the controller opened, from that agent's uid."""

from __future__ import annotations

import base64
import os
import pwd
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
from bridge_helpers import as_uid, bridge_admin
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from lnk_shared.proof_client import ProofSigner, call_bridge

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

AGENT_UID = 299_950


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


def test_an_agent_socket_opened_by_the_controller_serves_only_that_agent(
    running_box: Any,
) -> None:
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    run_dir, agent = running_box.run_dir, "e2e-agent-" + os.urandom(2).hex()
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
