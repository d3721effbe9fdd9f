"""Launching a sandbox: judge the spec as its owner sees it (launch_judge.py), write the record,
make the user and the mounts, plan the sandbox from what was made (sandbox_plan.py, pure), start
bwrap as that user, and hand back a handle to wait on. `Launcher._start` is the steps in order.

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

import contextlib
import dataclasses
import json
import logging
import os
import pwd
import select
import subprocess
import threading
from collections.abc import Callable, Mapping
from concurrent import futures
from datetime import timedelta
from pathlib import Path

from lnk_controller import (
    exec_mounts,
    host_users,
    idmap_mounts,
    proxy_link,
    sandbox_limits,
    secret_grants,
)
from lnk_controller.agent_launch import stage_agent
from lnk_controller.agents import AgentRegistry
from lnk_controller.as_caller import caller_credentials, credentials_of
from lnk_controller.bound import JudgedObject, close_all, open_judged
from lnk_controller.cleanup import PROXY_RECORD
from lnk_controller.config import ControllerConfig
from lnk_controller.denials import DenialReader
from lnk_controller.held_start import HeldStart
from lnk_controller.host_users import HostUser
from lnk_controller.judged import Judged, bound_grants, program_files
from lnk_controller.launch_end import Ending
from lnk_controller.launch_judge import LOADERS, Judging
from lnk_controller.launch_request import LaunchRequest
from lnk_controller.limits import Limits, requested, tmpfs_size
from lnk_controller.models import SandboxRow
from lnk_controller.remembered import RememberedSpecs
from lnk_controller.sandbox_plan import Prepared, plan_sandbox
from lnk_controller.sandbox_store import SandboxStore
from lnk_controller.secret_store import SecretStore
from lnk_controller.spawn import Running, start_time, watch_status
from lnk_controller.staging import Staged, hidden_mount_points, stage_sandbox
from lnk_controller.stdio_guard import GuardedStdio, guard_stdio
from lnk_controller.wall import Bind
from lnk_shared.errors import StateError

__all__ = ["Judged", "Launcher", "Running", "say_note"]

log = logging.getLogger(__name__)

SITE_PACKAGES = str(Path(__file__).resolve().parents[1])
# `lnk sandbox check`: the box's own probe program, run by the box's Python with -I -S (no site,
# no environment) from its site-packages. The caller chooses only its arguments, never the
# program.
PROBE_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from lnk_inside.probes import main; sys.exit(main(sys.argv[2:]))"
)


class Launcher(Judging, HeldStart, Ending):
    """Judges (`launch_judge.Judging`), starts (here and `held_start.HeldStart`) and ends
    (`launch_end.Ending`) sandboxes."""

    def __init__(
        self,
        cfg: ControllerConfig,
        store: SandboxStore,
        remembered: RememberedSpecs,
        agents: AgentRegistry | None = None,
        *,
        secrets: SecretStore | None = None,
        denials: DenialReader | None = None,
        left_to_reaper: Callable[[], None] = lambda: None,
    ) -> None:
        self.cfg = cfg
        self.denials = denials  # what the kernel denied each sandbox (None: not read)
        self.store = store
        self.remembered = remembered
        self.agents = agents
        self.secrets = secrets  # the owner's secret store: service rules' values
        self.uid_range = host_users.UidRange(cfg.uid_first, cfg.uid_last)
        # Makes sandbox users while their mounts are staged (they wait on the /etc lock anyway).
        self._user_maker = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="user")
        # The sandboxes whose launch is under way here (written, not yet cleaned): every other
        # live record is one the reaper reconciles (`active`).
        self._active: set[str] = set()
        self._active_guard = threading.Lock()
        self._left_to_reaper = left_to_reaper
        self.ledger = sandbox_limits.Ledger()  # what each owner runs now (their limits)
        self._places: dict[str, int] = {}  # sandbox id -> its owner's place in the ledger
        self._limits: dict[str, sandbox_limits.Applied] = {}  # sandbox id -> its limits

    def active(self) -> set[str]:
        """The ids of the sandboxes this launcher is starting, running or cleaning. Read after
        the records: a record is written and its id added here under one lock."""
        with self._active_guard:
            return set(self._active)

    def probe_request(self, request: LaunchRequest) -> LaunchRequest:
        """A check's request with the probe program in front of its arguments: the box's own
        Python (granted as a command for this launch only, as a user could grant it) running
        `lnk_inside.probes`, whatever the caller sent."""
        argv = (str(self.cfg.python), "-I", "-S", "-c", PROBE_BOOT, SITE_PACKAGES, *request.argv)
        return dataclasses.replace(request, argv=argv)

    # -- starting --------------------------------------------------------------------------

    def start(
        self, request: LaunchRequest, owner_uid: int, fds: list[int], judged: Judged
    ) -> Running:
        if judged.grants.spec.has_proxy and not self.cfg.proxy_admin_socket.exists():
            raise StateError(  # the box's state, as a store bridge not running is: exit 1
                "the spec opens [internet] or [lan] but the filtering proxy is not running; "
                "`lnk box up` starts it"
            )
        # The objects judged, opened (as the owner, without links) and compared before anything
        # of the sandbox exists: a swap since judging refuses here, leaving nothing behind.
        with caller_credentials(judged.caller or credentials_of(owner_uid)):
            sources = open_judged(
                self._objects(request, fds, judged),
                {real: fds[i] for real, i in request.grant_fds.items()},
                home=pwd.getpwuid(owner_uid).pw_dir,
                unsafe_skip_identity_check=self.cfg.unsafe_skip_identity_check,
            )
        try:
            return self._create_and_start(request, owner_uid, fds, judged, sources)
        finally:
            close_all(sources)

    def _objects(
        self, request: LaunchRequest, fds: list[int], judged: Judged
    ) -> list[JudgedObject]:
        ids = judged.identities
        objects = [JudgedObject(p, ids.get(p)) for p in self.paths_to_open(judged)]
        for grant in judged.grants.spec.with_fds:
            objects.append(JudgedObject(grant.path.real, ids.get(grant.path.real), grant.fd))
        return objects

    def _create_and_start(
        self,
        request: LaunchRequest,
        owner_uid: int,
        fds: list[int],
        judged: Judged,
        sources: Mapping[str, int],
    ) -> Running:
        wanted = judged.limits or requested(self.cfg.limits)
        limits = None if self.cfg.limits.unsafe_no_limits else wanted
        # The owner's place is taken before anything of the sandbox exists: over their count
        # or their memory, nothing is recorded, made or run.
        place = self.ledger.admit(self.cfg.limits, owner_uid, wanted)
        try:
            with self._active_guard:
                row = self.store.create(
                    owner_uid=owner_uid,
                    allocate=self._allocate,
                    host_name=host_users.user_name,
                    staging_root=self.cfg.staging_root,
                    command=[judged.program, *request.argv[1:]],
                    spec_hash=judged.digest,
                    lease=timedelta(seconds=self.cfg.lease_seconds),
                    staged=self._staged_names(judged),  # staging writes no record
                )
                self._active.add(row.id)
        except BaseException:
            self.ledger.release(place)
            raise
        self._places[row.id] = place
        try:
            return self._start(request, owner_uid, fds, judged, row, sources=sources, limits=limits)
        except BaseException:
            clean = self.clean_or_leave(row.id, None)
            if clean and self.agents is not None and judged.agent is not None:
                self.agents.stopped(row.host_uid)
            raise

    def _allocate(self, taken: set[int]) -> int:
        return host_users.allocate_uid(self.uid_range, taken | host_users.ids_in_use())

    def _start(
        self,
        request: LaunchRequest,
        owner_uid: int,
        fds: list[int],
        judged: Judged,
        row: SandboxRow,
        *,
        sources: Mapping[str, int],
        limits: Limits | None,
    ) -> Running:
        """The sandbox's steps, in order; whatever fails, the caller cleans what was made
        (`_create_and_start`). Everything made is recorded before it is made (staging.py)."""
        user, staged = self._user_and_mounts(owner_uid, judged, row, sources, limits)
        proxy_socket = self._stage_proxy(row, judged)
        agent_binds, agent_env = self._stage_agent(row, user, judged)
        owner_home = pwd.getpwuid(owner_uid).pw_dir
        hidden = hidden_mount_points(  # made to exist as the owner, to be covered
            judged.grants.hidden,
            home=owner_home,
            caller=judged.caller or credentials_of(owner_uid),
        )
        prepared = Prepared(staged, owner_home, hidden, proxy_socket, agent_binds, agent_env)
        plan = plan_sandbox(
            cfg=self.cfg,
            judged=judged,
            request=request,
            sandbox_id=row.id,
            user=user,
            prepared=prepared,
        )
        self._warn_unsafe(row)
        stdio, guarded = self._caller_streams(request, fds)
        say_note(stdio[2], plan.note)  # before the program exists: nothing it prints is first
        process, master, status_r = self._spawn(
            row,
            user,
            plan,
            (stdio, guarded),
            terminal=request.terminal,
            limits=limits,
            staged=staged,
            judged=judged,
        )
        running = self._running(row, process, master, status_r, guarded)
        running.note = plan.note
        return running

    def _user_and_mounts(
        self,
        owner_uid: int,
        judged: Judged,
        row: SandboxRow,
        sources: Mapping[str, int],
        limits: Limits | None,
    ) -> tuple[HostUser, Staged]:
        """Make the sandbox's user and stage its mounts, at once."""
        cfg = self.cfg
        grants = judged.grants
        # The record's uid was free in our records and in /etc when it was picked; another
        # box on this machine may still take it first, so that is a clean refusal, not a clash.
        # The user (its /etc lines, fsynced, and its home) is made while the mounts are staged:
        # neither needs the other, and nothing runs before both are done.
        user = host_users.sandbox_user(row.host_uid, homes_dir=cfg.homes_dir)
        making = self._user_maker.submit(
            host_users.create_user, row.host_uid, homes_dir=cfg.homes_dir
        )
        bound_read, bound_write, bound_fds, _ = bound_grants(judged)
        try:
            staged = stage_sandbox(
                sandbox_id=row.id,
                staging=Path(row.staging_dir),
                store=self.store,
                user=user,
                owner_uid=owner_uid,
                sources=sources,
                grants_read=bound_read,
                grants_write=bound_write,
                fd_grants=bound_fds,
                read_only_inside=grants.read_only_inside,
                execute=judged.execute,
                exec_anywhere=grants.spec.commands_any,
                tmp_size=(
                    tmpfs_size(cfg.tmp_size_mb * 1024 * 1024, limits)
                    if limits is not None
                    else cfg.tmp_size_mb * 1024 * 1024
                ),
                program_files=program_files(judged),
                unsafe=cfg.unsafe_switches,
                caller=judged.caller or credentials_of(owner_uid),
                programs_apart=self._programs_apart(judged),
                exec_over=exec_mounts.system_exec_binds(judged.execute, LOADERS)
                if self._programs_apart(judged)
                else (),
                hold=True,  # the placeholders that seal are made while bwrap starts
                recorded=frozenset(json.loads(row.mounts_json)),
            )
        finally:
            futures.wait([making])  # a clean-up after a failure must not race the creation
        making.result()  # the user's failure, when the staging did not fail first
        return user, staged

    def _stage_proxy(self, row: SandboxRow, judged: Judged) -> str | None:
        """With a proxy grant, the sandbox's listener at the proxy, staged to be bound inside:
        its staged path (recorded before it is made)."""
        grants = judged.grants
        if not grants.spec.has_proxy:
            return None
        self.store.add_mount(row.id, f"{PROXY_RECORD}{row.id}")
        services = secret_grants.service_fields(
            self.secrets, row.owner_uid, grants.spec.services, grants.spec.models
        )
        listener = proxy_link.open_listener(self.cfg, row.id, grants, services)
        staged_socket = Path(row.staging_dir) / "proxy.sock"
        self.store.add_mount(row.id, str(staged_socket))
        idmap_mounts.stage_bind(listener, staged_socket)
        return str(staged_socket)

    def _stage_agent(
        self, row: SandboxRow, user: HostUser, judged: Judged
    ) -> tuple[tuple[Bind, ...], dict[str, str]]:
        """An agent's key and bridge socket staged (agent_launch.py): their binds and its
        variables."""
        if judged.agent is None or self.agents is None:
            return (), {}
        agent_binds, agent_env = stage_agent(
            cfg=self.cfg,
            store=self.store,
            registry=self.agents,
            row=row,
            host_uid=user.uid,
            launch=judged.agent,
            spec_hash=judged.digest,
        )
        return tuple(agent_binds), agent_env

    def _warn_unsafe(self, row: SandboxRow) -> None:
        cfg = self.cfg
        for switch in cfg.unsafe_wall_switches():
            log.warning("sandbox %s: %s (a test setting; never on a real box)", row.id, switch)
        if cfg.unsafe_staging_open_to_all:
            os.chmod(row.staging_dir, 0o711)  # noqa: S103 - the test switch's whole point

    def _caller_streams(
        self, request: LaunchRequest, fds: list[int]
    ) -> tuple[tuple[int, int, int], GuardedStdio | None]:
        """The program's stdin, stdout and stderr: the caller's, or pipes standing in for a
        terminal or an append-only file of theirs (stdio_guard.py)."""
        cfg = self.cfg
        stdio = (fds[request.stdio[0]], fds[request.stdio[1]], fds[request.stdio[2]])
        guarded = None
        if request.terminal is None:  # with one, the sandbox gets a pty and none of these
            guarded = guard_stdio(
                stdio,
                unsafe_terminal=cfg.unsafe_caller_terminal,
                unsafe_append=cfg.unsafe_append_stdout,
            )
            stdio = guarded.streams
        return stdio, guarded

    def _running(
        self,
        row: SandboxRow,
        process: subprocess.Popen[bytes],
        master: int | None,
        status_r: int,
        guarded: GuardedStdio | None,
    ) -> Running:
        """The started sandbox, watched and recorded as running."""
        if guarded is not None:
            guarded.started()
        running = Running(row=row, process=process, terminal_master=master, stdio=guarded)
        watch_status(status_r, running)
        self.store.set(
            row.id,
            state="running",
            pid=process.pid,
            pid_start=start_time(process.pid),
            limits=self.limits_said(running),
        )
        return running


def say_note(fd: int, note: str) -> None:
    """Write `note` (a line, at most PIPE_BUF bytes: `sandbox_plan.cwd_note`) on the program's
    stderr, where the caller reads it before anything the program prints. Never blocks: to a
    pipe (or socket) that has no room for it now, it is not written, as to a stream that is
    closed or refuses it; the caller's stream is theirs, and the launch does not wait on it."""
    if not note:
        return
    with contextlib.suppress(OSError):
        ready = select.poll()
        ready.register(fd, select.POLLOUT)
        if ready.poll(0):
            os.write(fd, note.encode() + b"\n")
