"""The SSH gate end to end, sessions: a real OpenSSH sshd on a loopback port (tests/e2e/sshd.py),
real box users whose key lines `lnk box authorize` writes, OpenSSH's ssh/scp/sftp and paramiko
as clients, and the session's box (`running_box`) behind `lnk sandbox enter`.

Every session runs in a sandbox: commands, shells (with their terminal), scp and sftp; the box
user's login files and the key files stay out of reach; a dropped connection ends the sandbox.
Ways around the sandbox: test_ssh_gate_forwarding.py; specs and refusals: test_ssh_gate_specs.py.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import paramiko
import pytest
from sshd import (
    LNK,
    WAIT_S,
    BoxUser,
    GateSshd,
    RunningBox,
    gate_sshd,
    home_state,
    let_in,
    sftp,
)

pytestmark = pytest.mark.needs_root


@pytest.fixture(scope="module")
def sshd() -> Iterator[GateSshd]:
    with gate_sshd() as server:
        yield server


@pytest.fixture(scope="module")
def user(running_box: RunningBox, sshd: GateSshd) -> BoxUser:
    return let_in(running_box, sshd)


# -- the line the generator wrote ---------------------------------------------------------------


def test_authorize_writes_a_root_owned_line_and_makes_the_shell_sh(
    running_box: RunningBox, sshd: GateSshd, user: BoxUser
) -> None:
    path = sshd.keys_dir / user.name
    info = path.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (0, 0, 0o644)
    (line,) = path.read_text().splitlines()
    from lnk_shared.accounts import home_token, prove_account

    proof = prove_account(user.uid)
    assert proof is not None
    assert line.startswith(
        f'restrict,pty,command="{LNK} sandbox enter --spec {user.spec} --folder {user.folder} '
        f'--run-dir {running_box.run_dir} --account {home_token(user.uid, proof)}" ssh-ed25519 '
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
    before = home_state(user)
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
    assert home_state(user) == before
    assert not (sshd.data / "planted").exists()


def test_sftp_works_inside_the_folder_only(sshd: GateSshd, user: BoxUser, tmp_path: Path) -> None:
    payload = secrets.token_hex(16)
    (tmp_path / "in.txt").write_text(payload)
    name = f"sftp-{secrets.token_hex(3)}.txt"
    ok = sftp(
        sshd,
        user,
        f"put {tmp_path}/in.txt {user.folder}/{name}\n"
        f"get {user.folder}/{name} {tmp_path}/out.txt\n",
    )
    assert ok.returncode == 0, ok.stderr
    assert (user.folder / name).read_text() == payload
    assert (tmp_path / "out.txt").read_text() == payload
    before, key_line = home_state(user), (sshd.keys_dir / user.name).read_bytes()
    # One session: `-` lets the batch go on after a refusal; each is judged by its effect.
    refused = sftp(
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
    assert home_state(user) == before
    assert (sshd.keys_dir / user.name).read_bytes() == key_line


def test_sftp_setstat_leaves_no_set_id_or_shared_file(
    sshd: GateSshd, user: BoxUser, tmp_path: Path
) -> None:
    (tmp_path / "prog").write_bytes(Path("/bin/sh").read_bytes())
    name = f"setstat-{secrets.token_hex(3)}"
    done = sftp(
        sshd,
        user,
        f"put {tmp_path}/prog {user.folder}/{name}\n"
        f"-chmod 4755 {user.folder}/{name}\n"
        f"-chmod 2755 {user.folder}/{name}\n"
        f"-chmod 0666 {user.folder}/{name}\n"
        f"chmod 0700 {user.folder}/{name}\n",
    )
    assert done.returncode == 0, done.stderr  # the session ran; the plain mode took
    assert done.stderr.count("Permission denied") == 3, done.stderr
    assert (user.folder / name).stat().st_mode & 0o7777 == 0o700


# -- the box user's login files and the key file stay out of reach --------------------------------


def test_a_session_cannot_write_login_files_or_the_key_file(sshd: GateSshd, user: BoxUser) -> None:
    home = user.home
    keys = sshd.keys_dir / user.name
    before, key_line = home_state(user), keys.read_bytes()
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
    assert home_state(user) == before
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
