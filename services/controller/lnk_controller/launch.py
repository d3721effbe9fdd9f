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
import stat
import subprocess
import threading
from collections.abc import Mapping
from concurrent import futures
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from lnk_controller import (
    bridge_link,
    client_proxy_env,
    exec_mounts,
    host_users,
    idmap_mounts,
    landlock,
    proxy_link,
    sandbox_limits,
    seccomp,
    secret_grants,
)
from lnk_controller.agent_launch import (
    AGENT_DIR_INSIDE,
    BRIDGE_PORT,
    BRIDGE_SOCKET_INSIDE,
    AgentLaunch,
    agent_for_launch,
    stage_agent,
)
from lnk_controller.agents import AgentRegistry
from lnk_controller.as_caller import CallerCredentials, caller_credentials, credentials_of
from lnk_controller.bound import JudgedObject, close_all, judged_identities, open_judged, same_spec
from lnk_controller.box_client import (
    CLIENT_NAME,
    CLIENT_PYTHON,
    CONNECTOR_NAME,
    box_client_links,
    inside_path,
)
from lnk_controller.cleanup import PROXY_RECORD, clean_sandbox
from lnk_controller.config import ControllerConfig
from lnk_controller.denial_hints import rules_of
from lnk_controller.denials import DenialReader
from lnk_controller.host_users import HostUser
from lnk_controller.launch_request import LaunchRequest, TerminalSize
from lnk_controller.limits import Limits, requested, requested_by_spec, tmpfs_size
from lnk_controller.limits import describe as describe_limits
from lnk_controller.models import SandboxRow
from lnk_controller.placeholders import make_held
from lnk_controller.remembered import RememberedSpecs, flags_key
from lnk_controller.sandbox_env import compose_environment
from lnk_controller.sandbox_store import SandboxStore
from lnk_controller.secret_store import SecretStore
from lnk_controller.spawn import (
    MIN_LANDLOCK_ABI,
    RELEASE,
    Running,
    confiner_policy,
    spawn_sandbox,
    start_time,
    watch_status,
)
from lnk_controller.staging import (
    Staged,
    hidden_mount_points,
    stage_sandbox,
    staged_names,
    wanted_binds,
    wanted_paths,
)
from lnk_controller.stdio_guard import GuardedStdio, guard_stdio
from lnk_controller.wall import Bind
from lnk_controller.write_links import symlink_places
from lnk_shared.cloud import detect_cloud
from lnk_shared.discovery import (
    DEFAULT_PATH,
    JudgeContext,
    PathNotFound,
    context_for,
    resolve_path,
    resolve_spec,
    writes_anything,
)
from lnk_shared.errors import (
    CommandRefused,
    LaunchRefused,
    ProgramCannotRunError,
    ProgramNotFoundError,
    SpecError,
    StateError,
)
from lnk_shared.grants import Grants, Identity, ResolvedPath, ResolvedSpec
from lnk_shared.opens import box_grant_lines, connector_grant_lines, describe, describe_changes
from lnk_shared.paths import SANDBOX_HOMES
from lnk_shared.refusals import check_self_widening, find_refusals, inside, judge
from lnk_shared.spec import FdGrant, Spec, SpecBuilder
from lnk_shared.spec_file import parse_spec_text, read_spec_text
from lnk_shared.spec_flags import spec_from_arguments
from lnk_shared.spec_models import base_url_value

__all__ = ["Judged", "Launcher", "Running"]

log = logging.getLogger(__name__)

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"  # PATH inside: system programs only
LOADERS = ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1")  # ELF interpreters
MAX_SHEBANG = 256  # bytes read to find a script's #! interpreter
SITE_PACKAGES = str(Path(__file__).resolve().parents[1])
# `lnk sandbox check`: the box's own probe program, run by the box's Python with -I -S (no site,
# no environment) from its site-packages. The caller chooses only its arguments, never the
# program.
PROBE_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from lnk_cli.check.probes import main; sys.exit(main(sys.argv[2:]))"
)


