"""A test sshd for the deploy tests: a free loopback port, its own host key, root let in with one
temp key only (`AuthorizedKeysFile` of its own, `UsePAM no`); the machine's sshd, its config and
root's keys are never read or changed. Ansible reaches the machine through it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from sshd_process import free_port, start_sshd

__all__ = ["RootSshd", "free_port"]


@dataclass
class RootSshd:
    """sshd on 127.0.0.1:<free port> letting root in with one temp key, nothing else."""

    root: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def client_key(self) -> Path:
        return self.root / "root_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def control_path(self) -> Path:
        return self.root / "cm-%C"

    def ssh_options(self) -> list[str]:
        return [
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=accept-new",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ControlMaster=auto",
            "-o",
            "ControlPersist=120s",
            "-o",
            f"ControlPath={self.control_path}",
        ]

    def start(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privsep folder
        self.root.mkdir(mode=0o700)
        host_key = self.root / "host_ed25519"
        for key in (host_key, self.client_key):
            subprocess.run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    "lnk-deploy-test",
                    "-f",
                    str(key),
                ],
                check=True,
            )
        keys = self.root / "authorized_keys"
        keys.write_text(Path(f"{self.client_key}.pub").read_text())
        keys.chmod(0o600)
        self.port = free_port()
        config = self.root / "sshd_config"
        config.write_text(
            f"ListenAddress 127.0.0.1:{self.port}\n"
            f"HostKey {host_key}\n"
            f"PidFile {self.root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {keys}\n"
            "PermitRootLogin prohibit-password\n"
            "AllowUsers root\n"
            "UsePAM no\n"
            "StrictModes yes\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "MaxSessions 50\n"
            "Subsystem sftp /usr/lib/openssh/sftp-server\n"
        )
        self.process = start_sshd(config, self.root / "sshd.log", self.port)

    def stop(self) -> None:
        # The connection master ssh left running for ControlPersist: its pid, then it ends.
        check = subprocess.run(
            ["ssh", *self.ssh_options(), "-O", "check", "-p", str(self.port), "root@127.0.0.1"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        found = re.search(r"pid=(\d+)", check.stderr + check.stdout)
        if found:
            with suppress(ProcessLookupError):
                os.kill(int(found.group(1)), signal.SIGTERM)
        if self.process is not None:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
