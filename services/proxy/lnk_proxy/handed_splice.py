"""A handed tunnel (`handoff`) spliced in two threads of its own, so a splice that blocks holds
only those threads, never the proxy's event loop.

Why: a handed socket may have another holder, which can clear O_NONBLOCK on the file they
share, and a TCP socket's `splice` follows that flag, not `SPLICE_F_NONBLOCK`
(`lnk_shared.handed_socket`), so the loop never splices one (`Conn.splice_to` copies through a
buffer instead, 0.72 CPU-s a GiB in the proxy against 0.40 spliced: bench/README.md, session
13). Here each direction runs in a thread: `poll` for readiness, then `splice` socket -> pipe
-> socket; should the other holder make a splice wait, only that thread waits.

Bounded: at most `PER_SANDBOX` tunnels of a sandbox and `BOX_WIDE` of the box at once (two
threads each); past that `take` says no and the tunnel is copied on the loop as before. Ended:
cancelling `run` writes the stop pipe and shuts both sockets down (`shutdown` wakes a splice
waiting on either), then waits for both threads; an end of stream is passed on as a
half-close, an error ends both directions.

Does NOT: share the loop's per-sandbox turns (`fair_share`): the kernel schedules the threads;
bound a thread's wait in a splice the other holder made blocking other than by the tunnel's
end (its stop, its listener's close).
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
BOX_WIDE = 8  # 16 threads at most in all: two cores gain nothing from more
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
_POLL_ERR = select.POLLERR | select.POLLHUP | select.POLLNVAL


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


def _one_way(src: Conn, dst: Conn, stop: int, pipe_size: int) -> None:
    """socket -> pipe -> socket until the end of stream (then half-close `dst`) or `stop`."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, pipe_size)
        poller = select.poll()
        poller.register(stop, select.POLLIN)
        src_fd, dst_fd = src.sock.fileno(), dst.sock.fileno()
        while True:
            if not _wait(poller, src_fd, select.POLLIN, stop):
                return
            try:
                held = os.splice(src_fd, write_end, pipe_size, flags=_FLAGS)
            except (BlockingIOError, InterruptedError):
                continue
            if held == 0:
                dst.shutdown_write()
                return
            src.received += held
            while held:
                if not _wait(poller, dst_fd, select.POLLOUT, stop):
                    return
                try:
                    sent = os.splice(read_end, dst_fd, held, flags=_FLAGS)
                except (BlockingIOError, InterruptedError):
                    continue
                held -= sent
                dst.sent += sent
    finally:
        os.close(read_end)
        os.close(write_end)


def _wait(poller: select.poll, fd: int, event: int, stop: int) -> bool:
    """Until `fd` is ready for `event` (or in error: the next call says which); False on stop."""
    poller.register(fd, event)
    try:
        while True:
            ready = dict(poller.poll())
            if stop in ready:
                return False
            if fd in ready:
                return True
    finally:
        poller.unregister(fd)


async def run(client: Conn, upstream: Conn, pipe_size: int) -> None:
    """Both directions in threads until both end; an error in one ends both; cancelling ends
    both (the sockets shut down) and returns once both threads are done."""
    loop = asyncio.get_running_loop()
    stop_read, stop_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    done: list[asyncio.Future[None]] = []

    def start(src: Conn, dst: Conn) -> None:
        future: asyncio.Future[None] = loop.create_future()

        def body() -> None:
            error: BaseException | None = None
            try:
                _one_way(src, dst, stop_read, pipe_size)
            except OSError as exc:
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed: no one waits
                loop.call_soon_threadsafe(_settle, future, error)

        threading.Thread(target=body, name="lnk-splice", daemon=True).start()
        done.append(future)

    def end_both() -> None:
        with contextlib.suppress(OSError):
            os.write(stop_write, b"x")
        for conn in (client, upstream):
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)  # wakes a splice waiting on it

    try:
        start(client, upstream)
        start(upstream, client)
        finished, _ = await asyncio.wait(done, return_when=asyncio.FIRST_EXCEPTION)
        for future in finished:
            future.result()
    finally:
        if not all(f.done() for f in done) or any(f.exception() for f in done if f.done()):
            end_both()
        await asyncio.shield(asyncio.gather(*done, return_exceptions=True))
        os.close(stop_read)
        os.close(stop_write)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None or (isinstance(error, OSError) and error.errno == errno.EBADF):
        future.set_result(None)
    else:
        future.set_exception(error)
