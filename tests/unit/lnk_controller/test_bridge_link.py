"""The controller's side of the store bridge's admin socket, against a real bridge served in
this process (this process is root: the controller's uid), and with no bridge at all."""

from __future__ import annotations

import base64
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from lnk_controller import bridge_link
from lnk_shared.errors import StateError
from lnk_shared.waking_event import WakingEvent

pytestmark = pytest.mark.needs_root

PUBLIC = base64.b64encode(
    Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
).decode()


@pytest.fixture
def run_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lnkbl", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def bridge(run_dir: Path) -> Iterator[Path]:
    from lnk_bridge_store.admin import serve_admin
    from lnk_bridge_store.config import StoreConfig
    from lnk_bridge_store.db import open_store
    from lnk_bridge_store.server import BridgeServer
    from lnk_bridge_store.store import Store

    config = StoreConfig(
        config_dir=run_dir,
        state_dir=run_dir,
        run_dir=run_dir,
        database_url=f"sqlite:///{run_dir}/s.db",
    )
    engine = open_store(config.database_url)
    server = BridgeServer(config, Store(engine, "test"))
    stop = WakingEvent()  # what the bridge's admin loop sleeps on beside its socket
    thread = threading.Thread(target=serve_admin, args=(server, stop), daemon=True)
    thread.start()
    while not config.admin_socket.exists():
        time.sleep(0.01)
    yield run_dir
    stop.set()
    thread.join(timeout=10)
    stop.close()
    server.close_all()
    engine.dispose()


def test_open_send_close_through_a_real_bridge(bridge: Path) -> None:
    path = bridge_link.open_agent(bridge, "u1000-helper", PUBLIC, 200_001)
    assert path == bridge / "bridge-store" / "agents" / "u1000-helper" / "bridge.sock"
    assert path.exists()
    assert bridge_link.send_message(bridge, "u1000-helper", "owner", "hi") == 1
    bridge_link.close_agent(bridge, "u1000-helper")
    assert not path.exists()
    bridge_link.close_agent(bridge, "u1000-helper")  # again: nothing to close is not an error


def test_a_refused_open_is_a_state_error(bridge: Path) -> None:
    small_order = base64.b64encode(bytes([1]) + bytes(31)).decode()
    with pytest.raises(StateError, match="small order"):
        bridge_link.open_agent(bridge, "u1000-helper", small_order, 200_001)


def test_without_a_bridge_sending_fails_and_closing_still_removes_the_socket(
    run_dir: Path,
) -> None:
    with pytest.raises(StateError, match="lnk box up"):
        bridge_link.send_message(run_dir, "u1000-helper", "owner", "hi")
    left = run_dir / "bridge-store" / "agents" / "u1000-helper" / "bridge.sock"
    left.parent.mkdir(parents=True)
    left.write_text("")
    bridge_link.close_agent(run_dir, "u1000-helper")
    assert not left.exists() and not left.parent.exists()


def test_an_agent_left_running_without_a_sandbox_is_stopped_and_closed_at_start(
    bridge: Path, tmp_path: Path
) -> None:
    from lnk_controller.agent_launch import reconcile_agents
    from lnk_controller.agents import AgentRegistry
    from lnk_controller.config import ControllerConfig
    from lnk_controller.db import open_database
    from lnk_controller.sandbox_store import SandboxStore

    engine = open_database(tmp_path / "db" / "controller.db")
    try:
        registry = AgentRegistry(engine, tmp_path / "keys")
        agent = registry.create(1000, "helper", "/spec.toml")
        idle = registry.create(1000, "idle", "/spec.toml")
        registry.set_running(agent.agent_id, 200_001)  # its sandbox was cleaned meanwhile
        path = bridge_link.open_agent(bridge, agent.agent_id, agent.public_key, 200_001)
        cfg = ControllerConfig(run_dir=bridge, state_dir=tmp_path, config_dir=tmp_path)
        assert reconcile_agents(cfg, SandboxStore(engine), registry) == 1
        assert not path.exists()
        assert [a.running for a in registry.find(1000)] == [False, False]
        assert idle.host_uid is None
    finally:
        engine.dispose()
