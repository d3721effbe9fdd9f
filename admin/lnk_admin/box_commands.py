"""`lnk box up|down|status`: the box's services on this machine as background processes (the
embedded default, no systemd needed), each under its own identity: the proxy as its own system
user (`lnk-proxy`, made here if missing), the controller as root. The proxy starts first, since
the controller refuses to launch a sandbox with a network while the proxy does not answer.
Each one's stdout and stderr are a pipe to its log's keeper (`lnk_admin.service_logs`), which
rotates `logs/<name>.log` by size; `down` waits for the keeper after the service.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnk_admin import service_logs
from lnk_shared.box_folders import folder_named
from lnk_shared.display import shown
from lnk_shared.errors import EXIT_OK, StateError, UsageError
from lnk_shared.kernel_features import missing_features
from lnk_shared.oom_scores import SERVICE_OOM_SCORE_ADJ
from lnk_shared.paths import BoxPaths

__all__ = ["register"]

# The controller migrates its database and reconciles before answering; a Python service's
# imports alone took over 15 s on a loaded 2-core machine. The wait watches the process, so a
# service that dies is said at once; only one that hangs alive waits this long (systemd's
# default start timeout is 90 s).
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0  # it cleans every running sandbox before it exits
ANSWER_WAIT_S = 2.0  # one "are you up?" question while starting: asked again until START_TIMEOUT_S


@dataclass(frozen=True)
class Service:
    name: str
    module: str
    socket: str
    user: str


PROXY_USER = "lnk-proxy"  # the proxy's system user: never root, never a sandbox's uid
BRIDGE_STORE_USER = "lnk-bridge-store"  # the store bridge's: likewise, and not the proxy's
SERVICES = (
    Service("proxy", "lnk_proxy", "proxy/admin.sock", PROXY_USER),
    Service("bridge-store", "lnk_bridge_store", "bridge-store/admin.sock", BRIDGE_STORE_USER),
    Service("controller", "lnk_controller", "controller.sock", "root"),
)


def register(groups: Any) -> None:
    box = groups.add_parser("box", help="start, stop or show the box's services (root)")
    commands = box.add_subparsers(dest="command", metavar="COMMAND", parser_class=type(box))
    box.set_defaults(handler=lambda _a: (box.print_help(sys.stderr), 2)[1])
    commands.add_parser("up", help="start the services").set_defaults(handler=cmd_up)
    commands.add_parser("down", help="stop the services").set_defaults(handler=cmd_down)
    status = commands.add_parser("status", help="each service, its socket, its pid")
    status.add_argument("--json", action="store_true", help="one JSON document, for scripts")
    status.set_defaults(handler=cmd_status)
    commands.add_parser(
        "prune",
        help="prune ended sandboxes' records and wire logs now, as the controller does hourly",
        description="Remove the records and wire logs of sandboxes that ended more than "
        "ended_keep_days ago (default 30), or that are past the newest ended_keep_count "
        "(default 10000), as set in controller.toml. Live sandboxes are never pruned.",
    ).set_defaults(handler=cmd_prune)
    from lnk_admin import authorize_command  # keys let in through the SSH gate

    authorize_command.register(commands)


def _pidfile(box: BoxPaths, service: Service) -> Path:
    return box.run_dir / f"{service.name}.pid"


def _running_pid(box: BoxPaths, service: Service) -> int | None:
    try:
        pid = int(_pidfile(box, service).read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().split(b"\0")
    except OSError:
        return None
    return pid if service.module.encode() in cmdline else None


def _answers(box: BoxPaths, service: Service) -> bool:
    if service.name in ("proxy", "bridge-store"):  # both answer a framed ping
        return _proxy_answers(box.run_dir / service.socket)
    from lnk_shared.controller_api import request

    try:
        status, _ = request("GET", "/v1/sandboxes", timeout=ANSWER_WAIT_S, box=box)
    except (StateError, OSError):
        return False
    return status == 200


def _proxy_answers(path: Path) -> bool:
    from lnk_shared.admin_socket import admin_answers

    if os.geteuid() != 0:  # only the controller's uid may talk to it: a socket is all we see
        try:
            return path.exists()
        except OSError:  # its folder is closed to this user: nothing to tell either way
            return False
    return admin_answers(path, timeout=ANSWER_WAIT_S)


def _system_user(name: str) -> Any:
    """The service's system user (a pwd entry), made if missing."""
    import pwd

    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            [
                "/usr/sbin/useradd",
                "--system",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                "--user-group",
                name,
            ],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(name)


