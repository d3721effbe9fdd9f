"""The store bridge's admin socket: how the controller opens and closes agents' sockets and
delivers messages to an agent's inbox.

A unix socket at `config.admin_socket`, mode 0600 in the bridge's own folder (mode 0700).
Each connection is checked with SO_PEERCRED: any uid but `config.controller_uid` is closed
with no answer. Then JSON frames (`lnk_shared.unix`), one reply per command (the socket, the
check and the frame loop: `lnk_shared.admin_socket`; the commands, here):

    {"op": "open", "agent": NAME, "public_key": B64(32 bytes), "host_uid": UID}
    {"op": "close", "agent": NAME}
    {"op": "forget", "agent": NAME}      (close it, and remove everything the store keeps for it)
    {"op": "send", "agent": NAME, "sender": LABEL, "message": TEXT}
    {"op": "ping"}

and `{"ok": true, ...}` (open adds `"socket": PATH`; forget adds `"removed": ROWS`; ping adds
`"driver"`, the store's database driver, e.g. "sqlite", which an agent's `[store] driver` must
name, and `"open"`, the agents whose sockets are open, which the controller closes when no live
sandbox has them) or `{"ok": false, "error": "..."}`. Every
field is checked as hostile (`parse_command`, pure); a public key goes through
`lnk_shared.proofs.enroll_public_key`, so a small-order or non-canonical key is never used.

Security limitations: the peer's uid is the only credential (as of its connect); this does NOT
check which process holds it.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
from dataclasses import dataclass
from typing import Any

from lnk_bridge_store.limits import HOLDER
from lnk_bridge_store.server import BridgeServer
from lnk_bridge_store.store import StoreRefused
from lnk_shared.admin_socket import serve_admin_threads
from lnk_shared.errors import LnkError
from lnk_shared.proofs import AGENT_ID, AgentKey, AgentKeyRefused, enroll_public_key
from lnk_shared.unix import checked_op
from lnk_shared.waking_event import WakingEvent

__all__ = [
    "CloseAgent",
    "ForgetAgent",
    "OpenAgent",
    "Ping",
    "SendMessage",
    "parse_command",
    "serve_admin",
]

log = logging.getLogger(__name__)

MIN_AGENT_UID = 1  # never root: an agent runs as a fresh unprivileged host user
MAX_UID = 2**32 - 2
_KEYS = {
    "open": frozenset({"op", "agent", "public_key", "host_uid"}),
    "close": frozenset({"op", "agent"}),
    "forget": frozenset({"op", "agent"}),
    "send": frozenset({"op", "agent", "sender", "message"}),
    "ping": frozenset({"op"}),
}


@dataclass(frozen=True)
class OpenAgent:
    key: AgentKey
    public_key: str  # as sent (checked), kept to open the socket again after a restart


@dataclass(frozen=True)
class CloseAgent:
    agent: str


@dataclass(frozen=True)
class ForgetAgent:
    agent: str


@dataclass(frozen=True)
class SendMessage:
    agent: str
    sender: str
    message: str


@dataclass(frozen=True)
class Ping:
    pass


Command = OpenAgent | CloseAgent | ForgetAgent | SendMessage | Ping


def parse_command(untrusted: dict[str, Any], own_uid: int) -> Command:
    """A checked command from an untrusted frame; ValueError saying what is wrong."""
    op = checked_op(untrusted, _KEYS)
    if op == "ping":
        return Ping()
    agent = untrusted["agent"]
    if not isinstance(agent, str) or not AGENT_ID.fullmatch(agent):
        raise ValueError(f"agent must match {AGENT_ID.pattern}")
    if op == "close":
        return CloseAgent(agent)
    if op == "forget":
        return ForgetAgent(agent)
    if op == "send":
        sender, message = untrusted["sender"], untrusted["message"]
        if not isinstance(sender, str) or not HOLDER.fullmatch(sender):
            raise ValueError(f"sender must match {HOLDER.pattern}")
        if not isinstance(message, str):
            raise ValueError("message must be text")
        return SendMessage(agent, sender, message)
    uid = untrusted["host_uid"]
    if type(uid) is not int or not MIN_AGENT_UID <= uid <= MAX_UID or uid == own_uid:
        raise ValueError("host_uid must be an unprivileged uid that is not the bridge's own")
    raw = untrusted["public_key"]
    try:
        decoded = base64.b64decode(raw, validate=True) if isinstance(raw, str) else b""
        public_key = enroll_public_key(decoded)
    except (binascii.Error, ValueError, AgentKeyRefused) as exc:
        raise ValueError(f"public_key: {exc}") from None
    return OpenAgent(AgentKey(agent, public_key, uid), raw)


def run_command(server: BridgeServer, command: Command) -> dict[str, Any]:
    try:
        if isinstance(command, OpenAgent):
            return {"ok": True, "socket": str(server.remember(command.key, command.public_key))}
        if isinstance(command, CloseAgent):
            server.close_agent(command.agent)
        elif isinstance(command, ForgetAgent):
            server.close_agent(command.agent)
            return {"ok": True, "removed": server.store.forget(command.agent)}
        elif isinstance(command, SendMessage):
            sent = server.store.send(command.agent, command.sender, command.message)
            return {"ok": True, "id": sent}
        elif isinstance(command, Ping):
            driver = server.store.engine.url.get_backend_name()
            return {"ok": True, "driver": driver, "open": server.open_agents()}
    except StoreRefused as exc:
        return {"ok": False, "error": str(exc)}
    except (OSError, LnkError) as exc:
        log.error("admin: %s", exc)
        return {"ok": False, "error": str(exc)}
    return {"ok": True}


def serve_admin(server: BridgeServer, stop: WakingEvent) -> None:
    """Serve the admin socket until `stop` is set; each connection on a thread of its own."""

    def handle(untrusted: dict[str, Any], _fds: list[int]) -> tuple[dict[str, Any], list[int]]:
        # no command takes a descriptor, and none is read: the kernel drops any sent
        return run_command(server, parse_command(untrusted, os.geteuid())), []

    config = server.config
    serve_admin_threads(config.admin_socket, config.controller_uid, handle, stop)
