"""The sandbox's plan: its environment, the confiner's policy and bwrap's layout, composed from
values alone (the judged grants, what the launch staged, the sandbox's user, the config).

This is the security-relevant composition of a launch, kept apart from its I/O so that it is
read and tested in one place, without root (tests/unit/lnk_controller/test_sandbox_plan.py):
the launch (launch.py) stages first, reads what the plan needs from the file system into
`Prepared`, then calls `plan_sandbox`, and hands the plan to `spawn.spawn_sandbox`, which adds
only descriptors and what it reads of the host's system folders.

What the plan guarantees, given its inputs:
- the environment is exactly the box's identity of the sandbox, the caller's terminal and
  locale (already filtered by launch_request), the spec's judged `[env]`, and the box's service
  variables (`sandbox_env.compose_environment`); nothing of the controller's own;
- every place the sandbox may write (granted write folders, its /tmp, /dev/shm, home and /dev)
  is in Landlock's write list and nothing else is; the box's prefix and read grants are bound
  read-only; a `[commands]` finite list executes exactly the judged programs;
- an agent never shares the host's network nor has its bridge's port taken by a `[localhost]`
  or model rule (`check_agent_network`, also called by the judging, so a spec is refused before
  it is approved);
- a proxy grant binds the staged listener inside and sets the relay's policy and the client
  variables (`client_proxy_env`);
- the program starts in the caller's folder when it is visible inside, else in the sandbox's
  home (the agent's folder), and then the plan's `note` says so (`cwd_note`): the launch
  writes it on the program's stderr before the program exists, so it comes before anything
  the program prints, whichever client (or an old one) started it.

What this does NOT do: stage, open or check anything (the launch does, before), or decide what
is granted (`lnk_shared.refusals`). The mounts' own flags (noexec, read-only idmapped clones) are
made by staging.py; the plan only places them.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from lnk_controller import client_proxy_env, proxy_link, secret_grants
from lnk_controller.agent_launch import AGENT_DIR_INSIDE, BRIDGE_PORT, BRIDGE_SOCKET_INSIDE
from lnk_controller.box_client import CONNECTOR_NAME, box_client_links, inside_path
from lnk_controller.config import ControllerConfig
from lnk_controller.judged import Judged
from lnk_controller.launch_request import LaunchRequest
from lnk_controller.sandbox_env import compose_environment
from lnk_controller.spawn import confiner_policy
from lnk_controller.staging import Staged
from lnk_controller.uid_range import HostUser
from lnk_controller.wall import Bind, SandboxLayout, bwrap_argv
from lnk_controller.write_links import symlink_places
from lnk_shared.display import shown
from lnk_shared.errors import LaunchRefused
from lnk_shared.grants import Grants
from lnk_shared.paths import SANDBOX_HOMES
from lnk_shared.refusals import inside
from lnk_shared.spec_models import base_url_value

__all__ = [
    "NOTE_LIMIT",
    "SANDBOX_PATH",
    "Prepared",
    "SandboxPlan",
    "check_agent_network",
    "cwd_note",
    "inside_ports",
    "plan_sandbox",
]

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"  # PATH inside: system programs only
NOTE_LIMIT = 4096  # bytes: PIPE_BUF, so one write of the note to a pipe with room is whole


@dataclass(frozen=True)
class Prepared:
    """What the launch's I/O made or read for the plan, before it: the staged mounts, the
    staged proxy listener (a proxy grant), an agent's staged binds and variables, the protected
    folders made to exist (`staging.hidden_mount_points`), and the owner's home."""

    staged: Staged
    owner_home: str
    hidden: tuple[str, ...] = ()
    proxy_socket: str | None = None
    agent_binds: tuple[Bind, ...] = ()
    agent_env: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class SandboxPlan:
    """The sandbox as it will be: the confiner's policy, and bwrap's layout with the
    environment in it (`layout.env`); its descriptors are the spawn's to add."""

    policy: Mapping[str, Any]
    layout: SandboxLayout
    note: str = ""  # said to the caller before the program starts (`cwd_note`), or nothing

    @property
    def env(self) -> Mapping[str, str]:
        return self.layout.env

    def bwrap_args(self, *, bwrap: str = "/usr/bin/bwrap") -> list[str]:
        """bwrap's arguments in order, as far as the plan decides them (no host system folder
        and no descriptor: the spawn adds those)."""
        return bwrap_argv(self.layout, bwrap=bwrap)


def inside_ports(grants: Grants) -> tuple[int, ...]:
    """The loopback ports the relay serves inside the sandbox: `[localhost]` and model rules'."""
    return (*grants.spec.ports, *(m.port for m in grants.spec.models))


