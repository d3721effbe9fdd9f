"""The SSH gate end to end, the ways around a sandbox: `-W`, `-L` (TCP and a unix socket),
`-R`, `-A`, `-X`, `-w` and a session's own network, each refused, nothing reaching the host; a
user outside the gate on the same sshd is the control that shows each refusal is the gate's.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest
from sshd import (
    WAIT_S,
    BoxUser,
    GateSshd,
    RunningBox,
    free_port,
    gate_sshd,
    let_in,
)
from sshd_process import stop

pytestmark = pytest.mark.needs_root


@pytest.fixture(scope="module")
def sshd() -> Iterator[GateSshd]:
    with gate_sshd() as server:
        yield server


@pytest.fixture(scope="module")
def user(running_box: RunningBox, sshd: GateSshd) -> BoxUser:
    return let_in(running_box, sshd)


# -- no way around the sandbox ------------------------------------------------------------------


class _Listener:
    """A TCP listener on the host that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[_Listener]:
    target = _Listener()
    try:
        yield target
    finally:
        target.close()


def test_a_session_reaches_no_network_the_spec_does_not_open(
    sshd: GateSshd, user: BoxUser, listener: _Listener
) -> None:
    probe = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {listener.port}), timeout=3)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )
    result = sshd.ssh(user, command=f'python3 -c "{probe}"')
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("refused")
    assert listener.accepted == 0


def test_stdio_forwarding_W_is_refused(sshd: GateSshd, user: BoxUser, listener: _Listener) -> None:
    result = sshd.ssh(user, "-W", f"127.0.0.1:{listener.port}", input="x", stdin=None)
    assert result.returncode != 0
    assert "stdio forwarding failed" in result.stderr
    assert listener.accepted == 0


@pytest.fixture(scope="module")
def plain(sshd: GateSshd) -> BoxUser:
    """A user outside the gate on the same sshd: the control for every refusal."""
    return sshd.add_plain_user()


def test_control_the_test_sshd_lets_others_forward(
    sshd: GateSshd, listener: _Listener, plain: BoxUser
) -> None:
    """The refusals above are the gate's: a user outside it forwards through this same sshd."""
    result = sshd.ssh(plain, "-W", f"127.0.0.1:{listener.port}", stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    deadline = time.monotonic() + WAIT_S
    while listener.accepted == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listener.accepted == 1


def _forward_then_connect(
    sshd: GateSshd, user: BoxUser, forward: list[str], local_port: int
) -> bytes:
    process = subprocess.Popen(
        [*sshd.ssh_argv(user, "-N", *forward)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    got = b""
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", local_port)) == 0:
                    s.settimeout(5)
                    with suppress(OSError):
                        got = s.recv(100)
                    break
            time.sleep(0.1)
        else:
            pytest.fail("ssh -L never listened")
    finally:
        stop(process)
    return got


def test_local_forwarding_L_is_refused(sshd: GateSshd, user: BoxUser, listener: _Listener) -> None:
    port = free_port()
    got = _forward_then_connect(
        sshd, user, ["-L", f"127.0.0.1:{port}:127.0.0.1:{listener.port}"], port
    )
    assert got == b""
    assert listener.accepted == 0


def test_local_forwarding_L_to_a_unix_socket_is_refused(sshd: GateSshd, user: BoxUser) -> None:
    path = sshd.root / f"target-{secrets.token_hex(3)}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(0.5)
    try:
        port = free_port()
        got = _forward_then_connect(sshd, user, ["-L", f"127.0.0.1:{port}:{path}"], port)
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
        path.unlink(missing_ok=True)
    assert got == b""


def test_remote_forwarding_R_is_refused(sshd: GateSshd, user: BoxUser, listener: _Listener) -> None:
    port = free_port()
    result = sshd.ssh(
        user,
        "-o",
        "ExitOnForwardFailure=yes",
        "-R",
        f"127.0.0.1:{port}:127.0.0.1:{listener.port}",
        command="sleep 3",
    )
    assert result.returncode != 0
    assert "forwarding failed" in result.stderr
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens on the host


def test_agent_forwarding_A_is_refused(sshd: GateSshd, user: BoxUser, plain: BoxUser) -> None:
    agent = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True)
    env = dict(os.environ)
    for name in ("SSH_AUTH_SOCK", "SSH_AGENT_PID"):
        env[name] = re.search(rf"{name}=([^;]+);", agent.stdout).group(1)  # type: ignore[union-attr]
    try:
        result = sshd.ssh(user, "-A", command='echo "[$SSH_AUTH_SOCK]"', env=env)
        leftovers = [p for p in Path("/tmp").glob("ssh-*") if p.stat().st_uid == user.uid]
        control = sshd.ssh(plain, "-A", command='echo "[$SSH_AUTH_SOCK]"', env=env)
    finally:
        subprocess.run(["ssh-agent", "-k"], env=env, capture_output=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"
    assert leftovers == []  # no agent socket made for the box user on the host
    assert control.stdout.startswith("[/tmp/ssh-"), control.stderr  # others get the agent


def test_x11_forwarding_X_is_refused(sshd: GateSshd, user: BoxUser, plain: BoxUser) -> None:
    env = {**os.environ, "DISPLAY": ":99"}
    result = sshd.ssh(user, "-X", command='echo "[$DISPLAY]"', env=env)
    assert result.stdout == "[]\n", result.stderr
    assert "X11 forwarding request failed" in result.stderr
    control = sshd.ssh(plain, "-X", command='echo "[$DISPLAY]"', env=env)
    assert control.stdout.startswith("[localhost:"), control.stderr  # others get a display


def test_tunnel_w_is_refused(sshd: GateSshd, user: BoxUser, plain: BoxUser) -> None:
    """sshd refuses before it opens any tun device; for a user outside the gate the same
    sshd tries to open one (and fails here only for want of a device in this machine)."""
    options = ("-v", "-o", "ExitOnForwardFailure=yes", "-w", "any:any")
    result = sshd.ssh(user, *options, command="echo ran")
    assert "ran" not in result.stdout
    assert result.returncode != 0
    assert "Remote: Server has rejected tunnel device forwarding" in result.stderr
    assert "Failed to open the tunnel device" not in result.stderr
    control = sshd.ssh(plain, *options, command="echo ran")
    assert "Failed to open the tunnel device" in control.stderr, control.stderr
