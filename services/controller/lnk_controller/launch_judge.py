"""Judging a launch request as its owner sees the machine: the spec read and resolved with the
caller's credentials, the program and its interpreter found, what the box grants besides, the
refusals, and whether the owner must approve it (`Judged`). Nothing of a sandbox exists yet.

The owner proves what they can reach: every path and program is looked up with the caller's
credentials (`as_caller`), never root's, and what was judged there is kept by its identity
(`bound.py`), so the launch binds that very object or refuses.

What this does NOT do: open, stage or run anything (launch.py does, after the approval).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from lnk_controller import bridge_link, secret_grants
from lnk_controller.agent_launch import AgentLaunch, agent_for_launch
from lnk_controller.agents import AgentRegistry
from lnk_controller.as_caller import CallerCredentials, caller_credentials, credentials_of
from lnk_controller.bound import judged_identities, same_spec
from lnk_controller.box_client import CLIENT_NAME, CONNECTOR_NAME
from lnk_controller.config import ControllerConfig
from lnk_controller.judged import Judged, bound_grants, program_files
from lnk_controller.launch_request import LaunchRequest
from lnk_controller.limits import requested_by_spec
from lnk_controller.preflight import preflight
from lnk_controller.remembered import RememberedSpecs, flags_key
from lnk_controller.sandbox_plan import SANDBOX_PATH, check_agent_network
from lnk_controller.sandbox_store import SandboxStore
from lnk_controller.secret_store import SecretStore
from lnk_controller.staging import staged_names, wanted_binds, wanted_paths
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
)
from lnk_shared.grants import ResolvedPath, ResolvedSpec
from lnk_shared.opens import box_grant_lines, connector_grant_lines, describe, describe_changes
from lnk_shared.refusals import check_self_widening, find_refusals, judge
from lnk_shared.spec import FdGrant, Spec, SpecBuilder
from lnk_shared.spec_file import parse_spec_text, read_spec_text
from lnk_shared.spec_flags import spec_from_arguments

__all__ = ["LOADERS", "Judging"]

LOADERS = ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1")  # ELF interpreters
MAX_SHEBANG = 256  # bytes read to find a script's #! interpreter


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


def _interpreter(path: str) -> str | None:
    """What runs `path` besides itself: a script's #! interpreter. The box's own `lnk` is the
    static C client (native/lnk_client.c) and needs none: the box grants it alone, never the
    Python behind it (box_client.py), also where it is the sandbox's program."""
    try:
        with open(path, "rb") as f:
            head = f.read(MAX_SHEBANG)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].strip()
    return os.fsdecode(line.split()[0]) if line else None


class Judging:
    """The launcher's judging (`launch.Launcher` is one): judge, approve, and what the client
    must pass open for a judged request."""

    cfg: ControllerConfig
    store: SandboxStore
    remembered: RememberedSpecs
    agents: AgentRegistry | None
    secrets: SecretStore | None  # the owner's secret store: service rules' values

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
        preflight(self.cfg)
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
        if agent is not None:
            check_agent_network(grants)

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
            interp_path = _interpreter(program.real)
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
        return wanted_paths(*bound_grants(judged), program_files(judged), programs_apart=apart)

    def _staged_names(self, judged: Judged) -> tuple[str, ...]:
        """What staging will mount in the sandbox's staging folder: written with its record."""
        apart = self._programs_apart(judged)
        binds = wanted_binds(*bound_grants(judged), program_files(judged), programs_apart=apart)
        return staged_names(len(binds), programs_apart=apart)

    def _programs_apart(self, judged: Judged) -> bool:
        """Whether the loader gap is closed for this sandbox (`exec_mounts.py`): under a finite
        list, unless the test switch reopens it."""
        return not judged.grants.spec.commands_any and not self.cfg.unsafe_loader_maps_anything

    def approve(self, owner_uid: int, judged: Judged) -> None:
        self.remembered.remember(
            owner_uid, judged.spec_key, judged.digest, judged.grants.canonical_json()
        )


def _box_grant_lines(box_programs: tuple[ResolvedPath, ...]) -> list[str]:
    """The approval's lines for what the box grants: its connector, its client (and Python)."""
    connector = [p.real for p in box_programs if os.path.basename(p.real) == CONNECTOR_NAME]
    client = [p.real for p in box_programs if os.path.basename(p.real) != CONNECTOR_NAME]
    return [*connector_grant_lines(connector), *(box_grant_lines(client) if client else ())]
