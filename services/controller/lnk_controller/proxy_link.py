"""The controller's side of the proxy's admin socket: open and close a sandbox's listener, and
the stop and pause flags the proxy reads on every request.

The proxy (its own system user) binds each listener; the controller binds that socket into the
sandbox, where the relay serves it on 127.0.0.1. Flags are marker files the controller writes in
a root-owned folder and the proxy only reads, uncached, on every request and tunnel.

A restart loses no sandbox: the proxy's answer to `open` carries the listening socket, which
the controller keeps (`HELD`) until the listener is closed. `keep_listeners` asks the proxy
every `KEEP_INTERVAL_S` which listeners it serves and hands each one it lacks back (`adopt`,
with the socket and the grants it was opened with): after `kill -9` and a restart the kept
socket was never closed, so a sandbox's connections wait in its backlog and are judged and
answered once the new proxy adopts it. While the proxy does not answer, the controller
answers for it on the kept sockets (`proxy_standin`: each connection gets an HTTP 503 saying
the proxy is down and that `lnk box up` starts it), so a sandbox's client learns at once.
Does NOT keep listeners across a controller restart (none is needed: a restarted controller's
reconcile ends every sandbox the killed one ran, `cleanup.reconcile`, and closes its listener).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
from pathlib import Path
from typing import Any

from lnk_controller.config import ControllerConfig
from lnk_controller.proxy_standin import StandIn
from lnk_shared.admin_socket import call_admin
from lnk_shared.errors import LaunchRefused, StateError
from lnk_shared.grants import Grants

__all__ = [
    "HELD",
    "PROXY_PORT",
    "PROXY_SOCKET_INSIDE",
    "clear_flags",
    "close_listener",
    "keep_listeners",
    "open_listener",
    "relay_port",
    "set_flag",
]

PROXY_SOCKET_INSIDE = "/run/lnk-proxy.sock"  # where the listener is bound inside the sandbox
PROXY_PORT = 3128  # the relay's port on the sandbox's own loopback (squid's, by habit)
ADMIN_TIMEOUT_S = 5.0  # the proxy answers at once; longer means it is stuck
SECRET_BYTES = 32  # the per-sandbox proxy secret (for the page-opening endpoint, later)
# How soon a restarted proxy gets the listeners back: a sandbox's requests wait this long at
# most (plus the restart) in their listener's backlog. A `list` costs the proxy microseconds.
KEEP_INTERVAL_S = 1.0

log = logging.getLogger(__name__)


class HeldListeners:
    """The listening sockets the proxy opened, kept with the command that opened each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, dict[str, Any]]] = {}
        # Held while a listener is handed back, and while one is closed: a listener closed
        # meanwhile is never handed to the proxy after its close.
        self.handing = threading.Lock()

    def keep(self, sandbox_id: str, fd: int, command: dict[str, Any]) -> None:
        with self._lock:
            old = self._held.pop(sandbox_id, None)
            self._held[sandbox_id] = (fd, command)
        if old is not None:
            os.close(old[0])

    def update(self, sandbox_id: str, command: dict[str, Any]) -> None:
        """The command a listener is handed back with, changed (its secrets); none if closed."""
        with self._lock:
            kept = self._held.get(sandbox_id)
            if kept is not None:
                self._held[sandbox_id] = (kept[0], command)

    def drop(self, sandbox_id: str) -> None:
        with self._lock:
            old = self._held.pop(sandbox_id, None)
        if old is not None:
            os.close(old[0])

    def snapshot(self) -> dict[str, tuple[int, dict[str, Any]]]:
        with self._lock:
            return dict(self._held)


HELD = HeldListeners()


def _call(
    cfg: ControllerConfig, message: dict[str, Any], fds: list[int] | None = None
) -> dict[str, Any]:
    """The proxy's answer; a descriptor it sent (`open`'s listener) is kept in HELD."""
    answer, received = _call_with_fds(cfg, message, fds)
    for fd in received:
        os.close(fd)
    return answer


def _call_with_fds(
    cfg: ControllerConfig, message: dict[str, Any], fds: list[int] | None = None
) -> tuple[dict[str, Any], list[int]]:
    # A service of the box that does not answer is the box's state (exit 1), as the store
    # bridge's is (bridge_link): not a rule's refusal.
    return call_admin(
        cfg.proxy_admin_socket, message, fds, service="filtering proxy", timeout=ADMIN_TIMEOUT_S
    )


def open_listener(
    cfg: ControllerConfig,
    sandbox_id: str,
    grants: Grants,
    services: dict[str, Any] | None = None,
) -> Path:
    """Ask the proxy for this sandbox's listener; return the socket's path on the host.
    `services`: its rules and their secrets' values (`secret_grants.service_fields`)."""
    spec = grants.spec
    path = cfg.proxy_dir / f"{sandbox_id}.sock"
    command = {
        "op": "open",
        "sandbox": sandbox_id,
        "socket": str(path),
        "grants": {
            "internet_any": spec.internet_any,
            "internet": [str(h) for h in spec.internet],
            "lan_any": spec.lan_any,
            "lan": [str(e) for e in spec.lan],
            "localhost_ports": list(spec.ports),
        },
        "secret": secrets.token_hex(SECRET_BYTES),
        **(services or {}),
    }
    answer, fds = _call_with_fds(cfg, command)
    if answer.get("ok") is not True or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        error = answer.get("error") or "it sent no listening socket back"
        raise LaunchRefused("the filtering proxy", f"it refused the listener: {error}")
    HELD.keep(sandbox_id, fds[0], {**command, "op": "adopt"})
    return path


