"""A box deployed by the Ansible role (deploy/ansible) onto THIS machine over real SSH, into
private folders, for the deploy tests.

`DeployedBox`: the paths and names the role is given (prefix, config/state/run dirs, unit dir,
unit and user names, the SSH gate's sshd config and box user, all with a random tag),
`playbook()` to run site.yml against the test sshd (deploy_sshd), and `cleanup()` that removes
everything the box made, whatever happened. Where systemd is not PID 1 the role's handlers start
each service from its unit through deploy_units (`lnk_box_restart_hook`).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import deploy_units
from deploy_sshd import RootSshd
from deploy_units import Services
from sshd_process import free_port, start_sshd

CHECKOUT = Path(__file__).resolve().parents[2]
PLAYBOOK_DIR = CHECKOUT / "deploy" / "ansible"
# A converge takes 85 s on a quiet 2-core machine; at load 12 (eight suites at once) ansible-lint
# alone ran 10x slower and a converge passed 300 s: a bound for a stuck run, not a slow one.
PLAYBOOK_S = 900.0
UID_BLOCKS_START = 2_101_000_000  # above the e2e boxes' blocks (conftest), below bwrap's 2**31
UID_BLOCK = 1000
UID_BLOCKS = 40_000
GATE_SPEC = '[commands]\nallow = ["/bin/bash", "id", "cat", "touch"]\n'
PAM_WITH_USER_READENV = (
    "@include common-auth\n"
    "session    required     pam_env.so user_readenv=1 envfile=/etc/default/locale\n"
    "@include common-session\n"
)


def find_tool(name: str) -> str | None:
    """`name` next to the running Python first (the venv the deploy extra went into), then PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


