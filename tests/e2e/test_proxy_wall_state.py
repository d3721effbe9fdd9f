"""The proxy as a sandbox's one way out, end to end, as the sandbox's state changes: a paused
sandbox is frozen and its requests refused until it is resumed; a stop and an expired lease close
a tunnel held open inside it. A real box, a real sandbox and the test internet (`net.py`), as in
test_proxy_wall.py."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from as_owner import LNK, run_lnk, start_as_owner
from internet_box import proxy_config
from net import WWW

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

# `internet`, `netbox` and `ca_dir`: tests/e2e/conftest.py.


FROZEN_WINDOW_S = 2.0  # long enough for a running shell to read a line and curl to connect


def test_a_paused_sandbox_is_frozen_and_works_again_when_resumed(
    running_box: RunningBox, netbox: Any, internet: Any, ca_dir: Path
) -> None:
    before = internet.accepted(internet.www)
    client = start_as_owner(
        running_box,
        [
            LNK,
            "sandbox",
            "run",
            "--yes",
            f"--read={ca_dir}",
            "--command=curl",
            f"--internet-host={WWW}",
            "--",
            "/bin/sh",
            "-c",
            # It waits for the test's word on stdin, which the test gives only once the
            # sandbox is paused: the request can only be made after the pause, whatever the load.
            f"read go; curl -sS --max-time 10 http://{WWW}/",
        ],
        box=netbox,
    )
    try:
        deadline = time.monotonic() + 15
        rows: list[dict[str, Any]] = []
        while not rows and time.monotonic() < deadline:
            listed = run_lnk(running_box, "sandbox", "list", "--json", box=netbox)
            rows = [r for r in json.loads(listed.stdout or "[]") if r["state"] == "running"]
            time.sleep(0.1)
        assert rows, "the sandbox never showed as running"
        sandbox_id = rows[0]["id"]
        paused = run_lnk(running_box, "sandbox", "pause", sandbox_id, box=netbox)
        assert paused.returncode == 0, paused.stderr
        assert (netbox.run_dir / "flags" / f"{sandbox_id}.pause").exists()
        assert client.stdin is not None
        client.stdin.write("go\n")
        client.stdin.flush()
        time.sleep(FROZEN_WINDOW_S)  # a window to see nothing happen in, not a synchronisation
        assert internet.accepted(internet.www) == before
        # Frozen, the sandbox sends nothing; a request already on its way (here: written to
        # its listener, as its relay would) meets the pause flag and is refused.
        assert _through_listener(netbox, sandbox_id, WWW).startswith("HTTP/1.1 403 ")
        assert "lnk: refused (paused)" in _through_listener(netbox, sandbox_id, WWW)
        assert internet.accepted(internet.www) == before
        resumed = run_lnk(running_box, "sandbox", "resume", sandbox_id, box=netbox)
        assert resumed.returncode == 0, resumed.stderr
        out, err = client.communicate(timeout=30)
        assert client.returncode == 0, err
        assert WWW in out
        assert internet.accepted(internet.www) == before + 1
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def _through_listener(box: Any, sandbox_id: str, host: str) -> str:
    """GET http://host/ written straight to the sandbox's proxy listener (root may reach it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(box.run_dir / "proxy" / f"{sandbox_id}.sock"))
        sock.sendall(f"GET http://{host}/ HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):  # a refusal closes the connection
            answer += chunk
    return answer.decode("latin-1")


# -- wire state: stop and an expired lease close a tunnel held open inside ------------------

# Inside the sandbox: a CONNECT tunnel to www:80 through the relay, one request over it to show
# it carries bytes, then held open (idle) until something outside ends it.
HOLD = """
import os, socket, sys, time
www = sys.argv[1]
proxy = os.environ["HTTPS_PROXY"].rsplit(":", 1)
sock = socket.create_connection(("127.0.0.1", int(proxy[1])), timeout=10)
sock.sendall(f"CONNECT {www}:80 HTTP/1.1\\r\\nHost: {www}:80\\r\\n\\r\\n".encode())
answer = b""
while not answer.endswith(b"\\r\\n\\r\\n"):
    answer += sock.recv(1)
sock.sendall(f"GET / HTTP/1.1\\r\\nHost: {www}\\r\\n\\r\\n".encode())
time.sleep(0.5)
body = sock.recv(65536)
print(answer.split(b"\\r\\n")[0].decode(), www in body.decode(), os.environ["LNK_SANDBOX_ID"])
sys.stdout.flush()
sock.settimeout(None)
print("ended by peer", sock.recv(1) == b"", flush=True)
time.sleep(120)
"""


def _hold_a_tunnel(
    running_box: RunningBox, box: Any, internet: Any, ca_dir: Path
) -> tuple[subprocess.Popen[str], str, int]:
    """Start HOLD in a sandbox of `box`; (its client, the sandbox id, the tunnel's port at www)."""
    (ca_dir / "hold.py").write_text(HOLD)
    (ca_dir / "hold.py").chmod(0o644)
    before = len(internet.connections(internet.www))
    client = start_as_owner(
        running_box,
        [
            LNK,
            "sandbox",
            "run",
            "--yes",
            f"--read={ca_dir}",
            "--command=python3",
            f"--internet-host={WWW}",
            "--",
            "python3",
            f"{ca_dir}/hold.py",
            WWW,
        ],
        box=box,
        stdin=None,
    )
    assert client.stdout is not None
    ready, _, _ = select.select([client.stdout], [], [], 30)
    line = client.stdout.readline() if ready else ""
    if not line.startswith("HTTP/1.1 200 ") or " True sbx-" not in line:
        client.kill()
        _, err = client.communicate(timeout=30)
        pytest.fail(f"the tunnel did not open: {line!r} {err}")
    new = internet.connections(internet.www)[before:]
    assert len(new) == 1 and new[0].port == 80, new  # the tunnel's one connection
    return client, line.split()[-1], new[0].peer_port


def _wait_for_end(internet: Any, peer_port: int, within_s: float) -> float:
    """Seconds until www saw the connection from `peer_port` end; fails past `within_s`."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        if any(c.peer_port == peer_port for c in internet.ended(internet.www)):
            return time.monotonic() - started
        time.sleep(0.1)
    pytest.fail(f"www still holds the tunnel's connection after {within_s} s")


def test_stop_closes_a_tunnel_held_open_inside_the_sandbox(
    running_box: RunningBox, netbox: Any, internet: Any, ca_dir: Path
) -> None:
    client, sandbox_id, peer_port = _hold_a_tunnel(running_box, netbox, internet, ca_dir)
    try:
        time.sleep(1)
        assert not any(c.peer_port == peer_port for c in internet.ended(internet.www))
        stopped = run_lnk(running_box, "sandbox", "stop", sandbox_id, box=netbox, timeout=30)
        assert stopped.returncode == 0, stopped.stderr
        _wait_for_end(internet, peer_port, within_s=10)
        client.communicate(timeout=30)
        assert client.returncode != 0  # stopped, not finished
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


LEASE_S = 3  # the lease box's: short, so the test sees it run out


def test_an_expired_lease_closes_a_tunnel_held_open_inside_the_sandbox(
    running_box: RunningBox, private_box: Any, internet: Any, ca_dir: Path
) -> None:
    with private_box(f"lease_seconds = {LEASE_S}", proxy_config=proxy_config(internet)) as box:
        client, _, peer_port = _hold_a_tunnel(running_box, box, internet, ca_dir)
        try:
            _wait_for_end(internet, peer_port, within_s=LEASE_S + 15)
            client.communicate(timeout=30)
            assert client.returncode != 0
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
