"""Closing a sandbox's handed sockets (`handoff`) off the proxy's event loop, one sandbox's at
a time.

Why: the last close of a TCP socket with SO_LINGER set waits, up to its seconds (without a
bound), for the bytes it still has to send to be acknowledged, whatever the file's O_NONBLOCK.
The other holder of a handed socket can set SO_LINGER, stop reading at the client's end and
close its own copy, so that the proxy's close is the last. `HandedSocket.close` turns
lingering off first; that leaves a race of two system calls (the other holder sets it again
and closes between them), and whoever wins it would stall the proxy's one event loop, every
sandbox with it. So a handed socket is closed here, in its sandbox's thread, while the
connection's task waits for it.

Bounded, and charged to the sandbox: one thread per sandbox, only while it has closes to do
(it ends `IDLE_S` after its last); the task whose socket is closing stays in its listener's
`connections` until the socket is closed, so a close that lingers holds one of that sandbox's
connections and descriptors (`max_connections_per_sandbox`, `descriptors`) and nobody else's.
Closing the listener (`abandon`) stops the waiting: its tasks end, the thread still closes.

Does NOT: bound how long one close lingers (the sandbox's later closes wait behind it, its
connections stay counted, and past its cap it gets `too-many-connections`); close other
sockets (only a handed one can have another holder).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable

from lnk_proxy.conn import Conn
from lnk_shared.handed_socket import HandedSocket

__all__ = ["IDLE_S", "HandedCloser", "close_conn"]

IDLE_S = 5.0  # a closing thread waits this long for its sandbox's next close, then ends


class HandedCloser:
    """One sandbox's closes of handed sockets, in order, in a thread of its own."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.threads_started = 0  # (tests)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: deque[tuple[HandedSocket, Callable[[], None]]] = deque()
        self._waiting: set[asyncio.Future[None]] = set()
        self._running = False
        self._abandoned = False

    async def close(self, sock: HandedSocket) -> None:
        """Close `sock` in this sandbox's thread; return once it is closed (or abandoned)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def finished() -> None:  # in the closing thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: no one waits
                loop.call_soon_threadsafe(_settle, done)

        with self._lock:
            self._queue.append((sock, finished))
            if self._running:
                self._wake.notify()
            else:
                self._running = True
                self.threads_started += 1
                thread = threading.Thread(
                    target=self._run, name=f"lnk-close-{self.name}"[:15], daemon=True
                )
                thread.start()
            if self._abandoned:
                return
        self._waiting.add(done)
        try:
            await done  # cancelled: stop waiting; the thread still closes it
        finally:
            self._waiting.discard(done)

    def abandon(self) -> None:
        """The listener is closing: stop every wait now (the sockets are still closed)."""
        with self._lock:
            self._abandoned = True
        for done in list(self._waiting):
            _settle(done)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._wake.wait(IDLE_S)
                if not self._queue:
                    self._running = False
                    return
                sock, finished = self._queue.popleft()
            with contextlib.suppress(OSError):
                sock.close()
            finished()


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


async def close_conn(client: Conn, closer: HandedCloser) -> None:
    """Close the sandbox's side of a connection: a handed socket in `closer`'s thread (taken
    out of the loop's selector first), any other at once."""
    if not isinstance(client.sock, HandedSocket):
        client.close()
        return
    client.detach()
    await closer.close(client.sock)
