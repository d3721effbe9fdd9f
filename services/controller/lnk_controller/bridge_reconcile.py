"""Agents' bridge sockets follow their records: a socket the store bridge holds open for an
agent that no live sandbox has (stopped or removed while the bridge was down, which opens
again at its start every socket it had open) is closed.

Whenever the bridge has started (its admin socket made again: `bridge_watch`, an inotify watch;
every BRIDGE_RECONCILE_S while the bridge does not answer or no watch can be had), the bridge
is asked which sockets it holds open; the live records
are read after that answer, so a socket a launch is opening right now is never taken for a
stale one (a launch records `bridge:<agent>` before it asks the bridge to open it); each open
socket no live record names is closed (`stale_agents`, a pure function).

Does NOT: close a stale socket sooner than the bridge's first answer after it is back (in
that window the socket exists, but its uid has no sandbox, or a new sandbox's that cannot sign
as the agent: the bridge checks every call's proof against the agent's key); reach a bridge
that does not answer (tried again at the next round).
"""

from __future__ import annotations

import json
import logging
import select
import threading
from collections.abc import Callable, Iterable

from lnk_controller import bridge_link
from lnk_controller.bridge_watch import BridgeWatch
from lnk_controller.cleanup import BRIDGE_RECORD
from lnk_controller.config import ControllerConfig
from lnk_controller.models import SandboxRow
from lnk_controller.sandbox_store import SandboxStore
from lnk_shared.errors import StateError
from lnk_shared.waking_event import WakingEvent

__all__ = ["BRIDGE_RECONCILE_S", "reconcile_bridge", "reconcile_every", "stale_agents"]

log = logging.getLogger(__name__)

BRIDGE_RECONCILE_S = 1.0  # while the bridge does not answer (or no watch), asked again this often


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
    """The body of the bridge's reconcile thread (for `supervisor.supervise`): once at its
    start, then each time the bridge's admin socket is made again (`bridge_watch`), asking
    again every BRIDGE_RECONCILE_S only while the bridge does not answer or the watch is off.
    A `stop` with a `fileno` (`WakingEvent`) ends the wait at once; another is looked at every
    BRIDGE_RECONCILE_S."""

    def body(stop: threading.Event) -> None:
        admin = bridge_link.bridge_admin_socket(cfg.run_dir)
        watch = BridgeWatch(admin.parent, admin.name)
        stop_fd = stop.fileno() if isinstance(stop, WakingEvent) else None
        due, down = True, False  # at start: a bridge started before the watch
        try:
            while not stop.is_set():
                if not watch.armed and watch.arm():
                    due = True  # what happened before the watch was not seen
                if due:
                    try:
                        reconcile_bridge(cfg, store)
                    except StateError as exc:
                        if not down:  # said once per outage, not every second
                            log.warning("bridge reconcile: %s", exc)
                        down = True
                    else:
                        down = due = False
                resting = watch.armed and not due and stop_fd is not None
                waited = [fd for fd in (watch.fileno(), stop_fd) if fd is not None and fd >= 0]
                ready = select.select(waited, [], [], None if resting else BRIDGE_RECONCILE_S)[0]
                if watch.fileno() in ready and watch.changed():
                    due = True
                if not watch.armed:
                    due = True  # no watch: asked every round, as before there was one
        finally:
            watch.close()

    return body