@dataclass
class DeployedBox:
    """One box the role deploys into private folders, with names of its own."""

    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    uid_first: int = field(
        default_factory=lambda: UID_BLOCKS_START + secrets.randbelow(UID_BLOCKS) * UID_BLOCK
    )
    proxy_settings: dict[str, object] = field(default_factory=dict)
    box_sshd_port: int = 0
    box_sshd: subprocess.Popen[bytes] | None = None

    @property
    def uid_last(self) -> int:
        return self.uid_first + UID_BLOCK - 1

    @property
    def prefix(self) -> Path:  # outside /tmp: sandboxes run the confiner from it
        return Path(f"/opt/lnk-dt-{self.tag}")

    @property
    def venv(self) -> Path:
        return self.prefix / "venv"

    @property
    def bin_link(self) -> Path:
        """The role's `lnk` on PATH, here in a folder of the test's own, not /usr/local/bin."""
        return Path(f"/opt/lnk-dt-{self.tag}-bin/lnk")

    @property
    def config_dir(self) -> Path:
        return Path(f"/etc/lnk-dt-{self.tag}")

    @property
    def state_dir(self) -> Path:
        return Path(f"/var/lib/lnk-dt-{self.tag}")

    @property
    def run_dir(self) -> Path:
        return Path(f"/run/lnk-dt-{self.tag}")

    @property
    def work(self) -> Path:
        """The test's own folder: sshd, wheels, the unit dir, Ansible's temp, the services'
        pidfiles and logs (root's, 0700)."""
        return Path(f"/run/lnk-dt-{self.tag}-test")

    @property
    def unit_dir(self) -> Path:
        return self.work / "units"

    @property
    def proxy_user(self) -> str:
        return f"lnkdp-{self.tag}"

    @property
    def bridge_store_user(self) -> str:
        return f"lnkdb-{self.tag}"

    @property
    def bridge_store_service(self) -> str:
        return f"lnk-dt-{self.tag}-bridge-store"

    @property
    def service_names(self) -> tuple[str, str, str]:
        """In the order they start."""
        return (self.proxy_service, self.bridge_store_service, self.controller_service)

    @property
    def controller_service(self) -> str:
        return f"lnk-dt-{self.tag}-controller"

    @property
    def proxy_service(self) -> str:
        return f"lnk-dt-{self.tag}-proxy"

    @property
    def services(self) -> Services:
        return Services(self.unit_dir, self.work / "services")

    # The SSH gate: the box's own sshd config (never the machine's), a box user, its folder.

    @property
    def sshd_dir(self) -> Path:
        """root's, 0755: sshd reads the key files as the user, root's all the way up."""
        return Path(f"/run/lnk-dt-{self.tag}-sshd")

    @property
    def sshd_config(self) -> Path:
        return self.sshd_dir / "sshd_config"

    @property
    def dropin_dir(self) -> Path:
        return self.sshd_dir / "sshd_config.d"

    @property
    def keys_dir(self) -> Path:
        return self.sshd_dir / "authorized_keys"

    @property
    def pam_file(self) -> Path:
        """A copy of sshd's PAM stack with user_readenv=1 for the role to fix (the machine's
        /etc/pam.d/sshd is never touched)."""
        return self.sshd_dir / "pam.d-sshd"

    @property
    def box_user(self) -> str:
        return f"lnkdg{self.tag}"

    @property
    def box_user_key(self) -> Path:
        return self.work / "box_user_ed25519"

    @property
    def gate_root(self) -> Path:
        return Path(f"/srv/lnk-dt-{self.tag}")

    @property
    def gate_folder(self) -> Path:
        return self.gate_root / "work"

    def env(self) -> dict[str, str]:
        """LNK_* pointing a client at this box."""
        return {
            "LNK_CONFIG_DIR": str(self.config_dir),
            "LNK_STATE_DIR": str(self.state_dir),
            "LNK_RUN_DIR": str(self.run_dir),
        }

    def extra_vars(self, wheel: Path) -> dict[str, object]:
        return {
            "lnk_box_wheel": str(wheel),
            "lnk_box_install_packages": True,
            "lnk_box_prefix": str(self.prefix),
            "lnk_box_bin_link": str(self.bin_link),
            "lnk_box_config_dir": str(self.config_dir),
            "lnk_box_state_dir": str(self.state_dir),
            "lnk_box_run_dir": str(self.run_dir),
            "lnk_box_unit_dir": str(self.unit_dir),
            "lnk_box_controller_service": self.controller_service,
            "lnk_box_proxy_service": self.proxy_service,
            "lnk_box_proxy_user": self.proxy_user,
            "lnk_box_bridge_store_service": self.bridge_store_service,
            "lnk_box_bridge_store_user": self.bridge_store_user,
            "lnk_box_service_manager": "none",
            "lnk_box_restart_hook": [
                sys.executable,
                "-I",
                str(Path(deploy_units.__file__).resolve()),
                "restart",
                "--unit-dir",
                str(self.unit_dir),
                "--state",
                str(self.services.state),
            ],
            "lnk_box_controller_settings": {
                "uid_first": self.uid_first,
                "uid_last": self.uid_last,
            },
            "lnk_box_proxy_settings": self.proxy_settings,
            "lnk_box_sshd_config": str(self.sshd_config),
            "lnk_box_sshd_dropin_dir": str(self.dropin_dir),
            "lnk_box_ssh_keys_dir": str(self.keys_dir),
            "lnk_box_sshd_pam": str(self.pam_file),
            "lnk_box_users": [
                {
                    "name": self.box_user,
                    "spec": GATE_SPEC,
                    "folder": str(self.gate_folder),
                    "keys": [Path(f"{self.box_user_key}.pub").read_text().strip()],
                }
            ],
        }

    def prepare(self, sshd: RootSshd) -> Path:
        """The inventory reaching this machine through `sshd` (written in the work folder), and
        what the gate's part of the role works on: the box's sshd config (Including its drop-in
        folder, on a port of its own), a PAM stack with user_readenv=1, the box user's key."""
        self.sshd_dir.mkdir(mode=0o755)
        self.sshd_dir.chmod(0o755)
        self.dropin_dir.mkdir(mode=0o755)
        self.gate_root.mkdir(mode=0o755)
        self.gate_root.chmod(0o755)
        host_key = self.sshd_dir / "host_ed25519"
        for key in (host_key, self.box_user_key):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lnk-dt", "-f", str(key)],
                check=True,
            )
        self.box_sshd_port = free_port()
        self.sshd_config.write_text(
            f"Include {self.dropin_dir}/*.conf\n"
            f"ListenAddress 127.0.0.1:{self.box_sshd_port}\n"
            f"HostKey {host_key}\n"
            f"PidFile {self.sshd_dir / 'sshd.pid'}\n"
            f"AllowUsers {self.box_user}\n"
            "UsePAM no\n"
            "StrictModes yes\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "AllowTcpForwarding yes\n"  # on for everyone else: the drop-in's Match turns it off
            "Subsystem sftp /usr/lib/openssh/sftp-server\n"
        )
        self.pam_file.write_text(PAM_WITH_USER_READENV)
        inventory = self.work / "inventory.json"
        options = " ".join(shlex.quote(o) for o in sshd.ssh_options())
        inventory.write_text(
            json.dumps(
                {
                    "lnk_boxes": {
                        "hosts": {
                            "testbox": {
                                "ansible_host": "127.0.0.1",
                                "ansible_port": sshd.port,
                                "ansible_user": "root",
                                "ansible_connection": "ssh",
                                "ansible_ssh_private_key_file": str(sshd.client_key),
                                "ansible_ssh_common_args": options,
                                "ansible_python_interpreter": "/usr/bin/python3",
                            }
                        }
                    }
                }
            )
        )
        return inventory

    def playbook(
        self, wheel: Path, *args: str, extra: dict[str, object] | None = None
    ) -> PlaybookRun:
        """site.yml against this box."""
        ansible_playbook = find_tool("ansible-playbook")
        if ansible_playbook is None:
            raise RuntimeError("ansible-playbook is missing (pip install '.[deploy]')")
        variables = self.work / f"vars-{secrets.token_hex(4)}.json"  # runs may overlap
        variables.write_text(json.dumps({**self.extra_vars(wheel), **(extra or {})}))
        home = self.work / "ansible"
        env = {
            "PATH": f"{Path(ansible_playbook).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "ANSIBLE_CONFIG": str(PLAYBOOK_DIR / "ansible.cfg"),
            "ANSIBLE_HOME": str(home),
            "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
            "ANSIBLE_REMOTE_TEMP": str(home / "remote-tmp"),
            "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
            "ANSIBLE_DISPLAY_OK_HOSTS": "false",
            "ANSIBLE_DISPLAY_SKIPPED_HOSTS": "false",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
        }
        result = subprocess.run(
            [
                ansible_playbook,
                "-i",
                str(self.work / "inventory.json"),
                "-e",
                f"@{variables}",
                *args,
                str(PLAYBOOK_DIR / "site.yml"),
            ],
            env=env,
            cwd=str(PLAYBOOK_DIR),
            capture_output=True,
            text=True,
            timeout=PLAYBOOK_S,
            check=False,
        )
        return PlaybookRun(result)

    def cleanup(self, sshd: RootSshd | None) -> list[str]:
        """Stop its services, remove its sandbox users, mounts, folders and its proxy user.
        Returns what could not be removed."""
        problems: list[str] = []
        services = self.services
        for name in reversed(self.service_names):
            try:
                services.stop(name)
            except OSError as exc:
                problems.append(f"stop {name}: {exc}")
        subprocess.run(
            ["umount", "-R", "-l", str(self.run_dir / "sandboxes")],
            capture_output=True,
            check=False,
        )
        python = self.venv / "bin" / "python"
        if python.exists():
            subprocess.run(
                [str(python), "-I", "-c", _REMOVE_USERS, str(self.uid_first), str(self.uid_last)],
                capture_output=True,
                check=False,
            )
        if sshd is not None:
            sshd.stop()
        if self.box_sshd is not None:
            with suppress(ProcessLookupError):
                os.killpg(self.box_sshd.pid, signal.SIGKILL)
            self.box_sshd.wait()
        with suppress(KeyError):
            for pid in _uid_pids(pwd.getpwnam(self.box_user).pw_uid):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        subprocess.run(["userdel", "-r", self.box_user], capture_output=True, check=False)
        for user in (self.proxy_user, self.bridge_store_user):
            with suppress(KeyError):
                for pid in _uid_pids(pwd.getpwnam(user).pw_uid):
                    with suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            subprocess.run(["userdel", user], capture_output=True, check=False)
            subprocess.run(["groupdel", user], capture_output=True, check=False)
        for path in (
            self.prefix,
            self.bin_link.parent,
            self.config_dir,
            self.state_dir,
            self.run_dir,
            self.work,
            self.sshd_dir,
            self.gate_root,
        ):
            shutil.rmtree(path, ignore_errors=True)
            if path.exists():
                problems.append(f"{path} is left")
        return problems

    def start_box_sshd(self) -> None:
        """sshd with the box's config (the role's drop-in in it), as the box's sshd would run."""
        self.box_sshd = start_sshd(
            self.sshd_config, self.sshd_dir / "sshd.log", self.box_sshd_port, "the box's sshd"
        )

    def ssh_as_box_user(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                "ssh",
                "-F",
                "/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                f"UserKnownHostsFile={self.work / 'box_known_hosts'}",
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "LogLevel=ERROR",
                "-i",
                str(self.box_user_key),
                "-p",
                str(self.box_sshd_port),
                f"{self.box_user}@127.0.0.1",
                command,
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def sandbox_users(self) -> list[str]:
        found = []
        for path in ("/etc/passwd", "/etc/group"):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    fields = line.split(":")
                    if fields[2].isdigit() and self.uid_first <= int(fields[2]) <= self.uid_last:
                        found.append(f"{path}: {fields[0]}")
        return found

    def mounts(self) -> list[str]:
        """Mount points under the box's run dir, as /proc/self/mountinfo lists them."""
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            points = [line.split()[4] for line in f]
        return [p for p in points if p == str(self.run_dir) or p.startswith(f"{self.run_dir}/")]

    def sockets(self) -> list[Path]:
        return sorted(p for p in _walk(self.run_dir) if p.is_socket())


_REMOVE_USERS = """
import sys
from lnk_controller import host_users
first, last = int(sys.argv[1]), int(sys.argv[2])
for user in host_users.list_lnk_users():
    if first <= user.uid <= last:
        host_users.remove_user(user)
"""


def _walk(root: Path) -> Iterator[Path]:
    for folder, _dirs, files in os.walk(root):
        for name in files:
            yield Path(folder) / name


def _uid_pids(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    pids.append(int(entry))
    return pids


RECAP = re.compile(r"^testbox\s*:\s*(.*)$", re.MULTILINE)
TASK = re.compile(r"^(?:TASK|RUNNING HANDLER) \[(.*?)\]", re.MULTILINE)


@dataclass(frozen=True)
class PlaybookRun:
    """A finished ansible-playbook run, read from its default output (ok and skipped hosts
    hidden, so every task shown changed, failed or printed a diff)."""

    result: subprocess.CompletedProcess[str]

    @property
    def ok(self) -> bool:
        return self.result.returncode == 0

    def stats(self) -> dict[str, int]:
        found = RECAP.findall(self.result.stdout)
        if not found:
            return {}
        return {k: int(v) for k, v in (item.split("=") for item in found[-1].split())}

    def changed_tasks(self) -> list[str]:
        """Each task that reported a change, with what it printed (its diff under --diff)."""
        out = self.result.stdout.split("PLAY RECAP", 1)[0]
        heads = list(TASK.finditer(out))
        found = []
        ends = [h.start() for h in heads[1:]] + ([len(out)] if heads else [])
        for head, end in zip(heads, ends, strict=True):
            body = out[head.end() : end]
            if re.search(r"^changed: \[testbox\]", body, re.MULTILINE):
                found.append(f"{head.group(1)}:{body.rstrip()}")
        return found

    def failure(self) -> str:
        return (self.result.stdout[-6000:] + self.result.stderr[-2000:]).strip()
