"""The box's services started from their rendered systemd units where systemd is not PID 1, as
systemd would start them: `ExecStart`, `User=`/`Group=`, `Environment=`, `UMask=`,
`NoNewPrivileges=`, `RuntimeDirectory=` with its mode and owner, `WorkingDirectory=`.

`python deploy_units.py restart --unit-dir D --state S UNIT` is the role's restart hook
(`lnk_box_restart_hook`): it stops the running service (SIGTERM to the main process, as
`KillMode=mixed`), starts it again, waits until its socket accepts, and counts the restart.
Only the standard library: the hook runs outside pytest, from the role.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shlex
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

START_S = 30.0  # the controller migrates its database and reconciles before it listens
STOP_S = 20.0  # it stops every sandbox and removes its user before it exits
READY_SOCKETS = (  # what each service listens on once it is ready, under the run dir
    ("lnk_proxy", "proxy/admin.sock"),
    ("lnk_bridge_store", "bridge-store/admin.sock"),
    ("lnk_controller", "controller.sock"),
)


@dataclass(frozen=True)
class Unit:
    """What a rendered unit's [Service] says; a key given twice keeps every value in order."""

    path: Path
    settings: dict[str, list[str]]

    @classmethod
    def read(cls, path: Path) -> Unit:
        settings: dict[str, list[str]] = {}
        section = ""
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                section = line.strip("[]")
                continue
            key, _, value = line.partition("=")
            settings.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
        return cls(path, settings)

    def get(self, key: str, default: str = "") -> str:
        values = self.settings.get(f"Service.{key}")
        return values[-1] if values else default

    def argv(self) -> list[str]:
        return shlex.split(self.get("ExecStart"))

    def environment(self) -> dict[str, str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8"}
        for value in self.settings.get("Service.Environment", []):
            for item in shlex.split(value):
                key, _, val = item.partition("=")
                env[key] = val
        return env

    def runtime_dirs(self) -> list[Path]:
        return [Path("/run") / name for name in self.get("RuntimeDirectory").split()]


@dataclass
class Services:
    """The services of one box started from their units, as systemd would start them."""

    unit_dir: Path
    state: Path  # pidfiles, logs, the restart count

    def unit(self, name: str) -> Unit:
        return Unit.read(self.unit_dir / f"{name}.service")

    def pidfile(self, name: str) -> Path:
        return self.state / f"{name}.pid"

    def pid(self, name: str) -> int | None:
        try:
            pid = int(self.pidfile(name).read_text())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def restarts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        log = self.state / "restarts.log"
        for line in log.read_text().splitlines() if log.exists() else []:
            counts[line] = counts.get(line, 0) + 1
        return counts

    def restart(self, name: str) -> int:
        self.stop(name)
        pid = self.start(name)
        with open(self.state / "restarts.log", "a", encoding="utf-8") as f:
            f.write(f"{name}\n")
        return pid

    def start(self, name: str) -> int:
        unit = self.unit(name)
        user = pwd.getpwnam(unit.get("User", "root"))
        group = unit.get("Group")
        gid = pwd.getpwnam(group).pw_gid if group and group != user.pw_name else user.pw_gid
        mode = int(unit.get("RuntimeDirectoryMode", "0755"), 8)
        for directory in unit.runtime_dirs():
            directory.mkdir(parents=True, exist_ok=True)
            os.chown(directory, user.pw_uid, gid)
            directory.chmod(mode)
        prefix = ["/usr/bin/setpriv"]
        if user.pw_uid != 0:
            prefix += [f"--reuid={user.pw_uid}", f"--regid={gid}", "--clear-groups"]
        if unit.get("NoNewPrivileges") == "yes":
            prefix.append("--no-new-privs")
        self.state.mkdir(parents=True, exist_ok=True)
        with open(self.state / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                [*prefix, "--", *unit.argv()],
                env=unit.environment(),
                cwd=unit.get("WorkingDirectory", "/"),
                umask=int(unit.get("UMask", "0022"), 8),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                close_fds=True,
            )
        self.pidfile(name).write_text(f"{process.pid}\n")
        self._wait_ready(name, unit, process)
        return process.pid

    def _wait_ready(self, name: str, unit: Unit, process: subprocess.Popen[bytes]) -> None:
        """Ready when its socket accepts: the controller's API, the proxy's admin socket."""
        run_dir = Path(unit.environment()["LNK_RUN_DIR"])
        sock = run_dir / next(path for module, path in READY_SOCKETS if module in unit.argv())
        deadline = time.monotonic() + START_S
        while True:
            with socket.socket(socket.AF_UNIX) as s:
                if s.connect_ex(str(sock)) == 0:
                    return
            if process.poll() is not None or time.monotonic() > deadline:
                log = (self.state / f"{name}.log").read_text(errors="replace")
                raise RuntimeError(f"{name} did not start (status {process.poll()}): {log}")
            time.sleep(0.05)

    def stop(self, name: str) -> None:
        """SIGTERM to the main process only (KillMode=mixed), SIGKILL after STOP_S."""
        pid = self.pid(name)
        if pid is None:
            return
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_S
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        with suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        self.pidfile(name).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie of ours or of init has finished)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def main() -> int:
    """`deploy_units.py restart --unit-dir D --state S UNIT`: the role's restart hook."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["restart", "stop"])
    parser.add_argument("--unit-dir", type=Path, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("unit")
    args = parser.parse_args()
    services = Services(args.unit_dir, args.state)
    if args.action == "stop":
        services.stop(args.unit)
    else:
        print(f"{args.unit}: pid {services.restart(args.unit)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
