"""A handed tunnel (`handoff`) spliced in a thread of its own, so a splice that blocks holds
only that thread, never the proxy's event loop.

Why: a handed socket may have another holder, which can clear O_NONBLOCK on the file they
share, and a TCP socket's `splice` follows that flag, not `SPLICE_F_NONBLOCK`
(`lnk_shared.handed_socket`), so the loop never splices one (`Conn.splice_to` copies through a
buffer instead, 0.72 CPU-s a GiB in the proxy against 0.40 spliced: bench/README.md, session
13). Here one thread moves both directions, socket -> pipe -> socket each: every splice is
tried first and `poll` waits only when neither direction can move (in bulk a splice mostly
finds bytes: a poll before each would double the system calls); a direction makes at most
`_TURN` splices before the other's turn. Should the other holder make a splice wait, only
this tunnel's thread waits (both its directions: the holder's own tunnel).

Bounded: at most `PER_SANDBOX` tunnels of a sandbox and `BOX_WIDE` of the box at once (a thread
each); past that `take` says no and the tunnel is copied on the loop as before. Ended:
cancelling `run` writes the stop pipe and shuts both sockets down (`shutdown` wakes a splice
waiting on either), then waits for the thread; an end of stream is passed on as a half-close,
an error ends both directions.

Does NOT: share the loop's per-sandbox turns (`fair_share`): the kernel schedules the thread;
bound the thread's wait in a splice the other holder made blocking other than by the tunnel's
end (its stop, its listener's close); use pipes over `/proc/sys/fs/pipe-max-size` (1 MiB
here: the proxy is unprivileged, a larger `F_SETPIPE_SZ` fails and the pipe keeps the
kernel's default).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import select
import socket
import threading

from lnk_proxy.conn import Conn

__all__ = ["BOX_WIDE", "PER_SANDBOX", "SpliceSlots", "run"]

PER_SANDBOX = 2  # a sandbox's bulk downloads at once in threads; its other tunnels are copied
BOX_WIDE = 8  # 8 threads at most in all: two cores gain nothing from more
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
_TURN = 16  # splices one direction makes before the other's turn: neither starves


class SpliceSlots:
    """How many tunnels splice in threads now, box-wide and per sandbox."""

    def __init__(self, box_wide: int = BOX_WIDE, per_sandbox: int = PER_SANDBOX) -> None:
        self.box_wide, self.per_sandbox = box_wide, per_sandbox
        self.used = 0
        self._by: dict[str, int] = {}

    def take(self, sandbox: str) -> bool:
        if self.used >= self.box_wide or self._by.get(sandbox, 0) >= self.per_sandbox:
            return False
        self.used += 1
        self._by[sandbox] = self._by.get(sandbox, 0) + 1
        return True

    def give(self, sandbox: str) -> None:
        self.used -= 1
        left = self._by[sandbox] - 1
        if left:
            self._by[sandbox] = left
        else:
            del self._by[sandbox]


SLOTS = SpliceSlots()


class _Way:
    """One direction: socket -> its own pipe -> socket, and what it waits for."""

    def __init__(self, src: Conn, dst: Conn, pipe_size: int) -> None:
        self.src, self.dst, self.size = src, dst, pipe_size
        self.read_end, self.write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        with contextlib.suppress(OSError):  # past the user's pipe budget: the default size
            fcntl.fcntl(self.write_end, fcntl.F_SETPIPE_SZ, pipe_size)
        self.held = 0  # bytes in the pipe
        self.done = False

    def step(self) -> tuple[int, int] | None:
        """Move what is ready now; None when it moved something (call again), else the
        (descriptor, poll event) it waits for. An end of stream half-closes `dst`."""
        if self.held == 0:
            try:
                self.held = os.splice(
                    self.src.sock.fileno(), self.write_end, self.size, flags=_FLAGS
                )
            except (BlockingIOError, InterruptedError):
                return self.src.sock.fileno(), select.POLLIN
            if self.held == 0:
                self.dst.shutdown_write()
                self.done = True
                return None
            self.src.received += self.held
        try:
            sent = os.splice(self.read_end, self.dst.sock.fileno(), self.held, flags=_FLAGS)
        except (BlockingIOError, InterruptedError):
            return self.dst.sock.fileno(), select.POLLOUT
        self.held -= sent
        self.dst.sent += sent
        return None

    def close(self) -> None:
        os.close(self.read_end)
        os.close(self.write_end)


def _both_ways(client: Conn, upstream: Conn, stop: int, pipe_size: int) -> None:
    """Both directions in this one thread until both end or `stop`: each splice is tried first
    and `poll` waits only when neither direction could move (in bulk most splices find bytes,
    so a poll per splice would double the system calls)."""
    ways = [_Way(client, upstream, pipe_size)]
    try:
        ways.append(_Way(upstream, client, pipe_size))
        while True:
            waits: dict[int, int] = {}
            busy = False  # a direction still had bytes after its turn: no wait
            for way in ways:
                wanted = None
                for _ in range(_TURN):
                    if way.done or (wanted := way.step()) is not None:
                        break
                if wanted is not None:
                    fd, event = wanted
                    waits[fd] = waits.get(fd, 0) | event
                elif not way.done:
                    busy = True
            if busy:
                continue
            if not waits:
                return
            poller = select.poll()
            poller.register(stop, select.POLLIN)
            for fd, events in waits.items():
                poller.register(fd, events)
            if stop in dict(poller.poll()):
                return
    finally:
        for way in ways:
            way.close()


async def run(client: Conn, upstream: Conn, pipe_size: int) -> None:
    """Both directions in one thread until both end; an error in either ends both; cancelling
    ends both (the sockets shut down, the stop pipe written) and returns once the thread is
    done."""
    loop = asyncio.get_running_loop()
    stop_read, stop_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    done: asyncio.Future[None] = loop.create_future()

    def body() -> None:
        error: BaseException | None = None
        try:
            _both_ways(client, upstream, stop_read, pipe_size)
        except OSError as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed: no one waits
            loop.call_soon_threadsafe(_settle, done, error)

    try:
        threading.Thread(target=body, name="lnk-splice", daemon=True).start()
        await asyncio.shield(done)
    finally:
        if not done.done():
            with contextlib.suppress(OSError):
                os.write(stop_write, b"x")
            for conn in (client, upstream):
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)  # wakes a splice waiting on it
            await asyncio.shield(asyncio.gather(done, return_exceptions=True))
        os.close(stop_read)
        os.close(stop_write)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None or (isinstance(error, OSError) and error.errno == errno.EBADF):
        future.set_result(None)
    else:
        future.set_exception(error)
