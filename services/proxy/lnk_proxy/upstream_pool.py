"""Idle keep-alive connections to origins, for one sandbox: a plain http request reuses one
instead of dialing (a new TCP connection was a third of a small request's cost).

Keyed by (host as the request wrote it, port, the address dialed): a connection is only ever
taken for a request whose decision allowed exactly that address, so every request is still
judged on the address its bytes go to; the pool decides nothing. One pool per sandbox's
listener, never shared: a sandbox cannot reach (or time) another's connections, and closing
the listener or a stop closes its pool.

A connection is given back only after an exchange that ended on a message boundary with
nothing unread (`Forwarded.upstream_keeps`). Taking one checks it is still open and silent (an
origin that closed it, or sent bytes no one asked for, is dropped): with a `MSG_PEEK`, or, for
a request the caller may send again on a fresh connection (`retryable`), by the event loop's
last look at it (`Conn.seen_silent`: the peek's EAGAIN was an exception per request). An end
that arrived since that look makes the exchange fail before any answer, and the caller's
retry dials anew; bytes the origin sent unasked since then are read as its answer to this
request (the same origin, judged to the same address, which could have sent them as one).
It is kept at most `IDLE_S`, below the shortest keep-alive common servers grant (Apache's
5 s), so an origin rarely closes a connection as it is taken; the caller retries a request
without a body once on a fresh connection when a reused one fails before any answer.

Limits: `PER_KEY` idle connections per key and `PER_SANDBOX` in all; more are closed. This
module does NOT bound connections in use (the listener's limits do) nor pool tunnels (a
CONNECT always dials its own).
"""

from __future__ import annotations

import socket
import time

from lnk_proxy.conn import Conn
from lnk_shared.addresses import IPAddress

__all__ = ["IDLE_S", "PER_KEY", "PER_SANDBOX", "PoolKey", "UpstreamPool"]

IDLE_S = 4.0  # below Apache's default KeepAliveTimeout (5 s): the origin rarely closes first
PER_KEY = 64  # idle connections to one origin: a concurrency of 64 reuses, never redials
PER_SANDBOX = 128  # idle connections of one sandbox in all: descriptors it may hold idle

PoolKey = tuple[str, int, IPAddress]  # (host as written, lowercased; port; the address dialed)


def _still_usable(conn: Conn) -> bool:
    """Open and silent: no end of stream, no unsolicited bytes, no pending error."""
    try:
        conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return True  # nothing to read: the only usable state
    except OSError:
        return False
    return False  # b"": the origin closed it; bytes: no one asked for them


class UpstreamPool:
    """One sandbox's idle origin connections. Not thread-safe: the proxy's event loop only."""

    def __init__(
        self, idle_s: float = IDLE_S, per_key: int = PER_KEY, per_sandbox: int = PER_SANDBOX
    ) -> None:
        self.idle_s = idle_s
        self.per_key = per_key
        self.per_sandbox = per_sandbox
        self._idle: dict[PoolKey, list[tuple[float, Conn]]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def take(self, key: PoolKey, *, retryable: bool = False) -> Conn | None:
        """The most recently used idle connection for `key` that is still usable, or None.
        `retryable`: the caller sends the request again on a new connection when this one
        fails before answering, so the loop's last look may stand in for the peek."""
        entries = self._idle.get(key)
        if not entries:
            return None
        oldest = time.monotonic() - self.idle_s
        while entries:
            since, conn = entries.pop()
            self._count -= 1
            if since > oldest and ((retryable and conn.seen_silent) or _still_usable(conn)):
                return conn
            conn.close()
        del self._idle[key]
        return None

    def give(self, key: PoolKey, conn: Conn) -> None:
        """Keep `conn` (idle, at a message boundary) for `key`, or close it when full."""
        entries = self._idle.setdefault(key, [])
        if conn.buffer or len(entries) >= self.per_key or self._count >= self.per_sandbox:
            conn.close()
            return
        conn.timeout = None
        entries.append((time.monotonic(), conn))
        self._count += 1

    def sweep(self) -> None:
        """Close connections idle past `idle_s` (called now and then by the listener)."""
        oldest = time.monotonic() - self.idle_s
        for key in list(self._idle):
            entries = self._idle[key]
            kept = [(since, conn) for since, conn in entries if since > oldest]
            for since, conn in entries:
                if since <= oldest:
                    conn.close()
            self._count -= len(entries) - len(kept)
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]

    def close(self) -> None:
        """Close every idle connection (the sandbox stopped or its listener closed)."""
        for entries in self._idle.values():
            for _, conn in entries:
                conn.close()
        self._idle.clear()
        self._count = 0