@dataclass(frozen=True)
class Judged:
    """A launch request judged: grants, the program to run, and whether it must be approved."""

    grants: Grants
    digest: str
    spec_key: str
    program: str
    execute: tuple[str, ...]
    approval_lines: tuple[str, ...] | None  # None: already approved
    agent: AgentLaunch | None = None  # `lnk agent start`: the agent this sandbox runs as
    # real path -> the object judged there (bound.py binds that object or refuses)
    identities: Mapping[str, Identity] = dataclasses.field(default_factory=dict)
    caller: CallerCredentials | None = None  # whose credentials it was judged with
    limits: Limits | None = None  # the box's, or less where the spec asked ([limits], flags)
    # [env] and --env (lnk_shared.env_names judged each): never in a repr, a log or the database
    env: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)


def _read_spec_fd(fd: int, builder: SpecBuilder) -> str:
    source = os.readlink(f"/proc/self/fd/{fd}")
    text = read_spec_text(fd, source)  # refused over MAX_SPEC_BYTES before it is parsed
    builder.source = source
    parse_spec_text(text, source=source, base=os.path.dirname(source), builder=builder)
    return source


def _find_program(
    name: str, cwd: str, granted: tuple[ResolvedPath, ...] = (), box_bin: Path | None = None
) -> str:
    """The program to run: a path as written, else (with `box_bin`, where the sandbox has the
    box's client on its PATH) `lnk` as the box's client, else the name on the sandbox's PATH,
    else a `[commands]` name the caller's PATH found (`--command tool -- tool`): its real
    program, the one judged (never the link it was found through)."""
    if "/" in name:
        return os.path.normpath(os.path.join(cwd, name))
    if box_bin is not None and name == CLIENT_NAME:
        return str(box_bin / CLIENT_NAME)
    for folder in SANDBOX_PATH.split(":"):
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK, effective_ids=True):
            return candidate
    for command in granted:
        if command.found_on_path is not None and command.written == name:
            return command.real
    raise ProgramNotFoundError(
        f"{name!r} is not a program found on the sandbox's PATH ({SANDBOX_PATH}) nor a "
        "[commands] name: grant it with --command NAME, or give its path"
    )


def _interpreter(path: str, box_bin: Path) -> str | None:
    """What runs `path` besides itself: a script's #! interpreter; for the box's own `lnk` (the
    C client, native/lnk_client.c, which runs the Python beside it for all but a plain
    `sandbox run`), that Python, as it was the interpreter of the `lnk` script before it."""
    if path == os.path.realpath(box_bin / CLIENT_NAME):
        return str(box_bin / CLIENT_PYTHON)
    try:
        with open(path, "rb") as f:
            head = f.read(MAX_SHEBANG)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].strip()
    return os.fsdecode(line.split()[0]) if line else None


def _bound(judged: Judged) -> tuple[list[str], list[str], list[tuple[str, bool]], tuple[str, ...]]:
    """What staging binds: (read grants, write grants with an agent's home, --with-fd grants,
    the programs it may execute)."""
    g = judged.grants
    return (
        [p.real for p in g.read],
        [p.real for p in g.write] + ([judged.agent.home] if judged.agent else []),
        [(f.path.real, f.write) for f in g.spec.with_fds],
        judged.execute,
    )


def _program_files(judged: Judged) -> frozenset[str]:
    """The programs judged as files: each is bound as the very file judged (staging)."""
    ids = judged.identities
    return frozenset(p for p in judged.execute if p in ids and ids[p].kind == stat.S_IFREG)


