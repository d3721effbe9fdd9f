"""The store's operations on the database, per agent: append-only conversations, the lease
and its fencing token, the nonce ledger, the inbox. Every method takes the agent's name from
the verified proof, never from the call's body, and runs in one transaction: a refused or
interrupted call leaves nothing behind.

Appends are fenced: the writer names the last seq it saw (`expected_seq`, a compare-and-set:
stale means `Conflict`) and carries the token of a lease it holds; a token that is not the
current one, or a lease that has expired or been released, is `StaleToken`. Tokens only grow:
the lease row stays after release and every acquire adds one.

Security limitations: this trusts its caller (the bridge's server) to pass only verified agent
names; it does NOT limit how often an agent calls (the proof window and the sockets do not
either), only how much it stores.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, func, insert, select, update
from sqlalchemy import exc as sa_exc

from lnk_bridge_store.calls import Acquire, Append, Read, Release, Renew
from lnk_bridge_store.db import database_errors, write, write_synced_later
from lnk_bridge_store.limits import (
    MAX_INBOX_MESSAGE_BYTES,
    MAX_INBOX_PENDING,
    MAX_PAGE_BYTES,
    MAX_STORE_BYTES_PER_AGENT,
)
from lnk_bridge_store.models import (
    Conversation,
    Event,
    InboxMessage,
    Lease,
    Nonce,
    OpenAgent,
    Usage,
)
from lnk_shared.errors import LnkError

__all__ = ["Conflict", "LimitReached", "NotRunning", "StaleToken", "Store", "StoreRefused"]

Clock = Callable[[], float]


class StoreRefused(LnkError):
    """A call the store refuses for what it asks (the agent is who it says)."""

    code = "refused"


class Conflict(StoreRefused):
    code = "conflict"


class StaleToken(StoreRefused):
    code = "stale-token"


class LimitReached(StoreRefused):
    code = "limit"


class NotRunning(StoreRefused):
    """`inbox.send` to an agent whose socket is not open: stopped, or no such agent (the same
    answer for both, so a sender learns nothing about names it does not run)."""

    code = "not-running"


@dataclass
class Store:
    engine: Engine
    where: str  # the database, as named in errors (no password)
    clock: Clock = time.time

    # --- conversations ---

    def append(self, agent: str, call: Append) -> int:
        """Append the events after `call.expected_seq`; the new last seq."""
        size = sum(len(text.encode("utf-8")) for text in call.events)
        now_ms = int(self.clock() * 1000)
        with database_errors(self.where, "append to"), write(self.engine) as conn:
            self._check_token(conn, agent, call.token, now_ms)
            last = conn.scalar(
                select(Conversation.last_seq).where(
                    Conversation.agent == agent, Conversation.conversation == call.conversation
                )
            )
            current = 0 if last is None else last
            if call.expected_seq != current:
                raise Conflict(
                    f"conversation {call.conversation!r} is at seq {current}, not "
                    f"{call.expected_seq}: read from {call.expected_seq + 1} and append again"
                )
            stored = conn.scalar(select(Usage.bytes).where(Usage.agent == agent))
            used = stored or 0
            if used + size > MAX_STORE_BYTES_PER_AGENT:
                raise LimitReached(
                    f"the store of agent {agent!r} holds {used} bytes; {size} more would pass "
                    f"the limit of {MAX_STORE_BYTES_PER_AGENT}"
                )
            conn.execute(
                insert(Event),
                [
                    {
                        "agent": agent,
                        "conversation": call.conversation,
                        "seq": current + 1 + index,
                        "payload": text,
                        "appended_at": now_ms,
                    }
                    for index, text in enumerate(call.events)
                ],
            )
            new_last = current + len(call.events)
            if last is None:
                conn.execute(
                    insert(Conversation).values(
                        agent=agent, conversation=call.conversation, last_seq=new_last
                    )
                )
            else:
                conn.execute(
                    update(Conversation)
                    .where(
                        Conversation.agent == agent,
                        Conversation.conversation == call.conversation,
                    )
                    .values(last_seq=new_last)
                )
            if stored is None:
                conn.execute(insert(Usage).values(agent=agent, bytes=size))
            else:
                conn.execute(update(Usage).where(Usage.agent == agent).values(bytes=used + size))
        return new_last

    def read(self, agent: str, call: Read) -> dict[str, Any]:
        """Events from `call.from_seq` on, at most `call.limit` and `MAX_PAGE_BYTES`."""
        with database_errors(self.where, "read"), self.engine.connect() as conn:
            rows = conn.execute(
                select(Event.seq, Event.payload)
                .where(
                    Event.agent == agent,
                    Event.conversation == call.conversation,
                    Event.seq >= call.from_seq,
                )
                .order_by(Event.seq)
                .limit(call.limit)
            ).all()
            last = conn.scalar(
                select(Conversation.last_seq).where(
                    Conversation.agent == agent, Conversation.conversation == call.conversation
                )
            )
        events: list[dict[str, Any]] = []
        total = 0
        for seq, payload in rows:
            total += len(payload.encode("utf-8"))
            if events and total > MAX_PAGE_BYTES:
                break
            events.append({"seq": seq, "event": json.loads(payload)})
        return {"events": events, "last_seq": last or 0}

    # --- the lease ---

    def acquire(self, agent: str, call: Acquire) -> dict[str, Any]:
        now_ms = int(self.clock() * 1000)
        expires = now_ms + call.ttl_s * 1000
        with database_errors(self.where, "take the lease in"), write(self.engine) as conn:
            lease = conn.execute(select(Lease).where(Lease.agent == agent)).first()
            if lease is None:
                token = 1
                conn.execute(
                    insert(Lease).values(
                        agent=agent, token=token, holder=call.holder, expires_at=expires
                    )
                )
            else:
                if lease.holder is not None and lease.expires_at > now_ms:
                    raise Conflict(
                        f"the lease is held by {lease.holder!r} for "
                        f"{(lease.expires_at - now_ms) / 1000:.1f} s more"
                    )
                token = lease.token + 1
                conn.execute(
                    update(Lease)
                    .where(Lease.agent == agent)
                    .values(token=token, holder=call.holder, expires_at=expires)
                )
        return {"token": token, "expires_at": expires / 1000}

    def renew(self, agent: str, call: Renew) -> dict[str, Any]:
        now_ms = int(self.clock() * 1000)
        expires = now_ms + call.ttl_s * 1000
        with database_errors(self.where, "renew the lease in"), write(self.engine) as conn:
            self._check_token(conn, agent, call.token, now_ms)
            conn.execute(update(Lease).where(Lease.agent == agent).values(expires_at=expires))
        return {"token": call.token, "expires_at": expires / 1000}

    def release(self, agent: str, call: Release) -> dict[str, Any]:
        now_ms = int(self.clock() * 1000)
        with database_errors(self.where, "release the lease in"), write(self.engine) as conn:
            self._check_token(conn, agent, call.token, now_ms)
            conn.execute(
                update(Lease).where(Lease.agent == agent).values(holder=None, expires_at=now_ms)
            )
        return {"released": call.token}

    def _check_token(self, conn: Any, agent: str, token: int, now_ms: int) -> None:
        lease = conn.execute(select(Lease).where(Lease.agent == agent)).first()
        if lease is None or lease.token != token:
            current = None if lease is None else lease.token
            raise StaleToken(
                f"fencing token {token} is not the lease's current token ({current}): another "
                "writer acquired the lease; read the conversation again before writing"
            )
        if lease.holder is None or lease.expires_at <= now_ms:
            raise StaleToken(
                f"the lease of token {token} has expired or was released: acquire it again"
            )

    # --- nonces (`lnk_shared.proofs.NonceLedger`) ---

    def record(self, agent: str, nonce: bytes, expires: int) -> bool:
        """Insert (agent, nonce) with a UNIQUE key; False when it was there. Expired nonces go:
        a proof past its expiry is refused by the window before its nonce is looked at.

        Not fsynced on its own (`write_synced_later`): the call's own write, or the next one,
        makes it durable; only a power loss right after a call that wrote nothing (a read, a
        refusal) could forget its nonce, and the proof expires within a minute anyway."""
        now = int(self.clock())
        with database_errors(self.where, "record a nonce in"):
            try:
                with write_synced_later(self.engine) as conn:
                    conn.execute(delete(Nonce).where(Nonce.expires < now - 1))
                    conn.execute(insert(Nonce).values(agent=agent, nonce=nonce, expires=expires))
            except sa_exc.IntegrityError:
                return False
        return True

    # --- an agent removed ---

    def forget(self, agent: str) -> int:
        """Remove everything kept for `agent`: its conversations and their events, its usage,
        its lease (so a new agent of that name starts its fencing tokens again: nothing of the
        old one's runs any more), its nonces, its inbox, its open record. The rows removed."""
        removed = 0
        with database_errors(self.where, "forget an agent in"), write(self.engine) as conn:
            for table in (Event, Conversation, Usage, Lease, Nonce, InboxMessage, OpenAgent):
                removed += int(conn.execute(delete(table).where(table.agent == agent)).rowcount)
        return removed

    # --- the agents whose sockets are open ---

    def remember_open(self, agent: str, public_key: str, host_uid: int) -> None:
        with database_errors(self.where, "record an open agent in"), write(self.engine) as conn:
            conn.execute(delete(OpenAgent).where(OpenAgent.agent == agent))
            conn.execute(
                insert(OpenAgent).values(agent=agent, public_key=public_key, host_uid=host_uid)
            )

    def forget_open(self, agent: str) -> None:
        with database_errors(self.where, "forget an open agent in"), write(self.engine) as conn:
            conn.execute(delete(OpenAgent).where(OpenAgent.agent == agent))

    def opened(self) -> list[tuple[str, str, int]]:
        """(agent, public key, host uid) of every agent left open."""
        with database_errors(self.where, "read the open agents in"), self.engine.connect() as c:
            rows = c.execute(select(OpenAgent.agent, OpenAgent.public_key, OpenAgent.host_uid))
            return [(a, k, u) for a, k, u in rows.all()]

    # --- the inbox (the way in) ---

    def send(self, agent: str, sender: str, message: str) -> int:
        """Queue `message` from `sender` (a label: "owner", or a sending agent's name) in
        `agent`'s inbox; its id. A full inbox or an over-long message: `LimitReached`, nothing
        stored (the count and the insert are one transaction)."""
        size = len(message.encode("utf-8"))
        if size > MAX_INBOX_MESSAGE_BYTES:
            raise LimitReached(f"a message is at most {MAX_INBOX_MESSAGE_BYTES} bytes, not {size}")
        with database_errors(self.where, "queue a message in"), write(self.engine) as conn:
            pending = conn.scalar(
                select(func.count()).select_from(InboxMessage).where(InboxMessage.agent == agent)
            )
            if (pending or 0) >= MAX_INBOX_PENDING:
                raise LimitReached(
                    f"agent {agent!r} has {pending} messages not acknowledged; try again later"
                )
            result = conn.execute(
                insert(InboxMessage).values(
                    agent=agent, sender=sender, body=message, sent_at=int(self.clock())
                )
            )
            key = result.inserted_primary_key
            assert key is not None, "an insert returns its key"
            return int(key[0])

    def inbox_read(self, agent: str, after_id: int, limit: int) -> list[dict[str, Any]]:
        with database_errors(self.where, "read the inbox in"), self.engine.connect() as conn:
            rows = conn.execute(
                select(
                    InboxMessage.id, InboxMessage.sender, InboxMessage.body, InboxMessage.sent_at
                )
                .where(InboxMessage.agent == agent, InboxMessage.id > after_id)
                .order_by(InboxMessage.id)
                .limit(limit)
            ).all()
        return [{"id": i, "from": s, "message": b, "sent_at": t} for i, s, b, t in rows]

    def inbox_ack(self, agent: str, through_id: int) -> int:
        with database_errors(self.where, "acknowledge in"), write(self.engine) as conn:
            result = conn.execute(
                delete(InboxMessage).where(
                    InboxMessage.agent == agent, InboxMessage.id <= through_id
                )
            )
        return int(result.rowcount)
