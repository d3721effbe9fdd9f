"""Agents' bridge sockets follow their records: a socket the store bridge holds open for an
agent that no live sandbox has (stopped or removed while the bridge was down, which opens
again at its start every socket it had open) is closed.

Every BRIDGE_RECONCILE_S, the bridge is asked which sockets it holds open; the live records
are read after that answer, so a socket a launch is opening right now is never taken for a
stale one (a launch records `bridge:<agent>` before it asks the bridge to open it); each open
socket no live record names is closed (`stale_agents`, a pure function).

Does NOT: close a stale socket sooner than BRIDGE_RECONCILE_S after the bridge is back (in
that window the socket exists, but its uid has no sandbox, or a new sandbox's that cannot sign
as the agent: the bridge checks every call's proof against the agent's key); reach a bridge
that does not answer (tried again at the next round).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable

from lnk_controller import bridge_link
from lnk_controller.cleanup import BRIDGE_RECORD
from lnk_controller.config import ControllerConfig
from lnk_controller.models import SandboxRow
from lnk_controller.sandbox_store import SandboxStore
from lnk_shared.errors import StateError

__all__ = ["BRIDGE_RECONCILE_S", "reconcile_bridge", "reconcile_every", "stale_agents"]

log = logging.getLogger(__name__)

BRIDGE_RECONCILE_S = 1.0  # how long a stale socket may outlive the bridge's restart: one ping


def stale_agents(open_agents: Iterable[str], live_rows: Iterable[SandboxRow]) -> list[str]:
    """The open agents' sockets that no live sandbox's record names."""
    wanted = {
        target[len(BRIDGE_RECORD) :]
        for row in live_rows
        for target in json.loads(row.mounts_json)
        if target.startswith(BRIDGE_RECORD)
    }
    return sorted(set(open_agents) - wanted)


def reconcile_bridge(cfg: ControllerConfig, store: SandboxStore) -> list[str]:
    """Close the bridge's stale sockets; the agents closed. StateError if the bridge or the
    database cannot be reached."""
    open_now = bridge_link.open_agents(cfg.run_dir)
    if not open_now:
        return []
    stale = stale_agents(open_now, store.find(live_only=True))  # read after the bridge's answer
    for agent in stale:
        bridge_link.close_agent(cfg.run_dir, agent)
        log.info("agent %s: its bridge socket had no live sandbox: closed", agent)
    return stale


def reconcile_every(
    cfg: ControllerConfig, store: SandboxStore
) -> Callable[[threading.Event], None]:
    """The body of the bridge's reconcile thread (for `supervisor.supervise`)."""

    def body(stop: threading.Event) -> None:
        down = False
        while not stop.wait(BRIDGE_RECONCILE_S):
            try:
                reconcile_bridge(cfg, store)
            except StateError as exc:
                if not down:  # said once per outage, not every second
                    log.warning("bridge reconcile: %s", exc)
                down = True
            else:
                down = False

    return body
