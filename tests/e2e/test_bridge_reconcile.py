"""Bridge sockets follow the record: an agent stopped (and removed) while the store bridge is
down has its socket closed once the bridge is back, though the bridge opens again at its start
every socket it had open."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_user import as_user
from bridge_helpers import bridge_admin

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = pytest.mark.needs_root

LNK = str(install_prefix.LNK)
SETTLE_S = 60.0  # the controller reconciles every second; a loaded machine is slow
POLL_S = 0.05


def _wait_for(what: str, done: Any, timeout: float = SETTLE_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = done()
        if value:
            return value
        time.sleep(POLL_S)
    pytest.fail(f"{what}: not within {timeout:g} s")


def _alive(pid: int) -> bool:
    try:
        return b"lnk_bridge_store" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_an_agent_stopped_while_the_bridge_is_down_loses_its_socket_once_it_is_back(
    running_box: RunningBox, private_box: Any
) -> None:
    owner = running_box.owner
    name = f"r-{os.urandom(2).hex()}"
    agent_id = f"u{owner.uid}-{name}"
    with private_box() as box:
        env = {**running_box.owner_env(), **{k: v for k, v in box.env.items() if "LNK_" in k}}

        def lnk(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                as_user(owner.uid, owner.gid, LNK, *args),
                env=env,
                cwd=str(owner.home),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        spec = owner.home / "agent-spec.toml"
        if not spec.exists():
            spec.write_text("# an agent with no grants: its home, its key and its bridge only\n")
            os.chown(spec, owner.uid, owner.gid)
        made = lnk("agent", "create", name, "--spec", str(spec))
        assert made.returncode == 0, made.stderr
        run = subprocess.Popen(
            as_user(
                owner.uid,
                owner.gid,
                LNK,
                "agent",
                "start",
                name,
                "--yes",
                "--",
                "/bin/sleep",
                "600",
            ),
            env=env,
            cwd=str(owner.home),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            sock = box.run_dir / "bridge-store" / "agents" / agent_id / "bridge.sock"
            _wait_for("the agent's socket open", sock.exists)

            def running() -> bool:
                agents = json.loads(lnk("agent", "list", "--json").stdout or "[]")
                sandboxes = json.loads(lnk("sandbox", "list", "--json").stdout or "[]")
                marked = [a["running"] for a in agents if a["name"] == name] == [True]
                return marked and [s["state"] for s in sandboxes] == ["running"]

            _wait_for("the agent running", running)
            assert bridge_admin(box.run_dir, {"op": "ping"})["open"] == [agent_id]

            pid = int((box.run_dir / "bridge-store.pid").read_text())
            os.kill(pid, signal.SIGTERM)
            _wait_for("the bridge stopped", lambda: not _alive(pid))
            stopped = lnk("agent", "stop", name)
            assert stopped.returncode == 0, stopped.stderr
            listed = json.loads(lnk("agent", "list", "--json").stdout)
            assert [a["running"] for a in listed if a["name"] == name] == [False]
            # Forgetting its store needs the bridge: refused while it is down, nothing half done.
            refused = lnk("agent", "remove", name)
            assert refused.returncode == 1 and "store bridge" in refused.stderr, refused
            listed = json.loads(lnk("agent", "list", "--json").stdout)
            assert [a["name"] for a in listed] == [name]
            removed = lnk("agent", "remove", name, "--keep-store")  # needs no bridge
            assert removed.returncode == 0, removed.stderr
            run.wait(timeout=SETTLE_S)

            up = box.lnk("box", "up")  # the bridge comes back, opening what it had open
            assert "bridge-store: up" in up.stdout, up.stdout + up.stderr
            _wait_for("the stale socket closed", lambda: not sock.exists())
            assert bridge_admin(box.run_dir, {"op": "ping"})["open"] == []
            restarted = box.lnk("box", "down"), box.lnk("box", "up")  # and stays closed
            assert all(r.returncode == 0 for r in restarted), restarted
            assert bridge_admin(box.run_dir, {"op": "ping"})["open"] == []
            assert not sock.exists()
        finally:
            if run.poll() is None:
                run.kill()
                run.wait(timeout=60)
