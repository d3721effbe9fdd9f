"""The SSH gate end to end: a real OpenSSH sshd on a loopback port (tests/e2e/sshd.py), real box
users whose key lines `lnk box authorize` writes, OpenSSH's ssh/scp/sftp and paramiko as
clients, and the session's box (`running_box`) behind `lnk sandbox enter`.

Every session runs in a sandbox: commands, shells, scp and sftp; the ways around it (port and
socket forwarding, agent, X11, tun) are refused by sshd; the box user's login files and the
key files stay out of reach; a spec edited between sessions rules the next one.
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
from typing import Any

import pytest
from sshd import BoxUser, GateSshd, free_port

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = pytest.mark.needs_root

PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
LNK = PREFIX / "venv" / "bin" / "lnk"
WAIT_S = 20.0
TOOLS = ["/bin/bash", "id", "hostname", "cat", "touch", "ls", "scp", "tty", "python3", "stty"]
TOOLS += ["sleep", "mkdir"]


def spec_text(*, commands: list[str] = TOOLS, extra: str = "") -> str:
    allow = ", ".join(f'"{c}"' for c in commands)
    return f"[commands]\nallow = [{allow}]\n{extra}"


def authorize(box: RunningBox, sshd: GateSshd, user: BoxUser, *extra: str) -> str:
    result = subprocess.run(
        [
            str(LNK),
            "box",
            "authorize",
            "--user",
            user.name,
            "--spec",
            str(user.spec),
            "--folder",
            str(user.folder),
            "--key",
            f"{user.key}.pub",
            "--run-dir",
            str(box.run_dir),
            "--keys-dir",
            str(sshd.keys_dir),
            *extra,
        ],
        env=box.env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def sshd() -> Iterator[GateSshd]:
    tag = secrets.token_hex(4)
    server = GateSshd(Path(f"/run/lnk-sshd-{tag}"), Path(f"/srv/lnk-gate-{tag}"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def user(running_box: RunningBox, sshd: GateSshd) -> BoxUser:
    """A box user whose key is let in, its sessions under a spec with the usual tools."""
    box_user = sshd.add_user(spec_text())
    authorize(running_box, sshd, box_user)
    return box_user


# -- the line the generator wrote ---------------------------------------------------------------


def test_authorize_writes_a_root_owned_line_and_makes_the_shell_sh(
    running_box: RunningBox, sshd: GateSshd, user: BoxUser
) -> None:
    path = sshd.keys_dir / user.name
    info = path.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (0, 0, 0o644)
    (line,) = path.read_text().splitlines()
    assert line.startswith(
        f'restrict,pty,command="{LNK} sandbox enter --spec {user.spec} --folder {user.folder} '
        f'--run-dir {running_box.run_dir}" ssh-ed25519 '
    )
    assert line.endswith(f" {user.name}@test")
    with open("/etc/passwd", encoding="utf-8") as f:
        entry = next(x for x in f if x.startswith(f"{user.name}:"))
    assert entry.rstrip("\n").endswith(":/bin/sh")
    listed = subprocess.run(
        [str(LNK), "box", "authorize", "--list", "--keys-dir", str(sshd.keys_dir)],
        env=running_box.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"{user.name}  SHA256:" in listed


# -- a command runs in the sandbox, and only there -------------------------------------------------


def test_a_command_runs_in_the_sandbox(sshd: GateSshd, user: BoxUser) -> None:
    result = sshd.ssh(user, command="id -u; hostname; pwd")
    assert result.returncode == 0, result.stderr
    uid, hostname, cwd = result.stdout.split()
    assert int(uid) != user.uid  # a fresh sandbox user, not the box user
    assert hostname == "lnk-sandbox"
    assert cwd == str(user.folder)


def test_the_command_string_is_never_run_outside(sshd: GateSshd, user: BoxUser) -> None:
    marks = [Path(f"/tmp/lnk-pwn-{secrets.token_hex(4)}") for _ in range(3)]
    try:
        result = sshd.ssh(user, command=f"true; id > {marks[0]}; echo ran")
        assert result.stdout == "ran\n", result.stderr  # it ran: inside, on the sandbox's /tmp
        shellshock = f"() {{ :;}}; /usr/bin/touch {marks[1]}"
        sshd.ssh(user, command=shellshock)
        sshd.ssh(
            user,
            "-o",
            "SendEnv=LC_PWN",
            command="true",
            env={**os.environ, "LC_PWN": f"() {{ :;}}; /usr/bin/touch {marks[2]}"},
        )
        assert [m for m in marks if m.exists()] == []
    finally:
        for mark in marks:
            mark.unlink(missing_ok=True)


def test_the_environment_is_an_allowlist(sshd: GateSshd, user: BoxUser) -> None:
    result = sshd.ssh(
        user,
        "-o",
        "SendEnv=LANG LC_TIME",
        command='echo "[$SSH_CONNECTION][$SSH_CLIENT][$SSH_ORIGINAL_COMMAND][$LANG][$LC_TIME]"',
        env={**os.environ, "LANG": "C.UTF-8", "LC_TIME": "C"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[][][][C.UTF-8][C]\n"


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


def test_stdio_forwarding_W_is_refused(sshd: GateSshd, user: BoxUser, listener: _Listener) -> None:
    result = sshd.ssh(user, "-W", f"127.0.0.1:{listener.port}", input="x", stdin=None)
    assert result.returncode != 0
    assert "stdio forwarding failed" in result.stderr
    assert listener.accepted == 0


def test_control_the_test_sshd_lets_others_forward(sshd: GateSshd, listener: _Listener) -> None:
    """The refusals above are the gate's: a user outside it forwards through this same sshd."""
    plain = sshd.add_plain_user()
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
        process.terminate()
        process.communicate(timeout=10)
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


def test_agent_forwarding_A_is_refused(sshd: GateSshd, user: BoxUser) -> None:
    agent = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True)
    env = dict(os.environ)
    for name in ("SSH_AUTH_SOCK", "SSH_AGENT_PID"):
        env[name] = re.search(rf"{name}=([^;]+);", agent.stdout).group(1)  # type: ignore[union-attr]
    try:
        result = sshd.ssh(user, "-A", command='echo "[$SSH_AUTH_SOCK]"', env=env)
        leftovers = [p for p in Path("/tmp").glob("ssh-*") if p.stat().st_uid == user.uid]
    finally:
        subprocess.run(["ssh-agent", "-k"], env=env, capture_output=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"
    assert leftovers == []  # no agent socket made for the box user on the host


def test_x11_forwarding_X_is_refused(sshd: GateSshd, user: BoxUser) -> None:
    env = {**os.environ, "DISPLAY": ":99"}
    result = sshd.ssh(user, "-X", command='echo "[$DISPLAY]"', env=env)
    assert result.stdout == "[]\n", result.stderr
    assert "X11 forwarding request failed" in result.stderr


def test_tunnel_w_is_refused(sshd: GateSshd, user: BoxUser) -> None:
    result = sshd.ssh(user, "-o", "ExitOnForwardFailure=yes", "-w", "any:any", command="echo ran")
    assert "ran" not in result.stdout
    assert result.returncode != 0
    assert "tunnel" in result.stderr.lower()
