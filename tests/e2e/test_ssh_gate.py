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

import paramiko
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


# -- scp and sftp: inside F only ------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["-O", "-s"], ids=["scp-protocol", "sftp-protocol"])
def test_scp_both_ways_works_inside_the_folder(
    sshd: GateSshd, user: BoxUser, tmp_path: Path, protocol: str
) -> None:
    payload = secrets.token_hex(16)
    local = tmp_path / "up.txt"
    local.write_text(payload)
    name = f"scp-{protocol[1:]}-{secrets.token_hex(3)}.txt"
    target = f"{user.name}@127.0.0.1:{user.folder}/{name}"
    up = subprocess.run(
        ["scp", protocol, *sshd.client_options(user), str(local), target],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    assert (user.folder / name).read_text() == payload
    assert (user.folder / name).stat().st_uid == user.uid  # the box user's, not the sandbox's
    back = tmp_path / "down.txt"
    down = subprocess.run(
        ["scp", protocol, *sshd.client_options(user), target, str(back)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert down.returncode == 0, down.stderr
    assert back.read_text() == payload


@pytest.mark.parametrize("protocol", ["-O", "-s"], ids=["scp-protocol", "sftp-protocol"])
def test_scp_cannot_read_shadow_or_write_outside_the_folder(
    sshd: GateSshd, user: BoxUser, tmp_path: Path, protocol: str
) -> None:
    local = tmp_path / "x"
    local.write_text("pwned\n")
    shadow = subprocess.run(
        [
            "scp",
            protocol,
            *sshd.client_options(user),
            f"{user.name}@127.0.0.1:/etc/shadow",
            str(tmp_path / "s"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shadow.returncode != 0
    assert not (tmp_path / "s").exists()
    before = _home_state(user)
    for outside in (f"{user.home}/.bashrc", f"{sshd.data}/planted"):
        result = subprocess.run(
            [
                "scp",
                protocol,
                *sshd.client_options(user),
                str(local),
                f"{user.name}@127.0.0.1:{outside}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode != 0, outside
    assert _home_state(user) == before
    assert not (sshd.data / "planted").exists()


def _sftp(sshd: GateSshd, user: BoxUser, batch: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sftp", *sshd.client_options(user), "-b", "-", f"{user.name}@127.0.0.1"],
        input=batch,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_sftp_works_inside_the_folder_only(sshd: GateSshd, user: BoxUser, tmp_path: Path) -> None:
    payload = secrets.token_hex(16)
    (tmp_path / "in.txt").write_text(payload)
    name = f"sftp-{secrets.token_hex(3)}.txt"
    ok = _sftp(
        sshd,
        user,
        f"put {tmp_path}/in.txt {user.folder}/{name}\n"
        f"get {user.folder}/{name} {tmp_path}/out.txt\n",
    )
    assert ok.returncode == 0, ok.stderr
    assert (user.folder / name).read_text() == payload
    assert (tmp_path / "out.txt").read_text() == payload
    before, key_line = _home_state(user), (sshd.keys_dir / user.name).read_bytes()
    # One session: `-` lets the batch go on after a refusal; each is judged by its effect.
    refused = _sftp(
        sshd,
        user,
        f"-get /etc/shadow {tmp_path}/shadow\n"
        f"-put {tmp_path}/in.txt {user.home}/.bashrc\n"
        f"-put {tmp_path}/in.txt {user.home}/.ssh/authorized_keys\n"
        f"-mkdir {user.home}/.ssh\n"
        f"-put {tmp_path}/in.txt {sshd.data}/x\n"
        f"-put {tmp_path}/in.txt {sshd.keys_dir}/{user.name}\n",
    )
    assert refused.returncode == 0, refused.stderr  # the session ran, each step refused
    assert "/etc/shadow" in refused.stderr
    assert not (tmp_path / "shadow").exists()
    assert not (sshd.data / "x").exists()
    assert _home_state(user) == before
    assert (sshd.keys_dir / user.name).read_bytes() == key_line


# -- the box user's login files and the key file stay out of reach --------------------------------


def _home_state(user: BoxUser) -> dict[str, bytes]:
    """Every file under the box user's home, with its bytes."""
    state = {}
    for path in sorted(user.home.rglob("*")):
        if path.is_file():
            state[str(path)] = path.read_bytes()
        else:
            state[str(path)] = b"<dir>"
    return state


def test_a_session_cannot_write_login_files_or_the_key_file(sshd: GateSshd, user: BoxUser) -> None:
    home = user.home
    keys = sshd.keys_dir / user.name
    before, key_line = _home_state(user), keys.read_bytes()
    script = "; ".join(
        f"(echo pwned >> {path}) 2>/dev/null && echo wrote {path}"
        for path in (
            f"{home}/.bashrc",
            f"{home}/.profile",
            f"{home}/.pam_environment",
            f"{home}/.ssh/authorized_keys",
            f"{home}/.ssh/rc",
            str(keys),
        )
    )
    result = sshd.ssh(user, command=f"{script}; mkdir -p {home}/.ssh 2>/dev/null; echo done")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "done"
    assert "wrote" not in result.stdout  # what it wrote, if anything, was the sandbox's own
    assert _home_state(user) == before
    assert keys.read_bytes() == key_line


def test_a_key_planted_in_the_home_does_not_let_anyone_in(sshd: GateSshd, user: BoxUser) -> None:
    """Only root's key file counts for box users: a key in ~/.ssh/authorized_keys (no forced
    command) is not read, so it cannot open a shell outside the sandbox."""
    planted = sshd.root / "client" / f"planted-{secrets.token_hex(3)}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(planted)], check=True)
    ssh_dir = user.home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(Path(f"{planted}.pub").read_text())
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(ssh_dir)], check=True)
    try:
        argv = [*sshd.ssh_argv(user, key=planted), "id -u"]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    finally:
        subprocess.run(["rm", "-rf", str(ssh_dir)], check=True)
    assert result.returncode == 255
    assert "Permission denied" in result.stderr
    assert result.stdout == ""


# -- terminal -------------------------------------------------------------------------------------


def _shell(sshd: GateSshd, user: BoxUser, width: int = 80, height: int = 24) -> tuple[Any, Any]:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # the test's own sshd
    client.connect(
        "127.0.0.1",
        port=sshd.port,
        username=user.name,
        key_filename=str(user.key),
        allow_agent=False,
        look_for_keys=False,
        timeout=WAIT_S,
    )
    channel = client.invoke_shell(term="xterm", width=width, height=height)
    channel.settimeout(WAIT_S)
    return client, channel


def _read_until(channel: Any, pattern: str, seen: list[str]) -> str:
    deadline = time.monotonic() + WAIT_S
    while not re.search(pattern, "".join(seen)):
        if time.monotonic() > deadline:
            pytest.fail(f"never saw {pattern!r} in {''.join(seen)!r}")
        if channel.recv_ready():
            seen.append(channel.recv(65536).decode(errors="replace"))
        else:
            time.sleep(0.02)
    return "".join(seen)


def test_a_shell_with_a_pty_gets_the_terminal_job_control_and_window_size(
    sshd: GateSshd, user: BoxUser
) -> None:
    client, channel = _shell(sshd, user, width=100, height=30)
    try:
        seen: list[str] = []
        _read_until(channel, r"\$ $", seen)  # the prompt: typed-ahead input may be dropped
        channel.send(b"tty; stty size; echo mark-$((6*7))\n")
        text = _read_until(channel, r"mark-42", seen)
        assert "not a tty" not in text, text
        assert "30 100" in text
        assert "no job control" not in text
        channel.send(b"sleep 30 & jobs; kill %1; echo jobs-done\n")
        text = _read_until(channel, r"jobs-done\r?\n", seen)
        assert re.search(r"\[1\]\+?\s+Running\s+sleep 30", text), text
        channel.resize_pty(width=120, height=40)
        # sshd resizes its pty, SIGWINCH reaches the client, which resizes the sandbox's: ask
        # until the new size shows (a loaded machine may take a moment; 30 100 until then).
        deadline = time.monotonic() + WAIT_S
        while "40 120" not in "".join(seen):
            assert time.monotonic() < deadline, "".join(seen)
            channel.send(b"stty size\n")
            time.sleep(0.5)
            while channel.recv_ready():
                seen.append(channel.recv(65536).decode(errors="replace"))
        channel.send(b"exit 7\n")
        deadline = time.monotonic() + WAIT_S
        while not channel.exit_status_ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert channel.recv_exit_status() == 7
    finally:
        client.close()


PTS_PROBE = "import os; print(os.major(os.fstat(0).st_rdev), os.isatty(0))"
PTY_SLAVE_MAJORS = range(136, 144)  # Linux's Unix98 pty secondaries (devices.txt)


def test_ssh_tt_gets_a_pts_in_the_sandbox(sshd: GateSshd, user: BoxUser) -> None:
    """bwrap binds the session's terminal at /dev/console (its /dev/pts is a new instance),
    so `tty` names /dev/console; the device itself is a pts, which the probe checks."""
    result = sshd.ssh(user, "-tt", command=f"tty; id -u; python3 -c '{PTS_PROBE}'")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.replace("\r", "").splitlines()
    assert lines[0] in ("/dev/console",) or lines[0].startswith("/dev/pts/"), result.stdout
    assert int(lines[1]) != user.uid
    major, isatty = lines[2].split()
    assert int(major) in PTY_SLAVE_MAJORS
    assert isatty == "True"


def test_no_command_and_no_pty_is_a_login_bash_reading_stdin(sshd: GateSshd, user: BoxUser) -> None:
    result = sshd.ssh(
        user, "-T", input="echo shell-$((20+22)); shopt -q login_shell && echo login\n", stdin=None
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == ["shell-42", "login"]


TIOCSTI_PROBE = (
    "import errno, fcntl, os, termios\n"
    "for fd in (0, 1, 2):\n"
    "    try:\n"
    '        fcntl.ioctl(fd, termios.TIOCSTI, b"X")\n'
    '        print(fd, "pushed")\n'
    "    except OSError as exc:\n"
    "        print(fd, errno.errorcode[exc.errno])\n"
    "try:\n"
    '    os.open("/dev/tty", os.O_RDWR)\n'
    '    print("tty opened")\n'
    "except OSError as exc:\n"
    '    print("tty", errno.errorcode[exc.errno])\n'
)


def test_a_command_without_a_pty_has_no_terminal_and_tiocsti_fails(
    sshd: GateSshd, user: BoxUser
) -> None:
    result = sshd.ssh(user, "-T", command=f"tty; python3 -c '{TIOCSTI_PROBE}'")
    assert result.returncode != 0 or "not a tty" in result.stdout
    lines = result.stdout.splitlines()
    assert lines[0] == "not a tty"
    assert "pushed" not in result.stdout
    assert "tty opened" not in result.stdout  # a new session: no controlling terminal


def _pids_running(argv: list[str]) -> list[int]:
    wanted = "\0".join(argv).encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read() == wanted:
                    found.append(int(entry))
    return found


@pytest.mark.parametrize("tty", [False, True], ids=["no-pty", "pty"])
def test_a_dropped_connection_ends_the_sandbox(sshd: GateSshd, user: BoxUser, tty: bool) -> None:
    mark = f"{60 + secrets.randbelow(10_000) / 10_000:.4f}"  # a sleep no one else runs
    late = user.folder / f"late-{mark}"
    process = subprocess.Popen(
        [*sshd.ssh_argv(user, "-tt" if tty else "-T"), f"sleep {mark}; touch {late}"],
        stdin=subprocess.PIPE if tty else subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not _pids_running(["sleep", mark]):
            assert time.monotonic() < deadline, "the session's program never started"
            time.sleep(0.1)
    finally:
        process.kill()  # the client vanishes: no exit, no EOF sent on purpose
        process.wait()
        if process.stdin is not None:
            process.stdin.close()
    deadline = time.monotonic() + WAIT_S
    while _pids_running(["sleep", mark]):
        assert time.monotonic() < deadline, "the sandbox outlived its connection"
        time.sleep(0.1)
    assert not late.exists()


# -- the spec, at each session ------------------------------------------------------------------


def test_a_spec_edited_between_sessions_rules_the_next_one(
    running_box: RunningBox, sshd: GateSshd
) -> None:
    edited = sshd.add_user(spec_text())
    authorize(running_box, sshd, edited)
    data = sshd.data / f"shared-{edited.name}"
    data.mkdir(mode=0o755)
    (data / "notes.txt").write_text("from the admin\n")
    first = sshd.ssh(edited, command=f"cat {data}/notes.txt")
    assert first.returncode != 0
    assert "from the admin" not in first.stdout
    edited.spec.write_text(spec_text(extra=f'[folders]\nread = ["{data}"]\n'))
    second = sshd.ssh(edited, command=f"cat {data}/notes.txt")  # no question asked: root chose
    assert second.returncode == 0, second.stderr
    assert second.stdout == "from the admin\n"
    edited.spec.write_text(spec_text(commands=["id"]))
    third = sshd.ssh(edited, command=f"cat {data}/notes.txt")
    assert third.returncode != 0
    assert "/bin/bash" in third.stderr


def test_read_home_still_hides_the_box_settings_and_agents(
    running_box: RunningBox, sshd: GateSshd
) -> None:
    reader = sshd.add_user(spec_text(extra='[folders]\nread = ["~"]\n'))
    authorize(running_box, sshd, reader)
    secret = secrets.token_hex(8)
    for rel in ("visible.txt", ".lnk/settings", "Link/Agents/a1/key"):
        path = reader.home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{secret}\n")
    subprocess.run(["chown", "-R", f"{reader.uid}:{reader.gid}", str(reader.home)], check=True)
    visible = sshd.ssh(reader, command=f"cat {reader.home}/visible.txt")
    assert visible.stdout == f"{secret}\n", visible.stderr
    hidden = sshd.ssh(
        reader, command=f"cat {reader.home}/.lnk/settings {reader.home}/Link/Agents/a1/key"
    )
    assert secret not in hidden.stdout
    assert hidden.returncode != 0


def _enter_as(user: BoxUser, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "/usr/bin/setpriv",
            f"--reuid={user.uid}",
            f"--regid={user.gid}",
            "--init-groups",
            "--",
            str(LNK),
            "sandbox",
            "enter",
            *args,
        ],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_check_prints_the_grants_and_runs_nothing(
    running_box: RunningBox, sshd: GateSshd, user: BoxUser
) -> None:
    mark = user.folder / f"ran-{secrets.token_hex(3)}"
    result = _enter_as(
        user,
        "--spec",
        str(user.spec),
        "--folder",
        str(user.folder),
        "--run-dir",
        str(running_box.run_dir),
        "--check",
        env={"PATH": "/usr/bin:/bin", "SSH_ORIGINAL_COMMAND": f"touch {mark}"},
    )
    assert result.returncode == 0, result.stderr
    assert re.search(rf"^\s+write\s+{re.escape(str(user.folder))}$", result.stdout, re.M)
    assert re.search(r"^\s+run\s+/bin/bash", result.stdout, re.M), result.stdout
    assert re.search(r"^hash: [0-9a-f]{64}$", result.stdout, re.M)
    time.sleep(0.5)
    assert not mark.exists()


# -- fail closed ----------------------------------------------------------------------------------


def test_a_spec_that_does_not_let_bash_run_is_refused_before_anything_runs(
    running_box: RunningBox, sshd: GateSshd
) -> None:
    nobash = sshd.add_user(spec_text())
    authorize(running_box, sshd, nobash)
    nobash.spec.write_text(spec_text(commands=["touch", "id"]))  # edited after it was let in
    mark = nobash.folder / "ran"
    for command in (f"touch {mark}", None):
        result = sshd.ssh(nobash, command=command)
        assert result.returncode != 0
        assert "/bin/bash" in result.stderr and "[commands]" in result.stderr
    sftp = _sftp(sshd, nobash, "ls\n")
    assert sftp.returncode != 0
    assert not mark.exists()


def test_a_spec_that_writes_elsewhere_is_refused(running_box: RunningBox, sshd: GateSshd) -> None:
    other = sshd.data / f"other-{secrets.token_hex(3)}"
    other.mkdir()
    writer = sshd.add_user(spec_text())
    os.chown(other, writer.uid, writer.gid)
    authorize(running_box, sshd, writer)
    writer.spec.write_text(spec_text(extra=f'[folders]\nwrite = ["{other}"]\n'))
    result = sshd.ssh(writer, command=f"touch {other}/x {writer.folder}/x")
    assert result.returncode == 3
    assert "session-writes" in result.stderr
    assert list(other.iterdir()) == [] and list(writer.folder.iterdir()) == []


def test_a_spec_the_box_user_could_rewrite_is_refused(
    running_box: RunningBox, sshd: GateSshd
) -> None:
    owned = sshd.add_user(spec_text())
    authorize(running_box, sshd, owned)
    os.chown(owned.spec, owned.uid, owned.gid)  # e.g. an admin's slip after the key went in
    result = sshd.ssh(owned, command=f"touch {owned.folder}/x")
    assert result.returncode == 3
    assert "the spec" in result.stderr and "not root" in result.stderr
    assert list(owned.folder.iterdir()) == []


def test_a_box_that_is_down_is_a_clear_refusal(running_box: RunningBox, sshd: GateSshd) -> None:
    down = sshd.root / "box-that-is-down"
    down.mkdir(mode=0o755)
    lost = sshd.add_user(spec_text())
    authorize(running_box, sshd, lost, "--run-dir", str(down))
    result = sshd.ssh(lost, command=f"touch {lost.folder}/x")
    assert result.returncode == 1
    assert "the box is not running" in result.stderr
    assert list(lost.folder.iterdir()) == []


def test_an_over_long_command_is_refused(sshd: GateSshd, user: BoxUser) -> None:
    mark = user.folder / f"long-{secrets.token_hex(3)}"
    result = sshd.ssh(user, command=f"touch {mark}; : " + "x" * 70_000)
    assert result.returncode == 2
    assert "over the limit" in result.stderr
    assert not mark.exists()


# -- the generator, as root runs it ---------------------------------------------------------------


def _authorize_cli(box: RunningBox, sshd: GateSshd, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LNK), "box", "authorize", "--keys-dir", str(sshd.keys_dir), *args],
        env=box.env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize(
    "where", ["home", "home-inside", "etc", "run-dir", "state-dir", "keys-dir", "through-a-link"]
)
def test_authorize_refuses_a_folder_in_a_protected_place(
    running_box: RunningBox, sshd: GateSshd, user: BoxUser, where: str
) -> None:
    link = sshd.data / f"link-{secrets.token_hex(3)}"
    link.symlink_to(user.folder)
    folder = {
        "home": user.home,
        "home-inside": user.home / "work",
        "etc": Path("/etc"),
        "run-dir": running_box.run_dir,
        "state-dir": running_box.state_dir,
        "keys-dir": sshd.keys_dir,
        "through-a-link": link,
    }[where]
    if where == "home-inside":
        folder.mkdir(exist_ok=True)
    before = (sshd.keys_dir / user.name).read_text()
    result = _authorize_cli(
        running_box,
        sshd,
        *("--user", user.name, "--spec", str(user.spec), "--folder", str(folder)),
        *("--key", f"{user.key}.pub", "--run-dir", str(running_box.run_dir)),
    )
    assert result.returncode == 3, result.stderr
    assert "session-folder" in result.stderr or "gate-path" in result.stderr
    assert (sshd.keys_dir / user.name).read_text() == before


def test_authorize_refuses_the_same_key_twice_and_revoke_takes_it_out(
    running_box: RunningBox, sshd: GateSshd
) -> None:
    twice = sshd.add_user(spec_text())
    authorize(running_box, sshd, twice)
    again = _authorize_cli(
        running_box,
        sshd,
        *("--user", twice.name, "--spec", str(twice.spec), "--folder", str(twice.folder)),
        *("--key", f"{twice.key}.pub"),
    )
    assert again.returncode == 3
    assert "already in" in again.stderr
    found = re.search(r"SHA256:[A-Za-z0-9+/]+", again.stderr)
    assert found is not None
    fingerprint = found.group(0)
    revoked = _authorize_cli(running_box, sshd, "--revoke", fingerprint, "--user", twice.name)
    assert revoked.returncode == 0, revoked.stderr
    assert sshd.ssh(twice, command="true").returncode == 255  # the key no longer gets in


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        (spec_text(commands=["id"]), "/bin/bash"),
        (spec_text(extra='[folders]\nwrite = ["/var/tmp"]\n'), "session-writes"),
        ("[nonsense]\n", "nonsense"),
    ],
    ids=["no-bash", "writes-elsewhere", "unreadable-spec"],
)
def test_authorize_refuses_a_line_every_session_would_fail(
    running_box: RunningBox, sshd: GateSshd, spec: str, why: str
) -> None:
    """The line's command is run with --check as the user before anything is written."""
    doomed = sshd.add_user(spec)
    result = _authorize_cli(
        running_box,
        sshd,
        *("--user", doomed.name, "--spec", str(doomed.spec), "--folder", str(doomed.folder)),
        *("--key", f"{doomed.key}.pub", "--run-dir", str(running_box.run_dir)),
    )
    assert result.returncode == 3, result.stderr
    assert "session-check" in result.stderr and why in result.stderr
    assert not (sshd.keys_dir / doomed.name).exists()
