"""A real OpenSSH sshd for the SSH gate's tests, on a free loopback port, with its own host key,
config and the gate's drop-in (applied by `lnk_ssh_gate.sshd_dropin`, the same function a box
uses), and real box users whose keys `lnk box authorize` writes.

sshd's files live under /run/lnk-sshd-<tag> (root, 0755: sshd's StrictModes wants the key
files' folders root's all the way up, which /tmp is not). The test sshd runs with `UsePAM no`,
so this machine's /etc/pam.d/sshd is never read or changed; the PAM hardening is tested as a
function on a copy. Specs and session folders are under /srv/lnk-gate-<tag>. `stop()` ends
sshd and every process it started, and removes the users and folders, whatever happened.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sshd_process import free_port, start_sshd

from lnk_ssh_gate.sshd_dropin import DROPIN_NAME, DropinPlaces, apply_sshd_dropin

PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
LNK = PREFIX / "venv" / "bin" / "lnk"
WAIT_S = 20.0  # how long a session, a refusal or a cleanup may take on a loaded machine
# The usual tools of a test session's spec; /bin/bash is what every session runs in.
TOOLS = ["/bin/bash", "id", "hostname", "cat", "touch", "ls", "scp", "tty", "python3", "stty"]
TOOLS += ["sleep", "mkdir"]
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it (Debian's unit makes it)
CLIENT_OPTIONS = (
    "-o",
    "BatchMode=yes",
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "ConnectTimeout=10",
    "-o",
    "IdentitiesOnly=yes",
)


def _descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _uid_pids(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    pids.append(int(entry))
    return pids


@dataclass
class BoxUser:
    name: str
    uid: int
    gid: int
    home: Path
    key: Path  # the client's private key (root's, 0600)
    folder: Path  # F: the one folder its sessions write
    spec: Path  # S: root's, 0644


@dataclass
class GateSshd:
    root: Path
    data: Path  # specs and folders: not under /run, which no sandbox may write
    port: int = 0
    users: list[BoxUser] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    @property
    def keys_dir(self) -> Path:
        return self.root / "authorized_keys"

    @property
    def config(self) -> Path:
        return self.root / "sshd_config"

    @property
    def log(self) -> Path:
        return self.root / "sshd.log"

    @property
    def known_hosts(self) -> Path:
        return self.root / "client" / "known_hosts"

    @property
    def places(self) -> DropinPlaces:
        return DropinPlaces(
            main_config=self.config,
            dropin_dir=self.root / "sshd_config.d",
            keys_dir=self.keys_dir,
        )

    def start(self) -> None:
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        self.root.mkdir(mode=0o755)
        os.chmod(self.root, 0o755)
        (self.root / "client").mkdir(mode=0o700)
        (self.root / "sshd_config.d").mkdir(mode=0o755)
        self.keys_dir.mkdir(mode=0o755)
        host_key = self.root / "host_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True
        )
        self.port = free_port()
        self.config.write_text(
            f"Include {self.places.dropin_dir}/*.conf\n"
            f"ListenAddress 127.0.0.1:{self.port}\n"
            f"HostKey {host_key}\n"
            f"PidFile {self.root / 'sshd.pid'}\n"
            "UsePAM no\n"
            "StrictModes yes\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "AcceptEnv LANG LC_*\n"
            "PrintMotd no\n"
            "PrintLastLog no\n"
            "X11Forwarding yes\n"  # on for everyone else: the gate's Match must turn it off
            "AllowTcpForwarding yes\n"
            "PermitTunnel yes\n"
            "Subsystem sftp /usr/lib/openssh/sftp-server\n"
        )
        assert apply_sshd_dropin(self.places)
        assert (self.places.dropin_dir / DROPIN_NAME).exists()
        self.process = start_sshd(self.config, self.log, self.port)

    def add_user(self, spec_text: str) -> BoxUser:
        """A real box user (shell bash until `authorize` makes it /bin/sh), a client key, a
        spec (root's) and a folder (the user's) outside its home; the key not yet authorized."""
        name = "lnkg" + secrets.token_hex(3)
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", "-K", "UID_MIN=1500", name], check=True)
        # `*`: no password, but not locked (with UsePAM no, sshd refuses a locked account).
        subprocess.run(["usermod", "-p", "*", name], check=True)
        entry = pwd.getpwnam(name)
        key = self.root / "client" / f"{name}_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@test", "-f", str(key)],
            check=True,
        )
        data = self.data
        data.mkdir(mode=0o755, exist_ok=True)
        folder = data / f"work-{name}"
        folder.mkdir(mode=0o755)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
        spec = data / f"{name}.toml"
        spec.write_text(spec_text)
        spec.chmod(0o644)
        user = BoxUser(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir), key, folder, spec)
        self.users.append(user)
        return user

    def add_plain_user(self) -> BoxUser:
        """A user outside the gate (key in ~/.ssh, bash): what this sshd allows everyone else,
        so a refusal seen for a box user is the gate's doing, not the test sshd's."""
        user = self.add_user("")
        ssh_dir = user.home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        (ssh_dir / "authorized_keys").write_text(Path(f"{user.key}.pub").read_text())
        subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(ssh_dir)], check=True)
        return user

    def ssh_argv(self, user: BoxUser, *options: str, key: Path | None = None) -> list[str]:
        return [
            "ssh",
            *CLIENT_OPTIONS,
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-i",
            str(key or user.key),
            "-p",
            str(self.port),
            *options,
            f"{user.name}@127.0.0.1",
        ]

    def ssh(
        self,
        user: BoxUser,
        *options: str,
        command: str | None = None,
        timeout: float = 60,
        **kw: object,
    ) -> subprocess.CompletedProcess[str]:
        argv = self.ssh_argv(user, *options)
        if command is not None:
            argv.append(command)
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **kw,  # type: ignore[call-overload]
        )

    def client_options(self, user: BoxUser) -> list[str]:
        """Options scp and sftp take as ssh does (-P for the port)."""
        return [
            *CLIENT_OPTIONS,
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-i",
            str(user.key),
            "-P",
            str(self.port),
        ]

    def stop(self) -> None:
        if self.process is not None:
            children = _descendants(self.process.pid)
            with suppress(ProcessLookupError):
                self.process.terminate()
            for pid in children:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for user in self.users:
            for pid in _uid_pids(user.uid):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            subprocess.run(["userdel", "-r", user.name], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.data, ignore_errors=True)


RunningBox = Any  # tests/e2e/conftest.py


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


@contextmanager
def gate_sshd() -> Iterator[GateSshd]:
    """A started test sshd, stopped with its users and folders whatever happens."""
    tag = secrets.token_hex(4)
    server = GateSshd(Path(f"/run/lnk-sshd-{tag}"), Path(f"/srv/lnk-gate-{tag}"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


def let_in(box: RunningBox, server: GateSshd) -> BoxUser:
    """A box user whose key is let in, its sessions under a spec with the usual tools."""
    user = server.add_user(spec_text())
    authorize(box, server, user)
    return user


def sftp(sshd: GateSshd, user: BoxUser, batch: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sftp", *sshd.client_options(user), "-b", "-", f"{user.name}@127.0.0.1"],
        input=batch,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def home_state(user: BoxUser) -> dict[str, bytes]:
    """Every file under the box user's home, with its bytes."""
    state = {}
    for path in sorted(user.home.rglob("*")):
        if path.is_file():
            state[str(path)] = path.read_bytes()
        else:
            state[str(path)] = b"<dir>"
    return state
