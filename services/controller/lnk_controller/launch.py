"""Launching a sandbox: judge the spec as its owner sees it, write the record, make the user and
the mounts, start bwrap as that user, and hand back a handle to wait on.

Order matters and is the point of this module: the spec is judged (and approved) before any
state exists; the record is written before the user exists; every mount is recorded before it
is made; only then does anything run. Any failure on the way undoes what was done
(`cleanup.clean_sandbox`), so nothing is left half-made.

The owner proves what they can reach: for every folder or program to bind, the client passes a
descriptor it opened itself (as the owner), and the controller binds *that* descriptor after
checking it is the same file its own resolution found — no second lookup for a swapped link to
win, and nothing the owner could not reach.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pwd
import re
import stat
import subprocess
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from lnk_controller import host_users, idmap_mounts
from lnk_controller.cleanup import clean_sandbox
from lnk_controller.config import ControllerConfig
from lnk_controller.launch_request import LaunchRequest
from lnk_controller.models import SandboxRow
from lnk_controller.remembered import RememberedSpecs
from lnk_controller.sandbox_store import SandboxStore
from lnk_controller.wall import (
    ETC_FILES,
    MERGED_USR_LINKS,
    Bind,
    SandboxLayout,
    bwrap_argv,
    sandbox_passwd,
)
from lnk_shared.discovery import DEFAULT_PATH, context_for, resolve_path, resolve_spec
from lnk_shared.errors import CommandRefused, LaunchRefused, SpecError
from lnk_shared.grants import Grants
from lnk_shared.opens import describe, describe_changes
from lnk_shared.refusals import find_refusals, inside, judge
from lnk_shared.spec import FdGrant, SpecBuilder
from lnk_shared.spec_file import parse_spec_text
from lnk_shared.spec_flags import spec_from_arguments

__all__ = ["Judged", "Launcher", "Running"]

log = logging.getLogger(__name__)

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"  # PATH inside: system programs only
LOADERS = ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1")  # ELF interpreters
MAX_SHEBANG = 256  # bytes read to find a script's #! interpreter
SYSTEM_PROGRAM_DIRS = ("/usr",)  # already bound read-only in every sandbox
FLAGS_ONLY_KEY = "<flags>"
MAX_STATUS_BYTES = 64 * 1024  # bwrap's status documents are a few hundred bytes
_CHILD_PID = re.compile(rb'"child-pid"\s*:\s*([0-9]+)')


@dataclass(frozen=True)
class Judged:
    """A launch request judged: grants, the program to run, and whether it must be approved."""

    grants: Grants
    digest: str
    spec_key: str
    program: str
    execute: tuple[str, ...]
    approval_lines: tuple[str, ...] | None  # None: already approved


@dataclass
class Running:
    row: SandboxRow
    process: subprocess.Popen[bytes]
    terminal_master: int | None
    target_pid: int | None = None
    status_thread: threading.Thread | None = None
    _done: threading.Event = field(default_factory=threading.Event)


def _read_spec_fd(fd: int, builder: SpecBuilder) -> str:
    source = os.readlink(f"/proc/self/fd/{fd}")
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise SpecError("the spec is not a regular file", source=source)
    data = os.pread(fd, 256 * 1024 + 1, 0)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"the spec is not UTF-8 text (byte {exc.start})", source=source) from None
    builder.source = source
    parse_spec_text(text, source=source, base=os.path.dirname(source), builder=builder)
    return source


def _find_program(name: str, cwd: str) -> str:
    if "/" in name:
        return os.path.normpath(os.path.join(cwd, name))
    for folder in SANDBOX_PATH.split(":"):
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise SpecError(f"{name!r} is not a program found on the sandbox's PATH ({SANDBOX_PATH})")


def _interpreter(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            head = f.read(MAX_SHEBANG)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].strip()
    return os.fsdecode(line.split()[0]) if line else None


class Launcher:
    def __init__(
        self, cfg: ControllerConfig, store: SandboxStore, remembered: RememberedSpecs
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.remembered = remembered
        self.uid_range = host_users.UidRange(cfg.uid_first, cfg.uid_last)

    # -- judging ---------------------------------------------------------------------------

    def judge(self, request: LaunchRequest, owner_uid: int, fds: list[int]) -> Judged:
        builder = SpecBuilder()
        if request.spec_fd is not None:
            _read_spec_fd(fds[request.spec_fd], builder)
        spec = spec_from_arguments(request.flags, cwd=request.cwd, builder=builder)
        with_fds = []
        for grant in spec.with_fds:
            if grant.fd not in request.with_fds:
                raise SpecError(f"descriptor {grant.fd} was not passed", source="--with-fd")
            with_fds.append(FdGrant(fds[request.with_fds[grant.fd]], grant.write))
        spec = dataclasses.replace(spec, with_fds=tuple(with_fds))
        env = {"PATH": request.path_env or DEFAULT_PATH}
        ctx = context_for(owner_uid, env=env, box=self.cfg.paths, spec_file=spec.source)
        resolved = resolve_spec(spec, ctx, path_env=env["PATH"])
        grants = judge(resolved, ctx)

        program_path = _find_program(request.argv[0], request.cwd)
        try:
            program = resolve_path(program_path, base="/", home=ctx.home)
        except OSError as exc:
            raise SpecError(f"{request.argv[0]!r} cannot be run: {exc}") from None
        with_program = dataclasses.replace(resolved, commands=(*resolved.commands, program))
        for refusal in find_refusals(with_program, ctx):
            if "commands.allow" in refusal.entry:
                raise CommandRefused(f"the program {request.argv[0]}", refusal.why)
        execute = {program.real}
        interp = _interpreter(program.real)
        if interp is not None:
            execute.add(os.path.realpath(interp))
        execute.update(os.path.realpath(p) for p in LOADERS if os.path.exists(p))
        if grants.spec.commands_any:
            execute.add("/")
        execute.update(c.real for c in grants.commands)

        digest = grants.digest()
        key = os.path.realpath(spec.source) if spec.source else FLAGS_ONLY_KEY
        known = self.remembered.lookup(owner_uid, key)
        lines: tuple[str, ...] | None = None
        if known is None:
            lines = (
                f"{spec.source or 'the spec given by flags'} has not run here before. It opens:",
                *describe(grants),
            )
        elif known.grants_hash != digest:
            lines = (
                f"{spec.source or 'the spec given by flags'} opens something else since "
                "it was approved:",
                *describe_changes(known.grants_json, grants),
            )
        return Judged(grants, digest, key, program_path, tuple(sorted(execute)), lines)

    def approve(self, owner_uid: int, judged: Judged) -> None:
        self.remembered.remember(
            owner_uid, judged.spec_key, judged.digest, judged.grants.canonical_json()
        )

    # -- starting --------------------------------------------------------------------------

    def start(
        self, request: LaunchRequest, owner_uid: int, fds: list[int], judged: Judged
    ) -> Running:
        row = self.store.create(
            owner_uid=owner_uid,
            allocate=self._allocate,
            host_name=lambda uid: f"lnk-sbx-{uid}",
            staging_root=self.cfg.staging_root,
            command=[judged.program, *request.argv[1:]],
            spec_hash=judged.digest,
            lease=timedelta(seconds=self.cfg.lease_seconds),
        )
        try:
            return self._start(request, owner_uid, fds, judged, row)
        except BaseException:
            clean_sandbox(row.id, self.store, self.cfg)
            raise

    def _allocate(self, taken: set[int]) -> int:
        return host_users.allocate_uid(self.uid_range, taken | host_users.ids_in_use())

    def _binds(
        self,
        row: SandboxRow,
        judged: Judged,
        request: LaunchRequest,
        fds: list[int],
        userns_fd: int,
    ) -> tuple[list[Bind], list[Bind]]:
        staging = Path(row.staging_dir)
        grants = judged.grants
        exec_anywhere = grants.spec.commands_any
        wanted: list[tuple[str, bool, bool]] = []  # (real path, write, is a program)
        wanted += [(p.real, False, False) for p in grants.read]
        wanted += [(p.real, True, False) for p in grants.write]
        for f in grants.spec.with_fds:
            wanted.append((f.path.real, f.write, False))
        granted = [w[0] for w in wanted]
        for program in judged.execute:
            if program == "/" or any(inside(program, d) for d in SYSTEM_PROGRAM_DIRS):
                continue
            if any(inside(program, g) for g in granted):
                continue
            wanted.append((program, False, True))
        fd_for = {os.readlink(f"/proc/self/fd/{fds[i]}"): fds[i] for i in request.with_fds.values()}
        binds: list[Bind] = []
        for n, (real, write, is_program) in enumerate(wanted):
            source_fd = fd_for.get(real)
            if source_fd is None:
                index = request.grant_fds.get(real)
                if index is None:
                    raise LaunchRefused(
                        real, "the client did not pass it open: cannot check you may reach it"
                    )
                source_fd = fds[index]
            mine = os.stat(real)
            theirs = os.fstat(source_fd)
            if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
                raise LaunchRefused(real, "it changed while the sandbox was being made")
            target = staging / f"g{n}"
            self.store.add_mount(row.id, str(target))
            runs_here = is_program or any(inside(p, real) for p in judged.execute if p != "/")
            idmap_mounts.stage_idmapped(
                source_fd,
                target,
                userns_fd=userns_fd,
                read_only=not write,
                noexec=not exec_anywhere and (write or not runs_here),
            )
            binds.append(Bind(str(target), real, write))
        read_only = []
        for path in grants.read_only_inside:
            for bind in binds:
                if bind.write and inside(path, bind.dest) and os.path.lexists(path):
                    rel = os.path.relpath(path, bind.dest)
                    read_only.append(Bind(os.path.join(bind.source, rel), path))
        return binds, read_only

    def _start(
        self,
        request: LaunchRequest,
        owner_uid: int,
        fds: list[int],
        judged: Judged,
        row: SandboxRow,
    ) -> Running:
        cfg = self.cfg
        user = host_users.create_user(row.host_uid, homes_dir=cfg.homes_dir)
        staging = Path(row.staging_dir)
        owner = pwd.getpwuid(owner_uid)
        userns_fd = idmap_mounts.make_userns_fd(
            ((owner_uid, user.uid, 1),), ((owner.pw_gid, user.gid, 1),)
        )
        try:
            binds, read_only = self._binds(row, judged, request, fds, userns_fd)
        finally:
            os.close(userns_fd)
        size = cfg.tmp_size_mb * 1024 * 1024
        tmpfs = {}
        for name in ("tmp", "shm", "home"):
            target = staging / name
            self.store.add_mount(row.id, str(target))
            idmap_mounts.stage_tmpfs(
                target,
                uid=user.uid,
                gid=user.gid,
                size_bytes=size,
                noexec=not judged.grants.spec.commands_any,
            )
            tmpfs[name] = str(target)

        home_inside = f"/home/{user.name}"
        cwd = request.cwd
        visible = [b.dest for b in binds]
        if not any(inside(cwd, d) for d in visible):
            cwd = home_inside
        env = {
            "PATH": SANDBOX_PATH,
            "HOME": home_inside,
            "USER": user.name,
            "LOGNAME": user.name,
            "SHELL": "/bin/bash",
            "TMPDIR": "/tmp",
            "LNK_SANDBOX_ID": row.id,
        }
        env.update(request.env)
        passwd, group = sandbox_passwd(user.name, user.uid, user.gid, home_inside)
        writes = [b.dest for b in binds if b.write] + ["/tmp", "/dev/shm", home_inside, "/dev"]
        reads = ["/usr", "/etc", str(cfg.prefix), "/proc"] + [b.dest for b in binds]
        policy = {
            "read": sorted(set(reads)),
            "write": sorted(set(writes)),
            "execute": list(judged.execute),
            "tcp_connect": None if judged.grants.spec.network_host else [],
            "tcp_bind": None if judged.grants.spec.network_host else [],
            "scope_abstract_unix": True,
            "scope_signal": True,
            "block_unix_sockets": True,
            "min_abi": 6,
            "unsafe_pretend_abi": cfg.unsafe_pretend_landlock_abi,
        }
        data_fds = [
            _memfd("passwd", passwd),
            _memfd("group", group),
            _memfd("policy", json.dumps(policy)),
        ]
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        master: int | None = None
        try:
            links = {p: os.readlink(p) for p in MERGED_USR_LINKS if os.path.islink(p)}
            dirs = tuple(p for p in MERGED_USR_LINKS if os.path.isdir(p) and p not in links)
            layout = SandboxLayout(
                uid=user.uid,
                gid=user.gid,
                user_name=user.name,
                home=Bind(tmpfs["home"], home_inside, True),
                prefix=str(cfg.prefix),
                command=(
                    str(cfg.python),
                    "-I",
                    "-m",
                    "lnk_controller.confiner",
                    "--",
                    judged.program,
                    *request.argv[1:],
                ),
                cwd=cwd,
                env=env,
                terminal=request.terminal is not None,
                network_host=judged.grants.spec.network_host,
                tmp=Bind(tmpfs["tmp"], "/tmp", True),
                shm=Bind(tmpfs["shm"], "/dev/shm", True),
                binds=tuple(binds),
                hidden=judged.grants.hidden,
                read_only_inside=tuple(read_only),
                system_links=links,
                system_dirs=("/usr", *dirs),
                etc_files=tuple(p for p in ETC_FILES if os.path.exists(p)),
                passwd_fd=data_fds[0],
                group_fd=data_fds[1],
                policy_fd=data_fds[2],
                status_fd=status_w,
            )
            argv = bwrap_argv(layout, bwrap=str(cfg.bwrap))
            drop = [
                "/usr/bin/setpriv",
                f"--reuid={user.uid}",
                f"--regid={user.gid}",
                "--clear-groups",
                "--no-new-privs",
                "--",
            ]
            stdio = [fds[i] for i in request.stdio]
            chain = drop + argv
            if request.terminal is not None:
                master, secondary = os.openpty()
                _set_winsize(master, request.terminal.rows, request.terminal.cols)
                stdio = [secondary, secondary, secondary]
                chain = ["/usr/bin/setsid", "--ctty", "--", *chain]
            try:
                process = subprocess.Popen(
                    chain,
                    stdin=stdio[0],
                    stdout=stdio[1],
                    stderr=stdio[2],
                    pass_fds=(*data_fds, status_w),
                    close_fds=True,
                    env={},
                    cwd="/",
                )
            finally:
                if request.terminal is not None:
                    os.close(stdio[0])
            self.store.set(
                row.id, state="running", pid=process.pid, pid_start=_start_time(process.pid)
            )
        finally:
            os.close(status_w)
            for fd in data_fds:
                os.close(fd)
        running = Running(row=row, process=process, terminal_master=master)
        thread = threading.Thread(target=_read_status, args=(status_r, running), daemon=True)
        thread.start()
        running.status_thread = thread
        return running

    def finish(self, running: Running) -> int:
        """Wait for the sandbox's program, clean everything, return its exit status."""
        status = running.process.wait()
        clean_sandbox(running.row.id, self.store, self.cfg, exit_status=status)
        return status if status >= 0 else 128 - status


def _memfd(name: str, text: str) -> int:
    fd = os.memfd_create(f"lnk-{name}", os.MFD_CLOEXEC)
    os.write(fd, text.encode("utf-8"))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _set_winsize(fd: int, rows: int, cols: int) -> None:
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks: with the pid, a handle that survives reuse."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _read_status(fd: int, running: Running) -> None:
    """Read bwrap's --json-status-fd to its end (bwrap dies of SIGPIPE if nobody reads): the
    document with "child-pid" names the program's host pid."""
    buffer = b""
    try:
        while chunk := os.read(fd, 4096):
            if running.target_pid is not None or len(buffer) > MAX_STATUS_BYTES:
                continue
            buffer += chunk
            match = _CHILD_PID.search(buffer)
            if match:
                running.target_pid = int(match.group(1))
    finally:
        os.close(fd)