class Launcher:
    def __init__(
        self,
        cfg: ControllerConfig,
        store: SandboxStore,
        remembered: RememberedSpecs,
        agents: AgentRegistry | None = None,
        *,
        secrets: SecretStore | None = None,
        denials: DenialReader | None = None,
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
        self.ledger = sandbox_limits.Ledger()  # what each owner runs now (their limits)
        self._places: dict[str, int] = {}  # sandbox id -> its owner's place in the ledger
        self._limits: dict[str, sandbox_limits.Applied] = {}  # sandbox id -> its limits

    def active(self) -> set[str]:
        """The ids of the sandboxes this launcher is starting, running or cleaning. Read after
        the records: a record is written and its id added here under one lock."""
        with self._active_guard:
            return set(self._active)

    # -- judging ---------------------------------------------------------------------------

    def judge(
        self,
        request: LaunchRequest,
        owner_uid: int,
        fds: list[int],
        caller: CallerCredentials | None = None,
    ) -> Judged:
        """Judge the request as `caller` (the owner as the socket saw it) sees the machine:
        every path and program is looked up with its credentials, never root's."""
        caller = caller or credentials_of(owner_uid)
        self.preflight()
        agent = None
        if request.agent is not None:
            if self.agents is None:
                raise LaunchRefused("agents", "this controller keeps no agents")
            agent = agent_for_launch(self.agents, self.store, caller, request.agent)
        builder = SpecBuilder(unsafe_env_unjudged=self.cfg.unsafe_env_names_unjudged)
        if request.spec_fd is not None:
            _read_spec_fd(fds[request.spec_fd], builder)
        spec = spec_from_arguments(request.flags, cwd=request.cwd, builder=builder)
        with_fds = []
        for grant in spec.with_fds:
            if grant.fd not in request.with_fds:
                raise SpecError(f"descriptor {grant.fd} was not passed", source="--with-fd")
            with_fds.append(FdGrant(fds[request.with_fds[grant.fd]], grant.write))
        spec = dataclasses.replace(spec, with_fds=tuple(with_fds))
        # Over the box's limit: refused (exit 3, the limit named) before anything is asked.
        limits = requested_by_spec(self.cfg.limits, dict(spec.limits))
        env = {"PATH": request.path_env or DEFAULT_PATH}
        cloud = detect_cloud()  # the machine's firmware, read as root
        with caller_credentials(caller):
            looked_up = self._look_up(request, owner_uid, spec, env=env, cloud=cloud, agent=agent)
        ctx, resolved, program, interp, agent_home, box_programs = looked_up
        if request.spec_fd is not None:
            same_spec(fds[request.spec_fd], ctx)
        grants = judge(resolved, ctx)
        if agent_home is not None:
            check_self_widening(agent_home, "the agent's home", ctx)
        if grants.spec.store_driver is not None:
            self._check_store(grants.spec.store_driver, agent)
        if not request.dry:  # a rule's secret missing: refused, named, before anything starts
            secret_grants.check_present(
                self.secrets, owner_uid, grants.spec.services, grants.spec.models
            )
        if agent is not None and (grants.spec.network_host or BRIDGE_PORT in grants.spec.ports):
            raise LaunchRefused(
                "an agent's spec",
                f"[network] mode = host, or [localhost] port {BRIDGE_PORT}, would put its "
                "bridge's relay on this machine's loopback: not for an agent",
            )
        if agent is not None and BRIDGE_PORT in {m.port for m in grants.spec.models}:
            raise LaunchRefused(
                "an agent's spec",
                f"a [[models]] rule on port {BRIDGE_PORT}, the agent's bridge's: give it another",
            )

        execute: set[str] = set()
        program_path = program.written if program is not None else ""
        if program is not None:
            with_program = dataclasses.replace(resolved, commands=(*resolved.commands, program))
            for refusal in find_refusals(with_program, ctx):
                if "commands.allow" in refusal.entry:
                    raise CommandRefused(f"the program {request.argv[0]}", refusal.why)
            execute.add(program.real)
            if interp is not None:
                execute.add(interp.real)
        execute.update(os.path.realpath(p) for p in LOADERS if os.path.exists(p))
        if grants.spec.commands_any:
            execute.add("/")
        execute.update(c.real for c in grants.commands)
        execute.update(p.real for p in box_programs)  # granted by the box: box_client.py
        identities = judged_identities(
            (*grants.read, *grants.write, *(f.path for f in grants.spec.with_fds)),
            (
                *grants.commands,
                *box_programs,
                *(p for p in (program, interp, agent_home) if p is not None),
            ),
            ctx.home,
        )

        digest = grants.digest()
        # Flags alone: remembered by what they open, so two sets alternated ask once each.
        key = ctx.spec_file if spec.source and ctx.spec_file else flags_key(digest)
        known = self.remembered.lookup(owner_uid, key)
        lines: tuple[str, ...] | None = None
        if known is None:
            lines = (
                f"{spec.source or 'the spec given by flags'} has not run here before. It opens:",
                *describe(grants),
                *_box_grant_lines(box_programs),
            )
        elif known.grants_hash != digest:
            lines = (
                f"{spec.source or 'the spec given by flags'} opens something else since "
                "it was approved:",
                *describe_changes(known.grants_json, grants),
            )
        return Judged(
            grants,
            digest,
            key,
            program_path,
            tuple(sorted(execute)),
            lines,
            agent,
            identities,
            caller,
            limits,
            dict(spec.env),
        )

    def _look_up(
        self,
        request: LaunchRequest,
        owner_uid: int,
        spec: Spec,
        *,
        env: dict[str, str],
        cloud: str | None,
        agent: AgentLaunch | None,
    ) -> tuple[
        JudgeContext,
        ResolvedSpec,
        ResolvedPath | None,
        ResolvedPath | None,
        ResolvedPath | None,
        tuple[ResolvedPath, ...],
    ]:
        """Every lookup of the judging, made as the caller: the context, the spec's paths and
        programs, the program to run and its interpreter, the agent's home, and what the box
        grants besides (an agent's: its client, box_client.py)."""
        ctx = context_for(
            owner_uid,
            env=env,
            box=self.cfg.paths,
            spec_file=spec.source,
            cloud=cloud,
            login_path=writes_anything(spec),  # only a write is judged against them
        )
        if self.cfg.unsafe_login_path_unjudged:
            ctx = dataclasses.replace(ctx, login_path_dirs=())
        resolved = resolve_spec(spec, ctx, path_env=env["PATH"])
        if self.cfg.unsafe_path_links_unjudged:  # the links a name was found through, unseen
            unseen = tuple(
                dataclasses.replace(c, links=()) if c.found_on_path else c
                for c in resolved.commands
            )
            resolved = dataclasses.replace(resolved, commands=unseen)
        program = interp = agent_home = None
        if request.argv:  # empty only for an approval without a run (`lnk spec approve`)
            program_path = _find_program(
                request.argv[0],
                request.cwd,
                resolved.commands,
                self.cfg.python.parent if agent is not None else None,
            )
            try:
                program = resolve_path(program_path, base="/", home=ctx.home)
            except (OSError, PathNotFound):
                raise ProgramNotFoundError(
                    f"{request.argv[0]!r} cannot be run: no such program, or not one you can reach"
                ) from None
            program = dataclasses.replace(program, written=program_path)
            interp_path = _interpreter(program.real, self.cfg.python.parent)
            if interp_path is not None:
                try:
                    interp = resolve_path(interp_path, base="/", home=ctx.home)
                except PathNotFound:
                    raise ProgramCannotRunError(
                        f"{request.argv[0]!r} cannot be run: its interpreter {interp_path} "
                        "is missing, or not one you can reach"
                    ) from None
        if agent is not None:
            try:
                agent_home = resolve_path(agent.home, base="/", home=ctx.home)
            except PathNotFound:
                raise LaunchRefused(agent.home, "the agent's folder is missing") from None
        box_programs = self._box_programs(ctx, resolved, agent=agent is not None)
        return ctx, resolved, program, interp, agent_home, box_programs

    def _box_programs(
        self, ctx: JudgeContext, resolved: ResolvedSpec, *, agent: bool
    ) -> tuple[ResolvedPath, ...]:
        """What the box grants besides the spec, resolved (the install is root's and
        world-readable: the caller reaches it as anyone does): with a proxy, its ssh connector;
        in an agent's sandbox, its client. Only static programs: the client makes an agent's
        bridge calls itself, and the box never adds an interpreter to a finite list
        (box_client.py)."""
        names = ([CONNECTOR_NAME] if resolved.has_proxy else []) + ([CLIENT_NAME] if agent else [])
        out = []
        for name in names:
            path = str(self.cfg.python.parent / name)
            try:
                out.append(resolve_path(path, base="/", home=ctx.home))
            except PathNotFound:
                raise LaunchRefused(
                    "the box's client", f"{path} is missing: reinstall lnk"
                ) from None
        return tuple(out)

    def probe_request(self, request: LaunchRequest) -> LaunchRequest:
        """A check's request with the probe program in front of its arguments: the box's own
        Python (granted as a command for this launch only, as a user could grant it) running
        `lnk_cli.check.probes`, whatever the caller sent."""
        argv = (str(self.cfg.python), "-I", "-S", "-c", PROBE_BOOT, SITE_PACKAGES, *request.argv)
        return dataclasses.replace(request, argv=argv)

    def _check_store(self, driver: str, agent: AgentLaunch | None) -> None:
        """`[store] driver`: only an agent keeps a store, and only with the driver the box's
        store bridge runs (the database itself is the box's, never the spec's)."""
        if agent is None:
            raise LaunchRefused(
                "[store]", "only an agent keeps a store: start it with `lnk agent start`"
            )
        running = bridge_link.store_driver(self.cfg.run_dir)
        if driver != running:
            raise LaunchRefused(
                "[store]",
                f"the spec keeps its store with {driver!r}, but this box's store bridge runs "
                f"{running!r}: name {running!r}, or ask the box's admin",
            )

    def paths_to_open(self, judged: Judged) -> list[str]:
        """The folders and programs the client must pass open (as the owner) to be bound."""
        apart = self._programs_apart(judged)
        return wanted_paths(*_bound(judged), _program_files(judged), programs_apart=apart)

    def _staged_names(self, judged: Judged) -> tuple[str, ...]:
        """What staging will mount in the sandbox's staging folder: written with its record."""
        apart = self._programs_apart(judged)
        binds = wanted_binds(*_bound(judged), _program_files(judged), programs_apart=apart)
        return staged_names(len(binds), programs_apart=apart)

    def _programs_apart(self, judged: Judged) -> bool:
        """Whether the loader gap is closed for this sandbox (`exec_mounts.py`): under a finite
        list, unless the test switch reopens it."""
        return not judged.grants.spec.commands_any and not self.cfg.unsafe_loader_maps_anything

    def approve(self, owner_uid: int, judged: Judged) -> None:
        self.remembered.remember(
            owner_uid, judged.spec_key, judged.digest, judged.grants.canonical_json()
        )

    # -- starting --------------------------------------------------------------------------

    def preflight(self) -> None:
        """Refuse, naming the missing capability, before anything of a sandbox exists."""
        cfg = self.cfg
        if not os.access(cfg.bwrap, os.X_OK):
            raise LaunchRefused("bubblewrap", f"{cfg.bwrap} is missing: install bubblewrap")
        if not os.access(cfg.confiner, os.X_OK) or not cfg.confiner.is_file():
            raise LaunchRefused(
                "the confiner",
                f"{cfg.confiner} (the confiner, lnk-sandbox) is missing or not executable: "
                "reinstall lnk",
            )
        if not os.access(cfg.spawner, os.X_OK) or not cfg.spawner.is_file():
            raise LaunchRefused(
                "the launcher",
                f"{cfg.spawner} (the launcher, lnk-spawn) is missing or not executable: "
                "reinstall lnk",
            )
        if not cfg.confiner.resolve().is_relative_to(cfg.prefix.resolve()):
            raise LaunchRefused(
                "the confiner",
                f"{cfg.confiner} is outside {cfg.prefix}, so a sandbox cannot see it",
            )
        machine = os.uname().machine
        if machine not in seccomp.SUPPORTED_MACHINES:
            raise LaunchRefused("seccomp", f"no syscall filter for the architecture {machine}")
        seccomp.programs()  # compiled once per process; a failure refuses, naming libseccomp
        abi = landlock.probe_abi()
        if cfg.unsafe_pretend_landlock_abi is not None:
            abi = min(abi, cfg.unsafe_pretend_landlock_abi)
        if abi < MIN_LANDLOCK_ABI:
            raise LaunchRefused(
                "Landlock",
                f"Landlock ABI {MIN_LANDLOCK_ABI} (abstract-socket and signal scoping) is needed, "
                f"the kernel has {abi}",
            )

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
        bound_read, bound_write, bound_fds, _ = _bound(judged)
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
                program_files=_program_files(judged),
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
        home = f"{SANDBOX_HOMES}/{user.name}"
        visible = [b.dest for b in staged.binds]
        binds = list(staged.binds)
        relay: dict[str, object] = {}
        if grants.spec.has_proxy:
            self.store.add_mount(row.id, f"{PROXY_RECORD}{row.id}")
            services = secret_grants.service_fields(
                self.secrets, row.owner_uid, grants.spec.services, grants.spec.models
            )
            listener = proxy_link.open_listener(cfg, row.id, grants, services)
            staged_socket = Path(row.staging_dir) / "proxy.sock"
            self.store.add_mount(row.id, str(staged_socket))
            idmap_mounts.stage_bind(listener, staged_socket)
            binds.append(Bind(str(staged_socket), proxy_link.PROXY_SOCKET_INSIDE, False))
            relay = {
                "relay_socket": proxy_link.PROXY_SOCKET_INSIDE,
                "relay_port": proxy_link.relay_port(_inside_ports(grants)),
                # a model rule's port too: the proxy serves the model there, never raw
                "relay_localhost": list(_inside_ports(grants)),
            }
        agent_env: dict[str, str] = {}
        if judged.agent is not None and self.agents is not None:
            agent_binds, agent_env = stage_agent(
                cfg=cfg,
                store=self.store,
                registry=self.agents,
                row=row,
                host_uid=user.uid,
                launch=judged.agent,
                spec_hash=judged.digest,
            )
            binds += agent_binds
            agent_env["HOME"] = judged.agent.home  # the agent's folder is its home
        default_cwd = judged.agent.home if judged.agent else home
        cwd = request.cwd if any(inside(request.cwd, d) for d in visible) else default_cwd
        env = compose_environment(
            identity={
                "PATH": inside_path(SANDBOX_PATH, with_client=judged.agent is not None),
                "HOME": home,
                "USER": user.name,
                "LOGNAME": user.name,
                "SHELL": "/bin/bash",
                "TMPDIR": "/tmp",
                "LNK_SANDBOX_ID": row.id,
            },
            terminal=request.env,
            user=judged.env,
            services={
                **(
                    client_proxy_env.proxy_env(
                        proxy_link.relay_port(_inside_ports(grants)),
                        request.env,
                        connector=str(cfg.python.parent / CONNECTOR_NAME),
                        owner_home=pwd.getpwuid(owner_uid).pw_dir,
                    )
                    if relay
                    else {}
                ),
                **secret_grants.placeholder_env(grants.spec.services),
                **{m.env: base_url_value(m) for m in grants.spec.models},  # the box's
                **secret_grants.hosted_key_env(grants.spec.models),
                **agent_env,
            },
            unsafe_unjudged=cfg.unsafe_env_names_unjudged,
        )
        granted_writes = [b.dest for b in staged.binds if b.write]
        private_writes = ["/tmp", "/dev/shm", home, "/dev"]
        policy = confiner_policy(
            reads=["/usr", "/etc", str(cfg.prefix), "/proc", *visible]
            + ([AGENT_DIR_INSIDE] if judged.agent else []),
            writes=[*granted_writes, *private_writes],
            execute=judged.execute,
            network_host=grants.spec.network_host,
            pretend_abi=cfg.unsafe_pretend_landlock_abi,
            unsafe_seccomp=cfg.unsafe_seccomp,
        )
        policy["symlink"] = symlink_places(
            private_writes, granted_writes, unsafe=cfg.unsafe_write_symlinks
        )
        policy.update(relay)
        if judged.agent is not None:
            policy.update({"bridge_socket": BRIDGE_SOCKET_INSIDE, "bridge_port": BRIDGE_PORT})
        layout_args = {
            "home": Bind(staged.home, home, True),
            "tmp": Bind(staged.tmp, "/tmp", True),
            "shm": Bind(staged.shm, "/dev/shm", True),
            "binds": tuple(binds),
            "read_only_inside": staged.read_only,
            "hidden": hidden_mount_points(
                grants.hidden,
                home=pwd.getpwuid(owner_uid).pw_dir,
                caller=judged.caller or credentials_of(owner_uid),
            ),
            "network_host": grants.spec.network_host,
            "system_sources": {"/usr": staged.usr} if staged.usr else {},
            "cwd": cwd,
            "env": env,
            "box_links": box_client_links(cfg.python.parent) if judged.agent else {},
            "command": (str(cfg.confiner), "--", judged.program, *request.argv[1:]),
        }
        for switch in cfg.unsafe_wall_switches():
            log.warning("sandbox %s: %s (a test setting; never on a real box)", row.id, switch)
        if cfg.unsafe_staging_open_to_all:
            os.chmod(row.staging_dir, 0o711)  # noqa: S103 - the test switch's whole point
        stdio = (fds[request.stdio[0]], fds[request.stdio[1]], fds[request.stdio[2]])
        guarded = None
        if request.terminal is None:  # with one, the sandbox gets a pty and none of these
            guarded = guard_stdio(
                stdio,
                unsafe_terminal=cfg.unsafe_caller_terminal,
                unsafe_append=cfg.unsafe_append_stdout,
            )
            stdio = guarded.streams
        process, master, status_r = self._spawn(
            row=row,
            user=user,
            layout_args=layout_args,
            policy=policy,
            stdio=stdio,
            terminal=request.terminal,
            limits=limits,
            staged=staged,
            judged=judged,
            guarded=guarded,
        )
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

    def _spawn(
        self,
        *,
        row: SandboxRow,
        user: HostUser,
        layout_args: dict[str, object],
        policy: dict[str, object],
        stdio: tuple[int, int, int],
        terminal: TerminalSize | None,
        limits: Limits | None,
        staged: Staged,
        judged: Judged,
        guarded: GuardedStdio | None,
    ) -> tuple[subprocess.Popen[bytes], int | None, int]:
        """Start the sandbox's chain; for a held start, make its placeholders meanwhile and
        release its program. Whatever fails, nothing of the program has run."""
        cfg = self.cfg
        # A held start (placeholders left to make, `Staged.held`): the confiner waits on this
        # pipe, which only this thread writes, until every one is made and sealed.
        release_r, release_w = os.pipe2(os.O_CLOEXEC) if staged.held else (-1, -1)
        try:
            if self.denials is not None:  # before its first process: its first denial is mapped
                self.denials.started(row.id, row.host_uid)
            process, master, status_r = spawn_sandbox(
                cfg=cfg,
                row=row,
                user=user,
                layout_args=layout_args,
                policy=policy,
                stdio=stdio,
                terminal=terminal,
                limiter=lambda group: self._apply_limits(row.id, group, limits),
                release_fd=release_r,
            )
        except BaseException:
            if guarded is not None:
                guarded.close()
            if release_w >= 0:
                os.close(release_w)
            raise
        finally:
            if release_r >= 0:
                os.close(release_r)
        if release_w >= 0:
            try:
                self._release_held(row, staged, judged, release_w)
            except BaseException:
                process.kill()  # never released: the confiner refuses at the pipe's end
                process.wait()
                os.close(status_r)
                if master is not None:
                    os.close(master)
                if guarded is not None:
                    guarded.close()
                raise
        return process, master, status_r

    def _release_held(
        self, row: SandboxRow, staged: Staged, judged: Judged, release_w: int
    ) -> None:
        """Make and seal the placeholders of a held start while bwrap and the confiner start,
        then release the program (`spawn.RELEASE`); the pipe is closed either way, and a
        confiner that reads its end without the release refuses to run anything."""
        try:
            make_held(
                staged.held,
                sandbox_id=row.id,
                store=self.store,
                caller=judged.caller or credentials_of(row.owner_uid),
            )
            os.write(release_w, RELEASE)
        finally:
            os.close(release_w)

    def _apply_limits(self, sandbox_id: str, group: Path, limits: Limits | None) -> list[str]:
        applied = sandbox_limits.apply(self.cfg.limits, sandbox_id, group, limits)
        self._limits[sandbox_id] = applied
        return applied.launcher_args()

    def limits_outcome(self, running: Running) -> str | None:
        """The limit the sandbox met, said to its client (read before its clean-up)."""
        applied = self._limits.get(running.row.id)
        met = sandbox_limits.outcome(applied) if applied is not None else None
        if met is not None:  # `lnk sandbox list` and `show` say it too
            self.store.set(running.row.id, limit_met=met)
        return met

    def denials_outcome(self, running: Running, status: int) -> str | None:
        """What the kernel denied the sandbox, kept for `show` and said to its client when its
        program failed (read before its clean-up, as its limits are)."""
        summary = self.denials.ended(running.row.id, running.row.host_uid) if self.denials else None
        if summary is None or not summary.count:
            return None
        try:  # the owner's rules, so a hint never names a grant the box refuses
            owner = running.row.owner_uid
            ctx = context_for(owner, env={"PATH": DEFAULT_PATH}, box=self.cfg.paths)
            lines = summary.lines(ctx.home, rules_of(ctx))
            self.store.set(
                running.row.id, denials=json.dumps({"count": summary.count, "examples": lines})
            )
        except (SpecError, StateError, OSError) as exc:  # the run's status matters more
            log.error("sandbox %s: its denials are not recorded: %s", running.row.id, exc)
            return None
        return summary.said(running.row.id, lines) if status != 0 else None

    def limits_said(self, running: Running) -> str:
        """The sandbox's limits as a person reads them (`lnk sandbox check` reports them)."""
        applied = self._limits.get(running.row.id)
        if applied is None or applied.limits is None:
            return "none (limits.unsafe_no_limits)"
        held = [f"v2 {c}" for c in applied.v2] + [f"v1 {c}" for c in applied.v1]
        where = ", ".join(held) or "none, rlimits only"
        return f"{describe_limits(applied.limits)} (cgroups: {where})"

    def _release(self, sandbox_id: str) -> None:
        """Give back the owner's place and remove the limits' groups (after the clean-up
        emptied the sandbox's cgroup)."""
        place = self._places.pop(sandbox_id, None)
        if place is not None:
            self.ledger.release(place)
        applied = self._limits.pop(sandbox_id, None)
        if applied is not None:
            sandbox_limits.release(applied)

    def waited(self, running: Running) -> int:
        """Wait for the sandbox's program; its exit status (128+N for a signal, as shells do)."""
        status = running.process.wait()
        if running.stdio is not None:  # its output reaches the caller before its status
            running.stdio.drain()
        return status if status >= 0 else 128 - status

    def clean(self, running: Running, status: int) -> None:
        """Clean the sandbox away once its program is over. A clean-up that fails (something
        left, or the database unwritable: a full disk) is logged and left to the reaper, which
        retries it until it lands: the program's status is known, and its client gets it."""
        if self.clean_or_leave(running.row.id, status) and self.agents is not None:
            try:
                self.agents.stopped(running.row.host_uid)
            except StateError as exc:  # the agent's stale uid is forgotten at its next start
                log.error("sandbox %s: %s", running.row.id, exc)

    def clean_or_leave(self, sandbox_id: str, status: int | None) -> bool:
        """Clean the sandbox, or leave it to the reaper: whether it is clean."""
        try:
            clean_sandbox(sandbox_id, self.store, self.cfg, exit_status=status)
            return True
        except StateError as exc:
            log.error("%s; the reaper retries it", exc)
            return False
        finally:
            self._release(sandbox_id)
            with self._active_guard:
                self._active.discard(sandbox_id)


def _box_grant_lines(box_programs: tuple[ResolvedPath, ...]) -> list[str]:
    """The approval's lines for what the box grants: its connector, its client (and Python)."""
    connector = [p.real for p in box_programs if os.path.basename(p.real) == CONNECTOR_NAME]
    client = [p.real for p in box_programs if os.path.basename(p.real) != CONNECTOR_NAME]
    return [*connector_grant_lines(connector), *(box_grant_lines(client) if client else ())]


def _inside_ports(grants: Grants) -> tuple[int, ...]:
    """The loopback ports the relay serves inside the sandbox: `[localhost]` and model rules'."""
    return (*grants.spec.ports, *(m.port for m in grants.spec.models))