def _prepare(box: BoxPaths, service: Service) -> list[str]:
    """Make the service's system user and the folders it needs before it starts (each owned
    by it or by root, lnk_shared.box_folders); return the command prefix that runs as it."""
    from lnk_shared.box_folders import box_path_of, folders_for

    entry = _system_user(service.user)
    for folder in folders_for(service.name):
        path = box_path_of(folder, box)
        path.mkdir(parents=True, exist_ok=True)
        own = folder.owner != "root"
        os.chown(path, entry.pw_uid if own else 0, entry.pw_gid if own else 0)
        os.chmod(path, folder.mode)
    return _as_user(entry)


def _as_user(entry: Any) -> list[str]:
    return [
        "/usr/bin/setpriv",
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--clear-groups",
        "--no-new-privs",
        "--",
    ]


def _require_root() -> None:
    if os.geteuid() != 0:
        raise UsageError(
            "lnk box up/down starts services as root and as their own users: run it as root"
        )


def cmd_up(_args: argparse.Namespace) -> int:
    """Start each service not running yet, in order. If one fails, those started here are
    stopped again (a box half up is not left behind) and the error says why, from its log."""
    _require_root()
    box = BoxPaths.from_env()
    box.run_dir.mkdir(parents=True, exist_ok=True)
    settings = service_logs.log_settings()  # controller.toml, checked before anything starts
    logs = box.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    os.chmod(logs, 0o700)
    started: list[tuple[Service, subprocess.Popen[bytes]]] = []
    try:
        for service in SERVICES:
            if _running_pid(box, service) is not None:
                print(f"{service.name}: already running")
                continue
            started.append((service, _start(box, service, logs, settings)))
    except BaseException:
        for service, process in reversed(started):
            _stop_started(box, service, process)
        raise
    from lnk_ssh_gate.sshd_dropin import harden_local_sshd  # the SSH gate's sshd hardening

    for line in harden_local_sshd():
        print(f"ssh gate: {line}")
    for line in missing_features():
        print(f"kernel: {line}", file=sys.stderr)
    return EXIT_OK


LOG_MIN_FREE = 1024 * 1024  # bytes a service's log needs to say why it failed
LOG_TAIL_LINES = 1  # of a failed service's output, shown in the error: its last word, the why


def _unwritable(log_path: Path) -> str | None:
    """Why the log cannot be written (its output then goes to stderr), or None."""
    try:
        free = os.statvfs(log_path.parent)
        if free.f_bavail * free.f_frsize < LOG_MIN_FREE:
            return f"{log_path.parent} is full"
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        return f"{log_path}: {exc.strerror}"
    os.close(fd)
    return None


def _below_the_sandboxes(service: Service, pid: int) -> None:
    """The service's OOM score adjustment, below every sandbox's (lnk_shared.oom_scores): when
    the host runs out of memory, its OOM killer takes sandboxes first. Lowering it takes
    CAP_SYS_RESOURCE, which a container's root may lack: then the service stays at 0, still
    below the sandboxes' +500, and this says so. A service already gone is reported below."""
    try:
        Path(f"/proc/{pid}/oom_score_adj").write_text(f"{SERVICE_OOM_SCORE_ADJ}\n")
    except (FileNotFoundError, ProcessLookupError):
        pass
    except PermissionError:
        print(
            f"{service.name}: its OOM score stays at 0, not {SERVICE_OOM_SCORE_ADJ} (lowering it "
            "needs CAP_SYS_RESOURCE, which this root lacks); sandboxes stand above it anyway",
            file=sys.stderr,
        )


