"""The agents' sockets: one per agent, each call verified (`lnk_shared.proofs`) then served.

Each agent's socket is `<bridge dir>/agents/<agent>/bridge.sock`, mode 0666 in a folder of its
own (0711) inside `agents/` (0700), which only the bridge's user (and root) can enter: on the host
no one else reaches it; the controller binds the agent's folder into that agent's sandbox, so a
socket made again after a bridge restart is there too. Open agents are kept in the store and
opened again when the bridge starts. A connection is accepted on one agent's socket
and `SO_PEERCRED` is read once; each frame on it is a signed call (`lnk_shared.proofs`), checked
for that socket's agent and that peer uid, then parsed (`calls`) and served (`store`).

Outward: a proof that fails, or a frame that cannot be read (too big, not UTF-8, not JSON,
duplicate keys, too deep), gets `{"ok": false, "error": REFUSAL}` and the connection is
closed; the reason is logged. A verified call the store refuses gets the store's message and a
`code` (`invalid`, `conflict`, `stale-token`, `limit`, `not-running`, `refused`).

`inbox.send` (agent to agent): the recipient is `u{sender's owner uid}-{to}`, built from the
sender's verified id (`calls.recipient_of`), so an agent reaches only agents of its own owner.
The recipient must have its socket open here now (running); a stopped agent and a name that
does not exist get the same `not-running` answer. The message's `from` is the sender's name.
An agent may send to itself (its own inbox, counted against its own limit: a note for later).
An agent named "owner" cannot send: its messages would read as the owner's.

Security limitations: this does NOT limit the rate of calls of an agent (only concurrent
connections per agent, `MAX_CONNECTIONS_PER_AGENT`), so one agent can fill a sibling's
inbox up to `MAX_INBOX_PENDING` (refused beyond, never half-stored); and it trusts the
controller's word (admin socket) for each agent's key and host uid.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lnk_bridge_store.calls import (
    AUDIENCE_OF,
    Acquire,
    Append,
    CallRefused,
    InboxAck,
    InboxRead,
    InboxSend,
    Read,
    Release,
    Renew,
    Request,
    parse_request,
    recipient_of,
    sender_name,
)
from lnk_bridge_store.config import StoreConfig
from lnk_bridge_store.limits import OWNER_SENDER
from lnk_bridge_store.store import NotRunning, Store, StoreRefused
from lnk_shared.errors import LnkError, StateError
from lnk_shared.proofs import (
    REFUSAL,
    AgentKey,
    CallContext,
    ProofPolicy,
    ProofRefused,
    VerifiedCall,
    enroll_public_key,
    verify_call,
)
from lnk_shared.unix import bind_socket, peer_cred, recv_frame, send_frame

__all__ = ["AGENT_SOCKET_MODE", "BridgeServer"]

log = logging.getLogger(__name__)

AGENT_SOCKET_MODE = 0o666  # the sandbox's uid is not the bridge's; the 0700 folder is the guard
AGENTS_DIR_MODE = 0o700  # on the host, the guard: only the bridge's user and root enter it
AGENT_DIR_MODE = 0o711  # an agent's own folder: reached only through the bind into its sandbox
SOCKET_NAME = "bridge.sock"
MAX_CONNECTIONS_PER_AGENT = 16  # a harness and its tools; more is a flood of threads
IDLE_TIMEOUT_S = 120.0  # a connection with no frame for this long is closed


@dataclass
class _Agent:
    key: AgentKey
    path: Path
    listening: socket.socket
    connections: set[socket.socket] = field(default_factory=set)


class BridgeServer:
    """The store bridge: agents' sockets, their calls, the store."""

    def __init__(self, config: StoreConfig, store: Store) -> None:
        self.config = config
        self.store = store
        self.policies = {
            audience: ProofPolicy(audience, config.max_skew_s, config.max_lifetime_s)
            for audience in ("store", "inbox")
        }
        self._agents: dict[str, _Agent] = {}
        self._lock = threading.Lock()

    @property
    def agents_dir(self) -> Path:
        return self.config.bridge_dir / "agents"

    def socket_path(self, agent: str) -> Path:
        return self.agents_dir / agent / SOCKET_NAME

    # --- the controller's commands ---

    def open_agent(self, key: AgentKey) -> Path:
        """Bind (or rebind) the agent's socket for `key`; its path."""
        self._close(key.agent)
        self.agents_dir.mkdir(mode=AGENTS_DIR_MODE, parents=True, exist_ok=True)
        self.agents_dir.chmod(AGENTS_DIR_MODE)
        path = self.socket_path(key.agent)
        listening = bind_socket(path, mode=AGENT_SOCKET_MODE, dir_mode=AGENT_DIR_MODE)
        entry = _Agent(key, path, listening)
        with self._lock:
            self._agents[key.agent] = entry
        threading.Thread(
            target=self._accept, args=(entry,), name=f"agent-{key.agent}", daemon=True
        ).start()
        log.info("agent %s: socket %s open for uid %s", key.agent, path, key.host_uid)
        return path

    def remember(self, key: AgentKey, public_key: str) -> Path:
        """Open the agent's socket and keep it open across restarts (the controller's open)."""
        assert key.host_uid is not None, "an open agent has a host uid"
        path = self.open_agent(key)
        self.store.remember_open(key.agent, public_key, key.host_uid)
        return path

    def close_agent(self, agent: str) -> None:
        """Close the agent's socket for good (the controller's close); nothing when none."""
        self.store.forget_open(agent)
        self._close(agent)
        with contextlib.suppress(OSError):
            self.socket_path(agent).parent.rmdir()

    def open_agents(self) -> list[str]:
        """The agents whose sockets are open now (the controller reconciles them)."""
        with self._lock:
            return sorted(self._agents)

    def reopen_all(self) -> None:
        """At start: open again every agent the controller left open."""
        for agent, public_key, host_uid in self.store.opened():
            try:
                raw = base64.b64decode(public_key, validate=True)
                self.open_agent(AgentKey(agent, enroll_public_key(raw), host_uid))
            except (ValueError, LnkError, OSError) as exc:
                log.error("agent %s: not opened again (%s); forgotten", agent, exc)
                self.store.forget_open(agent)

    def close_all(self) -> None:
        """At stop: close every socket, leaving them open in the store for the next start."""
        for agent in list(self._agents):
            self._close(agent)

    def _close(self, agent: str) -> None:
        with self._lock:
            entry = self._agents.pop(agent, None)
        if entry is None:
            return
        with contextlib.suppress(OSError):  # wakes its accept thread (EINVAL): no poll at rest
            entry.listening.shutdown(socket.SHUT_RDWR)
        entry.listening.close()
        with contextlib.suppress(FileNotFoundError):
            entry.path.unlink()
        for conn in list(entry.connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        log.info("agent %s: socket closed", agent)

    def key_for(self, agent: str) -> AgentKey | None:
        with self._lock:
            entry = self._agents.get(agent)
        return None if entry is None else entry.key

    # --- agents' connections ---

    def _accept(self, entry: _Agent) -> None:
        while True:
            try:
                conn, _ = entry.listening.accept()
            except OSError:
                return  # shut down and closed by close_agent
            with self._lock:
                full = len(entry.connections) >= MAX_CONNECTIONS_PER_AGENT
                if not full:
                    entry.connections.add(conn)
            if full:
                log.warning(
                    "agent %s: over %d connections", entry.key.agent, len(entry.connections)
                )
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(entry, conn), daemon=True).start()

    def _serve(self, entry: _Agent, conn: socket.socket) -> None:
        agent = entry.key.agent
        try:
            uid = peer_cred(conn).uid
            conn.settimeout(IDLE_TIMEOUT_S)
            while True:
                try:
                    untrusted, _ = recv_frame(conn)
                except EOFError:
                    return
                except (ValueError, RecursionError) as exc:
                    log.warning("agent %s: refused an unreadable frame: %s", agent, exc)
                    send_frame(conn, {"ok": False, "error": REFUSAL})
                    return
                reply = self.handle(untrusted, CallContext(agent, uid, time.time()))
                send_frame(conn, reply)
                if reply.get("error") == REFUSAL:
                    return
        except OSError as exc:
            log.info("agent %s: connection ended: %s", agent, exc)
        finally:
            with self._lock:
                entry.connections.discard(conn)
            conn.close()

    def handle(self, untrusted: dict[str, Any], context: CallContext) -> dict[str, Any]:
        """One call: verified, parsed, served; the reply frame."""
        try:
            call = self.verify(untrusted, context)
        except ProofRefused as exc:
            log.warning("agent %s: refused: %s", context.socket_agent, exc.reason)
            return {"ok": False, "error": REFUSAL}
        try:
            if AUDIENCE_OF.get(call.action) != untrusted.get("audience"):
                raise CallRefused(f"action {call.action!r} belongs to another bridge")
            result = self.serve(call.agent, parse_request(call.action, call.body))
        except CallRefused as exc:
            return {"ok": False, "error": str(exc), "code": "invalid"}
        except StoreRefused as exc:
            return {"ok": False, "error": str(exc), "code": exc.code}
        except StateError as exc:
            log.error("agent %s: %s", call.agent, exc)
            return {"ok": False, "error": "the store is unavailable; try again", "code": "state"}
        return {"ok": True, "result": result}

    def verify(self, untrusted: dict[str, Any], context: CallContext) -> VerifiedCall:
        """The proof's whole check (`lnk_shared.proofs.verify_call`), with this bridge's
        policy for the audience the call names (itself signed)."""
        policy = self.policies.get(str(untrusted.get("audience")), self.policies["store"])
        return verify_call(
            untrusted, policy=policy, context=context, key_for=self.key_for, nonces=self.store
        )

    def serve(self, agent: str, request: Request) -> Any:
        if isinstance(request, Append):
            return {"last_seq": self.store.append(agent, request)}
        if isinstance(request, Read):
            return self.store.read(agent, request)
        if isinstance(request, Acquire):
            return self.store.acquire(agent, request)
        if isinstance(request, Renew):
            return self.store.renew(agent, request)
        if isinstance(request, Release):
            return self.store.release(agent, request)
        if isinstance(request, InboxRead):
            return {"messages": self.store.inbox_read(agent, request.after_id, request.limit)}
        if isinstance(request, InboxAck):
            return {"acknowledged": self.store.inbox_ack(agent, request.through_id)}
        if isinstance(request, InboxSend):
            return self.send_from(agent, request)
        raise CallRefused(f"no handler for {type(request).__name__}")

    def send_from(self, agent: str, request: InboxSend) -> dict[str, Any]:
        """Agent `agent` (verified) sends to its sibling `request.to`; what the sender is told
        (not the message's id: ids count every agent's messages, of every owner)."""
        sender = sender_name(agent)
        if sender == OWNER_SENDER:
            raise CallRefused(
                f"an agent named {OWNER_SENDER!r} cannot send: its messages would read as "
                "the owner's; give the agent another name"
            )
        recipient = recipient_of(agent, request.to)
        if self.key_for(recipient) is None:
            raise NotRunning(
                f"agent {request.to!r} is not running (or does not exist): its owner starts it "
                "with `lnk agent start`"
            )
        self.store.send(recipient, sender, request.message)
        return {"sent": True, "to": request.to}
