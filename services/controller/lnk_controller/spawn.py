"""Starting the sandbox's process: the confiner's policy, the bwrap layout, and the chain
`lnk-spawn` (the launcher, native/lnk_spawn.c) → `bwrap … lnk-sandbox …` (the confiner,
lnk_inside/native/lnk_sandbox.c).

lnk-spawn, run as root, dies with the controller's launching thread and starts bwrap's parent as
pid 1 of a new pid namespace, born in the sandbox's cgroup (clone3 with CLONE_INTO_CGROUP: no
migration, see cgroups.py); that process sets vm.memfd_noexec=2 for the namespace (no memfd can
be executed: closes `memfd_create` + `fexecve` around Landlock), takes the terminal when there is
one, drops to the sandbox user (no groups, no new privileges) and execs bwrap. Each link dies
with the one before it (PR_SET_PDEATHSIG, bwrap --die-with-parent), so a controller killed with
SIGKILL takes its sandboxes with it, and reconcile removes what remains.

The controller never forks a Python child of its own (it is multi-threaded): the chain is plain
programs started by subprocess, which forks and execs in C. Data the sandbox needs (its
/etc/passwd, /etc/group and /etc/hosts, its boot id, the confiner's policy) go in as memfds
bwrap copies, and so do the host's regular /etc files of `ETC_FILES` (opened here, copied by
bwrap: see wall.py for why).

A held start (`release_fd`): the confiner is told `--release-fd N` and waits there, confined
but before the program, for the controller's one byte `RELEASE` (launch.py sends it once a write
grant's placeholders are made and sealed); the pipe's end without it refuses, so a launch the
controller abandons, or a controller that dies, never runs the program.

bwrap's options (the staging paths, the owner's folders, the environment with whatever the
caller put in it) go in as a memfd too, read by `bwrap --args FD`, and the program's argv as a
file the confiner reads (`lnk-sandbox --`): every local user can read any process's
/proc/PID/cmdline, and the chain's command lines show only the launcher's own flags,
`bwrap --args N -- lnk-sandbox --`. What this does NOT hide: the program's own arguments once
it runs, which the kernel shows in its cmdline as for any process (a host /proc mounted with
hidepid= is the administrator's tool for that), and the sandbox's id in the launcher's
--cgroup path (naming nothing another user can reach).
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import re
import stat
import struct
import subprocess
import termios
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lnk_controller import cgroups, seccomp
from lnk_controller.config import ControllerConfig
from lnk_controller.host_users import HostUser
from lnk_controller.launch_request import TerminalSize
from lnk_controller.models import SandboxRow
from lnk_controller.stdio_guard import GuardedStdio
from lnk_controller.wall import (
    ETC_FILES,
    MERGED_USR_LINKS,
    SandboxLayout,
    bwrap_argv,
    sandbox_hosts,
    sandbox_passwd,
)
from lnk_shared.errors import LaunchRefused
from lnk_shared.kernel_features import time_namespaces

__all__ = [
    "MAX_ETC_COPY_BYTES",
    "MIN_LANDLOCK_ABI",
    "RELEASE",
    "Running",
    "confiner_policy",
    "open_etc_entries",
    "spawn_sandbox",
    "split_bwrap_argv",
    "split_confiner_command",
]

MIN_LANDLOCK_ABI = 6  # abstract-unix and signal scoping: without them a sandbox reaches out
MAX_STATUS_BYTES = 64 * 1024  # bwrap's status documents are a few hundred bytes
# /etc files up to this size are copied into the sandbox's root; larger ones are bound, so a
# huge file cannot fill the sandbox's memory (the copy is charged to it). The largest on a
# usual system (ld.so.cache, mime.types) are well under 1 MiB.
MAX_ETC_COPY_BYTES = 4 * 1024 * 1024
_CHILD_PID = re.compile(rb'"child-pid"\s*:\s*([0-9]+)')
# What the controller writes on a held launch's release pipe (`--release-fd`) once the program
# may run; the confiner (lnk_inside/native/lnk_sandbox.c, RELEASE_BYTE) refuses on anything else,
# end of file included, so a launch the controller abandons or dies in never runs its program.
RELEASE = b"R"


@dataclass
class Running:
    row: SandboxRow
    process: subprocess.Popen[bytes]
    terminal_master: int | None
    target_pid: int | None = None
    status_thread: threading.Thread | None = field(default=None, repr=False)
    # Set once bwrap has named the program's pid, or its status ended without one: a signal
    # the client forwards at once must wait for it, not be dropped.
    pid_known: threading.Event = field(default_factory=threading.Event, repr=False)
    # The pipes that stand in for a caller's terminal or append-only file (stdio_guard.py).
    stdio: GuardedStdio | None = field(default=None, repr=False)
    note: str = ""  # what the launch told the caller before it started (sandbox_plan.cwd_note)


def confiner_policy(
    *,
    reads: list[str],
    writes: list[str],
    execute: tuple[str, ...],
    network_host: bool,
    pretend_abi: int | None,
    unsafe_seccomp: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """What the confiner enforces inside. TCP: with its own empty network namespace the sandbox
    reaches nothing, so Landlock leaves TCP alone; with the host's network it may connect
    anywhere (what host mode means) but may not listen on the host's ports (taking a port
    another program expects while it is stopped)."""
    return {
        "read": sorted(set(reads)),
        "write": sorted(set(writes)),
        "execute": sorted(set(execute)),
        "tcp_connect": None,
        "tcp_bind": [] if network_host else None,
        "scope_abstract_unix": True,
        "scope_signal": True,
        "block_unix_sockets": True,
        "min_abi": MIN_LANDLOCK_ABI,
        "unsafe_pretend_abi": pretend_abi,
        "network_host": network_host,  # the last seccomp program refuses host listening
        "unsafe_seccomp": sorted(unsafe_seccomp),
    }


POLICY_HEADER = "lnk-confiner-policy 2"  # first line of the policy file: format and version


def encode_policy(policy: Mapping[str, Any]) -> str:
    """The confiner's policy as tab-separated lines (key, value), which its small C parser reads
    (lnk_inside/native/lnk_sandbox.c): one line per path or port; `tcp_*\t-` restricts with no port
    allowed; a missing tcp key leaves TCP to the network namespace; `seccomp` and
    `seccomp_unix` are the BPF programs (hex) the confiner loads, compiled here."""
    lines = [POLICY_HEADER]
    for key in ("read", "write", "execute"):
        for path in policy[key]:
            if any(c in path for c in "\t\n\r\0"):
                raise LaunchRefused(path, "a path with a tab or line break cannot be granted")
            lines.append(f"{key}\t{path}")
    for path in policy.get("symlink", []):  # write places that may also hold new links
        if any(c in path for c in "\t\n\r\0"):
            raise LaunchRefused(path, "a path with a tab or line break cannot be granted")
        lines.append(f"symlink\t{path}")
    for key in ("tcp_connect", "tcp_bind"):
        ports = policy[key]
        if ports is not None:
            lines += [f"{key}\t{port}" for port in ports] or [f"{key}\t-"]
    for key in ("scope_abstract_unix", "scope_signal", "block_unix_sockets"):
        lines.append(f"{key}\t{1 if policy[key] else 0}")
    lines.append(f"min_abi\t{policy['min_abi']}")
    if policy.get("relay_socket"):
        lines.append(f"relay_socket\t{policy['relay_socket']}")
        lines.append(f"relay_port\t{policy['relay_port']}")
        lines += [f"relay_localhost\t{port}" for port in policy.get("relay_localhost", [])]
    if policy.get("bridge_socket"):  # an agent's store bridge, relayed like the proxy
        lines += [
            f"bridge_socket\t{policy['bridge_socket']}",
            f"bridge_port\t{policy['bridge_port']}",
        ]
    if policy["unsafe_pretend_abi"] is not None:
        lines.append(f"unsafe_pretend_abi\t{policy['unsafe_pretend_abi']}")
    deny_list, unix_block = seccomp.programs(
        network_host=bool(policy.get("network_host")),
        unsafe=frozenset(policy.get("unsafe_seccomp", ())),
    )
    lines += [f"seccomp\t{deny_list.hex()}", f"seccomp_unix\t{unix_block.hex()}"]
    return "\n".join(lines) + "\n"


def _memfd(name: str, text: str | bytes) -> int:
    fd = os.memfd_create(f"lnk-{name}", os.MFD_CLOEXEC)
    data = text.encode("utf-8") if isinstance(text, str) else text
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def split_confiner_command(command: tuple[str, ...]) -> tuple[tuple[str, ...], bytes | None]:
    """(the command bwrap runs, the program's argv for the confiner's ARGV_PATH file, or None)
    for `(confiner, "--", program, *args)`: the confiner is left with `--` alone and reads the
    program's argv from the file, so no command line of the chain shows it."""
    if len(command) < 3 or command[1] != "--":
        return command, None
    if any("\0" in arg for arg in command[2:]):
        raise LaunchRefused("the program's arguments", "an argument holds a NUL byte")
    return command[:2], b"".join(os.fsencode(arg) + b"\0" for arg in command[2:])