def _start(
    box: BoxPaths, service: Service, logs: Path, settings: service_logs.LogSettings
) -> subprocess.Popen[bytes]:
    log_path = logs / f"{service.name}.log"
    as_user = _prepare(box, service) if service.user != "root" else []
    box.state_dir.chmod(folder_named("state", "").mode)  # the proxy reaches wire/ through it
    unwritable = _unwritable(log_path)
    if unwritable:
        print(
            f"{service.name}: its log cannot be written ({unwritable}): its output goes here",
            file=sys.stderr,
        )
    since = service_logs.since(log_path)
    # None: this command's own stdout and stderr; else the pipe to the log's keeper
    out = None if unwritable else service_logs.start_keeper(box, service.name, log_path, settings)
    try:
        process = subprocess.Popen(
            [*as_user, sys.executable, "-m", service.module],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            close_fds=True,
            cwd="/",
        )
    finally:
        if out is not None:
            os.close(out)  # the service holds it now: the keeper ends when the service does
    where = "the output above" if unwritable else str(log_path)
    _pidfile(box, service).write_text(f"{process.pid}\n")
    _below_the_sandboxes(service, process.pid)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(box, service):
        if process.poll() is not None:
            service_logs.end_keeper(box, service.name, log_path)  # all it said is written
            said = "" if unwritable else service_logs.tail(log_path, since, LOG_TAIL_LINES)
            _pidfile(box, service).unlink(missing_ok=True)
            raise StateError(
                f"{service.name} exited with status {process.returncode}"
                + (f": {said}" if said else "")
                + f"; see {where}"
            )
        if time.monotonic() > deadline:
            _stop_started(box, service, process)
            raise StateError(
                f"{service.name} did not answer in {START_TIMEOUT_S:.0f} s; see {where}"
            )
        time.sleep(0.05)
    print(f"{service.name}: up (pid {process.pid}, {box.run_dir / service.socket})")
    return process


def _stop_started(box: BoxPaths, service: Service, process: subprocess.Popen[bytes]) -> None:
    """Stop a service this command started (its whole session), and forget its pid."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)
        print(f"{service.name}: stopped again", file=sys.stderr)
    _pidfile(box, service).unlink(missing_ok=True)
    service_logs.end_keeper(box, service.name, box.state_dir / "logs" / f"{service.name}.log")


def cmd_down(_args: argparse.Namespace) -> int:
    _require_root()
    box = BoxPaths.from_env()
    for service in reversed(SERVICES):
        pid = _running_pid(box, service)
        log_path = box.state_dir / "logs" / f"{service.name}.log"
        if pid is None:
            service_logs.end_keeper(box, service.name, log_path, wait_s=0.0)  # one left behind
            print(f"{service.name}: not running")
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _running_pid(box, service) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        if _running_pid(box, service) is not None:
            os.kill(pid, signal.SIGKILL)
        _pidfile(box, service).unlink(missing_ok=True)
        service_logs.end_keeper(box, service.name, log_path)  # the service's last words written
        print(f"{service.name}: down")
    return EXIT_OK


def cmd_prune(_args: argparse.Namespace) -> int:
    from lnk_shared.controller_api import call

    if os.geteuid() != 0:
        raise StateError("lnk box prune is for root: run it with sudo")
    doc = call("POST", "/v1/box/prune", {})
    print(f"pruned {doc['records']} ended record(s) and {doc['logs']} wire log(s)")
    return EXIT_OK


def _denials_status(box: BoxPaths) -> str:
    """Whether runs say what the kernel denied them (the controller writes it at start)."""
    try:
        return (box.run_dir / "denials.status").read_text(encoding="utf-8").strip()[:200]
    except OSError:
        return "unknown (the controller has not said: is it running?)"


def cmd_status(args: argparse.Namespace) -> int:
    """Each service's state; exit 0 only when every one is up. `--json`: `{"up": B, "services":
    [{"name", "state", "pid", "user", "socket"}], "denials": TEXT}`, the same exit."""
    box = BoxPaths.from_env()
    services = []
    for service in SERVICES:
        pid = _running_pid(box, service)
        answers = _answers(box, service)
        state = "up" if pid and answers else ("starting or stuck" if pid else "down")
        socket = str(box.run_dir / service.socket)
        services.append(
            {
                "name": service.name,
                "state": state,
                "pid": pid,
                "user": service.user,
                "socket": socket,
            }
        )
    up = all(s["state"] == "up" for s in services)
    said = _denials_status(box)
    if getattr(args, "json", False):
        import json

        print(json.dumps({"up": up, "services": services, "denials": said}, indent=2))
        return EXIT_OK if up else 1
    for s in services:
        print(
            f"{s['name']:<12} {s['state']:<18} pid {s['pid'] or '-':<8} "
            f"user {s['user']:<8} {s['socket']}"
        )
    print(f"{'denials':<12} {shown(said)}")
    return EXIT_OK if up else 1