def keep_listeners(cfg: ControllerConfig, stop: threading.Event) -> None:
    """Until `stop`: hand every kept listener the proxy does not serve back to it; while the
    proxy does not answer, answer the kept listeners' connections with a 503 (`StandIn`)."""
    stand_in, down = StandIn(), False
    while not (stop.is_set() if down else stop.wait(KEEP_INTERVAL_S)):  # serving is the wait
        held = HELD.snapshot()
        down = False
        if not held:
            continue
        try:
            answer = _call(cfg, {"op": "list"})
        except (LaunchRefused, StateError):  # down: `lnk box up` restarts it
            down = True
            with HELD.handing:  # no listener is closed meanwhile
                fds = [fd for fd, _ in HELD.snapshot().values()]
                stand_in.serve(fds, KEEP_INTERVAL_S, lambda: _answers(cfg))
            continue
        stand_in.finish()
        served = answer.get("sandboxes")
        if not isinstance(served, list):
            continue
        for sandbox_id in held:
            if sandbox_id not in served:
                _hand_back(cfg, sandbox_id)


def _answers(cfg: ControllerConfig) -> bool:
    """Whether the proxy answers on its admin socket now (a refused connect costs microseconds)."""
    try:
        _call(cfg, {"op": "ping"})
    except (LaunchRefused, StateError):
        return False
    return True


def _hand_back(cfg: ControllerConfig, sandbox_id: str) -> None:
    with HELD.handing:
        kept = HELD.snapshot().get(sandbox_id)
        if kept is None:
            return  # closed meanwhile
        fd, command = kept
        try:
            reply = _call(cfg, command, [fd])
        except StateError as exc:
            log.error("handing the listener of %s back to the proxy: %s", sandbox_id, exc)
            return
    if reply.get("ok") is True:
        log.info("the restarted proxy serves %s again", sandbox_id)
    else:
        log.error("the proxy refused the listener of %s: %s", sandbox_id, reply)


def held_services(sandbox_id: str) -> list[dict[str, Any]]:
    """The service rules the sandbox's listener was opened with ([] if none or not held)."""
    kept = HELD.snapshot().get(sandbox_id)
    return list(kept[1].get("services", [])) if kept is not None else []


def held_secret_names(sandbox_id: str) -> set[str]:
    """The secrets the sandbox's service and model rules name (empty if none or not held)."""
    kept = HELD.snapshot().get(sandbox_id)
    if kept is None:
        return set()
    rules = [*kept[1].get("services", []), *kept[1].get("models", [])]
    return {r["secret"] for r in rules if r.get("secret")}


def send_secrets(cfg: ControllerConfig, sandbox_id: str, values: dict[str, str]) -> None:
    """The sandbox's service secrets now (one left out: refused from its next request). Kept
    first with the listener, so a proxy restarted meanwhile adopts it with these."""
    with HELD.handing:
        kept = HELD.snapshot().get(sandbox_id)
        if kept is None:
            return  # closed meanwhile
        HELD.update(sandbox_id, {**kept[1], "service_secrets": values})
    answer = _call(cfg, {"op": "secrets", "sandbox": sandbox_id, "service_secrets": values})
    if answer.get("ok") is not True:
        raise StateError(
            f"the proxy did not take the new secrets of {sandbox_id}: {answer.get('error')}"
        )


def close_listener(cfg: ControllerConfig, sandbox_id: str) -> None:
    """Close the listener and every tunnel of the sandbox; remove its socket even if the proxy
    is gone."""
    problem = None
    with HELD.handing:  # not while it is being handed back: never adopted after its close
        HELD.drop(sandbox_id)
    try:
        answer = _call(cfg, {"op": "close", "sandbox": sandbox_id})
        if answer.get("ok") is not True:
            problem = str(answer.get("error"))
    except (LaunchRefused, StateError) as exc:
        problem = str(exc)
    with contextlib.suppress(FileNotFoundError):
        (cfg.proxy_dir / f"{sandbox_id}.sock").unlink()
    if problem and "does not answer" not in problem:
        raise StateError(f"the proxy did not close the listener of {sandbox_id}: {problem}")


def set_flag(cfg: ControllerConfig, sandbox_id: str, flag: str, on: bool) -> None:
    """`stop` or `pause`: a marker file the proxy checks on every request."""
    if flag not in ("stop", "pause"):
        raise ValueError(f"unknown flag {flag!r}")
    path = cfg.flags_dir / f"{sandbox_id}.{flag}"
    if on:
        cfg.flags_dir.mkdir(mode=0o755, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        os.close(fd)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def clear_flags(cfg: ControllerConfig, sandbox_id: str) -> None:
    for flag in ("stop", "pause"):
        set_flag(cfg, sandbox_id, flag, False)


def relay_port(localhost_ports: tuple[int, ...]) -> int:
    """The relay's port: PROXY_PORT unless a `[localhost]` (or a model rule's) port takes it,
    then the next free."""
    port = PROXY_PORT
    while port in localhost_ports:
        port += 1
    return port