def check_agent_network(grants: Grants) -> None:
    """Refuse what would put an agent's bridge relay on this machine's loopback, or take its
    port inside."""
    if grants.spec.network_host or BRIDGE_PORT in grants.spec.ports:
        raise LaunchRefused(
            "an agent's spec",
            f"[network] mode = host, or [localhost] port {BRIDGE_PORT}, would put its "
            "bridge's relay on this machine's loopback: not for an agent",
        )
    if BRIDGE_PORT in {m.port for m in grants.spec.models}:
        raise LaunchRefused(
            "an agent's spec",
            f"a [[models]] rule on port {BRIDGE_PORT}, the agent's bridge's: give it another",
        )


def plan_sandbox(
    *,
    cfg: ControllerConfig,
    judged: Judged,
    request: LaunchRequest,
    sandbox_id: str,
    user: HostUser,
    prepared: Prepared,
) -> SandboxPlan:
    """The sandbox's plan (the module's docstring says what it guarantees). Refuses an
    agent's network the judging should have refused already, and a user's variable a box layer
    sets (`EnvRefused`)."""
    grants = judged.grants
    if judged.agent is not None:
        check_agent_network(grants)
    if grants.spec.has_proxy and prepared.proxy_socket is None:
        raise LaunchRefused(
            "the proxy", "no listener was staged for the spec's [internet] or [lan]: a launch bug"
        )
    staged = prepared.staged
    home = f"{SANDBOX_HOMES}/{user.name}"
    visible = [b.dest for b in staged.binds]
    binds = list(staged.binds)
    relay: dict[str, object] = {}
    if prepared.proxy_socket is not None:
        binds.append(Bind(prepared.proxy_socket, proxy_link.PROXY_SOCKET_INSIDE, False))
        relay = {
            "relay_socket": proxy_link.PROXY_SOCKET_INSIDE,
            "relay_port": proxy_link.relay_port(inside_ports(grants)),
            # a model rule's port too: the proxy serves the model there, never raw
            "relay_localhost": list(inside_ports(grants)),
        }
    agent_env: dict[str, str] = {}
    if judged.agent is not None:
        binds += prepared.agent_binds
        agent_env = {**prepared.agent_env, "HOME": judged.agent.home}  # its folder: its home
    default_cwd = judged.agent.home if judged.agent else home
    cwd = request.cwd if any(inside(request.cwd, d) for d in visible) else default_cwd
    note = cwd_note(request.cwd, cwd)
    env = compose_environment(
        identity={
            "PATH": inside_path(SANDBOX_PATH, with_client=judged.agent is not None),
            "HOME": home,
            "USER": user.name,
            "LOGNAME": user.name,
            "SHELL": "/bin/bash",
            "TMPDIR": "/tmp",
            "LNK_SANDBOX_ID": sandbox_id,
        },
        terminal=request.env,
        user=judged.env,
        services={
            **(
                client_proxy_env.proxy_env(
                    proxy_link.relay_port(inside_ports(grants)),
                    request.env,
                    connector=str(cfg.python.parent / CONNECTOR_NAME),
                    owner_home=prepared.owner_home,
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
    layout = SandboxLayout(
        uid=user.uid,
        gid=user.gid,
        user_name=user.name,
        prefix=str(cfg.prefix),
        terminal=request.terminal is not None,
        unsafe_writable_dev=cfg.unsafe_writable_dev,
        home=Bind(staged.home, home, True),
        tmp=Bind(staged.tmp, "/tmp", True),
        shm=Bind(staged.shm, "/dev/shm", True),
        binds=tuple(binds),
        read_only_inside=staged.read_only,
        hidden=prepared.hidden,
        network_host=grants.spec.network_host,
        system_dirs=("/usr",),  # and the merged-usr folders that are not links (the spawn's)
        system_sources={"/usr": staged.usr} if staged.usr else {},
        cwd=cwd,
        env=env,
        box_links=box_client_links(cfg.python.parent) if judged.agent else {},
        command=(str(cfg.confiner), "--", judged.program, *request.argv[1:]),
    )
    return SandboxPlan(policy=MappingProxyType(policy), layout=layout, note=note)


def cwd_note(asked: str, starts_in: str) -> str:
    """What the caller is told when the sandbox does not start in their folder `asked` (it is
    not granted, so not there inside): where it starts instead, and the flags that grant it.
    Nothing when it starts where asked. The path is the caller's, shown with every control
    character escaped (it goes to their terminal) and quoted for a shell in the flags; cut to
    NOTE_LIMIT, so one write of it never blocks on a pipe with room (`launch.say_note`)."""
    if asked == starts_in:
        return ""
    path = shown(asked)
    grant = shlex.quote(path)
    note = (
        f"lnk: note: {path} is not granted to this sandbox; it starts in {shown(starts_in)} "
        f"(grant it with --read {grant} or --write {grant})"
    )
    if len(note.encode()) < NOTE_LIMIT:  # and its newline
        return note
    return f"lnk: note: your folder is not granted to this sandbox; it starts in {shown(starts_in)}"
