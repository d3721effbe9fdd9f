"""What a sandbox gets when it runs as an agent (`lnk agent start`): the agent's folder as its
home, its private key, and its store bridge's socket.

- Home: `~/Link/Agents/NAME` of the owner, bound writable (idmapped like any write grant, from
  a descriptor the owner's client opened). It must be a real folder of the owner's, reached
  without links: the spec's refusal rules keep agents' folders out of every grant, so this is
  the one way in, and it is checked here instead.
- Key: a copy of the private key in a tmpfs of its own in the sandbox's staging folder, mode
  0400 and owned by the sandbox's host uid, bound read-only at `/run/lnk-agent/key.pem`. It is
  never in argv, environment or a log; the tmpfs goes with the sandbox's mounts at cleanup.
- Bridge: the store bridge opens the agent's socket for this host uid (admin socket); the
  controller clones the socket's folder into staging and binds it at `/run/lnk-bridge` (a
  bridge that restarts opens the socket again in that same folder), where a relay the
  confiner starts (before it blocks unix sockets) serves it on 127.0.0.1:`BRIDGE_PORT` of the
  sandbox's own loopback (so an agent's spec may not share this machine's network). Cleanup
  closes it (`BRIDGE_RECORD`).

Security limitations: the agent's folder is checked when the launch is judged and its
descriptor compared at staging (`staging._owner_fd`); a protected folder that a spec's own
grant covers (a grant of the whole home) is hidden over it, so such a spec gets no agent home.
"""

from __future__ import annotations

import logging
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.serialization import load_pem_private_key

from lnk_controller import bridge_link, idmap_mounts
from lnk_controller.agents import AgentPublic, AgentRegistry
from lnk_controller.as_caller import CallerCredentials, caller_credentials
from lnk_controller.cleanup import BRIDGE_RECORD
from lnk_controller.config import ControllerConfig
from lnk_controller.models import SandboxRow
from lnk_controller.sandbox_store import SandboxStore
from lnk_controller.wall import Bind
from lnk_shared.errors import LaunchRefused, StateError, UsageError

__all__ = [
    "AGENT_KEY_INSIDE",
    "BRIDGE_PORT",
    "BRIDGE_SOCKET_INSIDE",
    "AgentLaunch",
    "agent_for_launch",
    "reconcile_agents",
    "stage_agent",
]

log = logging.getLogger(__name__)

AGENT_DIR_INSIDE = "/run/lnk-agent"
AGENT_KEY_INSIDE = f"{AGENT_DIR_INSIDE}/key.pem"
BRIDGE_DIR_INSIDE = "/run/lnk-bridge"  # the agent's bridge folder: its socket, made again
BRIDGE_SOCKET_INSIDE = f"{BRIDGE_DIR_INSIDE}/bridge.sock"  # by a restarted bridge, is there
# Inside, programs cannot make unix sockets (the confiner's block): a relay started before the
# block serves the bridge's socket on this port of the sandbox's own loopback, as for the proxy.
BRIDGE_PORT = 3129
KEY_TMPFS_BYTES = 64 * 1024  # one PEM key
AGENTS_FOLDER = ("Link", "Agents")


@dataclass(frozen=True)
class AgentLaunch:
    agent: AgentPublic
    home: str  # the agent's folder: the sandbox's home


def agent_for_launch(
    registry: AgentRegistry, store: SandboxStore, caller: CallerCredentials, name: str
) -> AgentLaunch:
    """The caller's agent, not running, with its folder checked; `UsageError` or
    `LaunchRefused` saying what is wrong. The folder is looked at as the caller
    (`caller_credentials`): a link on the way into a folder the caller cannot search answers
    as any other link does, whatever is there."""
    agent = registry.get(caller.uid, name)
    if agent is None:
        raise UsageError(f"you have no agent named {name!r}: `lnk agent create {name}` first")
    live = {row.host_uid for row in store.find(live_only=True)}
    if agent.host_uid is not None and agent.host_uid in live:
        raise UsageError(f"agent {name!r} is already running (uid {agent.host_uid})")
    owner = pwd.getpwuid(caller.uid)
    shown = f"~/{'/'.join(AGENTS_FOLDER)}/{name}"
    with caller_credentials(caller):
        # Links above the owner's home are the machine's (/home -> /data/home); below it, none.
        home = os.path.join(os.path.realpath(owner.pw_dir), *AGENTS_FOLDER, name)
        linked = os.path.realpath(home) != home  # a link is a link, wherever it points
        try:
            info = None if linked else os.lstat(home)
        except OSError:
            raise LaunchRefused(shown, "the agent's folder is missing") from None
    if info is None or not stat.S_ISDIR(info.st_mode) or info.st_uid != caller.uid:
        raise LaunchRefused(
            shown, "the agent's folder must be a folder of yours, reached without links"
        )
    return AgentLaunch(agent, home)


def stage_agent(
    *,
    cfg: ControllerConfig,
    store: SandboxStore,
    registry: AgentRegistry,
    row: SandboxRow,
    host_uid: int,
    launch: AgentLaunch,
    spec_hash: str,
) -> tuple[list[Bind], dict[str, str]]:
    """Stage the key and the bridge socket; (binds, environment) for the sandbox."""
    agent = launch.agent
    staging = Path(row.staging_dir)
    key_dir = staging / "agent"
    store.add_mount(row.id, str(key_dir))
    idmap_mounts.stage_tmpfs(key_dir, uid=host_uid, gid=host_uid, size_bytes=KEY_TMPFS_BYTES)
    pem = registry.key_file(agent.agent_id).read_bytes()
    load_pem_private_key(pem, password=None)  # a damaged key file fails here, not inside
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(key_dir / "key.pem", flags, 0o400)
    try:
        os.write(fd, pem)
        os.fchown(fd, host_uid, host_uid)
        os.fchmod(fd, 0o400)
    finally:
        os.close(fd)
    store.add_mount(row.id, f"{BRIDGE_RECORD}{agent.agent_id}")
    socket = bridge_link.open_agent(cfg.run_dir, agent.agent_id, agent.public_key, host_uid)
    staged_bridge = staging / "bridge"
    store.add_mount(row.id, str(staged_bridge))
    idmap_mounts.stage_bind(socket.parent, staged_bridge, is_dir=True)
    registry.set_running(agent.agent_id, host_uid, spec_hash)
    binds = [
        Bind(str(key_dir), AGENT_DIR_INSIDE, False),
        Bind(str(staged_bridge), BRIDGE_DIR_INSIDE, False),
    ]
    env = {
        "LNK_AGENT": agent.agent_id,
        "LNK_AGENT_KEY": AGENT_KEY_INSIDE,
        "LNK_BRIDGE": f"127.0.0.1:{BRIDGE_PORT}",
    }
    return binds, env


def reconcile_agents(cfg: ControllerConfig, store: SandboxStore, registry: AgentRegistry) -> int:
    """At start, after the sandboxes' reconcile: an agent recorded as running without a live
    sandbox is stopped, and its socket closed at the bridge (which would otherwise open it again
    at its next start). Returns how many."""
    live = {row.host_uid for row in store.find(live_only=True)}
    stale = [a for a in registry.find(None) if a.host_uid is not None and a.host_uid not in live]
    for agent in stale:
        try:
            bridge_link.close_agent(cfg.run_dir, agent.agent_id)
        except StateError as exc:
            log.error("agent %s: its bridge socket was not closed: %s", agent.agent_id, exc)
        assert agent.host_uid is not None
        registry.stopped(agent.host_uid)
    return len(stale)