def held_confiner_command(command: tuple[str, ...], release_fd: int) -> tuple[str, ...]:
    """`command` (the confiner first) with the confiner told to wait for its release on
    `release_fd` before the program runs (`lnk-sandbox --release-fd N`)."""
    if len(command) < 2 or "--" not in command[1:]:
        raise LaunchRefused("the sandbox's command line", "the confiner's command has no `--`")
    return (command[0], "--release-fd", str(release_fd), *command[1:])


def split_bwrap_argv(argv: list[str], command: tuple[str, ...]) -> tuple[list[str], bytes]:
    """(what stays on the command line, bwrap's options as `--args` reads them: each followed
    by a NUL) for `bwrap_argv`'s `[bwrap, *options, "--", *command]`, split by the command's
    length, never by looking for "--" (an environment value may be "--")."""
    options = argv[1 : len(argv) - len(command) - 1]
    if argv[len(options) + 1 :] != ["--", *command]:
        raise LaunchRefused(
            "the sandbox's command line", "bwrap's argv does not end in its command"
        )
    if any("\0" in option for option in options):
        raise LaunchRefused("the sandbox's settings", "an option holds a NUL byte")
    return [argv[0], "--args"], b"".join(os.fsencode(option) + b"\0" for option in options)


def open_etc_entries(paths: tuple[str, ...]) -> tuple[tuple[str, ...], list[tuple[int, str]]]:
    """(paths to bind read-only, [(open descriptor, path) to copy]) for the /etc entries that
    exist: regular files up to MAX_ETC_COPY_BYTES are copied, directories and larger files bound.
    A link is followed, as a bind follows it. Anything else (a FIFO, a socket, a device) and an
    entry that cannot be opened are left out, as a missing one is. O_NONBLOCK so a FIFO put in
    /etc cannot hang the launch in open(). The caller closes the descriptors."""
    binds: list[str] = []
    copies: list[tuple[int, str]] = []
    try:
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            except OSError:
                continue
            copied = False
            try:
                info = os.fstat(fd)
                if stat.S_ISREG(info.st_mode) and info.st_size <= MAX_ETC_COPY_BYTES:
                    copies.append((fd, path))
                    copied = True
                elif stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode):
                    binds.append(path)
            finally:
                if not copied:
                    os.close(fd)
    except BaseException:
        for fd, _ in copies:
            os.close(fd)
        raise
    return tuple(binds), copies


def _set_winsize(fd: int, size: TerminalSize) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.rows, size.cols, 0, 0))


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks: with the pid, a handle that survives reuse."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _read_status(fd: int, running: Running) -> None:
    """Read bwrap's --json-status-fd to its end (bwrap dies of SIGPIPE if nobody reads); the
    document with "child-pid" names the program's host pid."""
    buffer = b""
    try:
        while chunk := os.read(fd, 4096):
            if running.target_pid is not None or len(buffer) > MAX_STATUS_BYTES:
                continue
            buffer += chunk
            if match := _CHILD_PID.search(buffer):
                running.target_pid = int(match.group(1))
                running.pid_known.set()
    finally:
        running.pid_known.set()
        os.close(fd)


def spawn_sandbox(
    *,
    cfg: ControllerConfig,
    row: SandboxRow,
    user: HostUser,
    layout: SandboxLayout,
    policy: Mapping[str, Any],
    stdio: tuple[int, int, int],
    terminal: TerminalSize | None,
    limiter: Callable[[Path], list[str]] | None = None,
    release_fd: int = -1,
) -> tuple[subprocess.Popen[bytes], int | None, int]:
    """Start the chain; return (process, pty master or None, read end of bwrap's status).
    `limiter` writes the sandbox's limits for its (empty) cgroup and returns the launcher's
    options that apply the rest (sandbox_limits.Applied.launcher_args). With `release_fd` (a
    pipe's read end, passed to the chain; the caller keeps the write end) the confiner holds the
    program until the controller writes RELEASE there (`held_confiner_command`)."""
    home_inside = layout.home.dest
    command, argv_data = split_confiner_command(layout.command)
    if cfg.unsafe_command_line_visible:
        command, argv_data = layout.command, None
    if release_fd >= 0:
        command = held_confiner_command(command, release_fd)
    passwd, group = sandbox_passwd(user.name, user.uid, user.gid, home_inside)
    data_fds = [
        _memfd("passwd", passwd),
        _memfd("group", group),
        _memfd("policy", encode_policy(policy)),
    ]
    # Its own /etc/hosts and boot id (a fresh random UUID, as the kernel's own is): nothing
    # names or identifies the host. The test switch puts the host's /etc/hosts back instead.
    own_identity = not cfg.unsafe_host_identity
    if own_identity:
        data_fds += [_memfd("hosts", sandbox_hosts()), _memfd("boot-id", f"{uuid.uuid4()}\n")]
    etc_entries = ETC_FILES if own_identity else (*ETC_FILES, "/etc/hosts")
    argv_fd = -1
    if argv_data is not None:
        argv_fd = _memfd("argv", argv_data)
        data_fds.append(argv_fd)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    master: int | None = None
    args_fd = -1
    etc_copies: list[tuple[int, str]] = []
    try:
        etc_binds, etc_copies = open_etc_entries(etc_entries)
        links = {p: os.readlink(p) for p in MERGED_USR_LINKS if os.path.islink(p)}
        dirs = tuple(p for p in MERGED_USR_LINKS if os.path.isdir(p) and p not in links)
        layout = dataclasses.replace(  # the plan's layout, with what only the spawn reads or opens
            layout,
            system_links=links,
            system_dirs=(*layout.system_dirs, *dirs),
            etc_binds=etc_binds,
            etc_copies=tuple(etc_copies),
            passwd_fd=data_fds[0],
            group_fd=data_fds[1],
            policy_fd=data_fds[2],
            hosts_fd=data_fds[3] if own_identity else -1,
            boot_id_fd=data_fds[4] if own_identity else -1,
            status_fd=status_w,
            argv_fd=argv_fd,
            command=command,
        )
        cgroup = cgroups.create(row.id)
        limit_args = limiter(cgroup) if limiter is not None else []
        streams = list(stdio)
        if terminal is not None:
            master, secondary = os.openpty()
            _set_winsize(master, terminal)
            streams = [secondary, secondary, secondary]
        whole = bwrap_argv(layout, bwrap=str(cfg.bwrap))
        head, options = split_bwrap_argv(whole, tuple(layout.command))
        args_fd = _memfd("bwrap-args", options)
        bwrap_command = [*head, str(args_fd), "--", *layout.command]
        if cfg.unsafe_command_line_visible:
            bwrap_command = whole
        chain = [
            str(cfg.spawner),
            "--parent",
            str(os.getpid()),  # it refuses to start anything if this process is gone meanwhile
            "--cgroup",
            str(cgroup),
            "--uid",
            str(user.uid),
            "--gid",
            str(user.gid),
            *(["--ctty"] if terminal is not None else []),
            # Its own boot and monotonic clocks (a time namespace): /proc/uptime and btime say
            # how long the sandbox has run, not when the host booted.
            # Without time namespaces in the kernel, the host's (`lnk box up` says so).
            *(["--own-clock"] if not cfg.unsafe_host_clock and time_namespaces() else []),
            *limit_args,
            "--",
            *bwrap_command,
        ]
        try:
            process = subprocess.Popen(
                chain,
                stdin=streams[0],
                stdout=streams[1],
                stderr=streams[2],
                pass_fds=(
                    *data_fds,
                    *(fd for fd, _ in etc_copies),
                    status_w,
                    args_fd,
                    *([release_fd] if release_fd >= 0 else []),
                ),
                close_fds=True,
                env={},
                cwd="/",
            )
        finally:
            if terminal is not None:
                os.close(streams[0])
    except BaseException:
        os.close(status_r)
        if master is not None:
            os.close(master)
        raise
    finally:
        os.close(status_w)
        for fd in (*data_fds, *(fd for fd, _ in etc_copies)):
            os.close(fd)
        if args_fd >= 0:
            os.close(args_fd)
    return process, master, status_r


def host_pid(uid: int, ns_pid: int) -> int | None:
    """The host pid of the process of `uid` that bwrap reported as `ns_pid` (bwrap runs inside
    the memfd pid namespace, so its "child-pid" is a pid there: the second NSpid field)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uids = fields.get("Uid", "").split()
        nspids = fields.get("NSpid", "").split()
        if uids[:1] == [str(uid)] and len(nspids) > 1 and nspids[1] == str(ns_pid):
            return int(entry)
    return None


def program_pids(uid: int, ns_pid: int) -> list[int]:
    """Host pids of the sandbox's program: the children of bwrap's init (which bwrap reports as
    its "child-pid"; an init with no handlers ignores the signals meant for the program)."""
    init = host_pid(uid, ns_pid)
    if init is None:
        return []
    try:
        with open(f"/proc/{init}/task/{init}/children", encoding="ascii") as f:
            return [int(pid) for pid in f.read().split()]
    except OSError:
        return []


def watch_status(status_r: int, running: Running) -> None:
    thread = threading.Thread(target=_read_status, args=(status_r, running), daemon=True)
    thread.start()
    running.status_thread = thread


def start_time(pid: int) -> int | None:
    return _start_time(pid)
