"""Moving bytes for the proxy: one non-blocking socket with a small read buffer (`Conn`),
tunnels spliced through pooled pipes, a shared pool of large buffers for plain http bodies,
and dialing the one address the policy vetted.

Why this shape (2 cores, 1 GiB from a sendfile server in a netns through a CONNECT tunnel, the
client and the source busy on the same cores): a tunnel moves its bytes socket → pipe → socket
with `splice` from the event loop, so they never enter Python; a direction holds a pipe (grown
to 1 MiB) only while bytes are in flight and gives it back when its source runs dry, so an idle
tunnel holds none. Measured back to back on a loaded machine (load ~2.5), 3-4 rounds each: `asyncio`
with 1 MiB `recv_into` reached 33-66% of direct, splice 62-69% (bench/proxy.py has the figures
on a quiet one): the copies through
Python were what the client and the source had to share the cores with. Plain http bodies are
parsed and framed here, so they still go through `recv_into` a pooled 1 MiB buffer that a
direction holds only while its bytes are in flight (64 KiB ones once 32 large ones are out:
see `BufferPool`); an idle connection holds no buffer (≈ 10 KiB per open tunnel in all,
measured over 500 idle tunnels).

Timeouts: `Conn.timeout` bounds each wait for the socket to become readable or writable (an
idle bound, not a total); None waits forever (open tunnels). `Conn.deadline` (the loop's
clock) bounds every wait in total until it is cleared: the caller sets it around reading a
head (one timer per wait, not an `asyncio.timeout` context per request).

Reading after speaking: when this side sent last, the peer has to answer before there is
anything to read, so a head read waits for readiness first instead of trying a `recv` that
fails with EAGAIN (each failed call raised an exception: with the flags' and the pool's, six
per small request, a tenth of its Python time).

Buffers: a tunnel's sockets and pipes get the fixed sizes its `TunnelBuffers` name (the
origin socket's before `connect`, so the kernel never autotunes them; `tunnel_buffers`).

Limits: this module does NOT judge anything (the caller dials only `Allowed.address`), limit
bandwidth, or bound the kernel's socket buffers of plain http exchanges (the kernel's
defaults apply to sockets dialed without `TunnelBuffers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

from lnk_proxy.fair_share import CURRENT
from lnk_proxy.http_request import RequestRefused
from lnk_proxy.tunnel_buffers import LARGE, SMALL, TunnelBuffers
from lnk_shared.addresses import IPAddress
from lnk_shared.handed_socket import HandedSocket

__all__ = [
    "BUFFER_SIZE",
    "IDLE_TOO_LONG",
    "READ_CHUNK",
    "BufferPool",
    "Conn",
    "bind_listener",
    "dial",
    "tunnel",
]

BUFFER_SIZE = 1024 * 1024  # reads this large keep a tunnel near direct speed (see above)
POOL_KEEP = 8  # idle buffers kept for reuse (8 MiB); more are freed after use
LARGE_BUFFERS = 32  # large buffers out at once (32 MiB): what stalled peers can pin, at most
SMALL_BUFFER_SIZE = 64 * 1024  # past that, each direction reads this much at a time
LISTENER_DIR_MODE = 0o700  # a folder made for listeners: a sandbox reaches its own by a bind
BACKLOG = 128  # connections waiting for accept: a burst of clients in one sandbox
READ_CHUNK = 64 * 1024  # one read while parsing heads and chunk lines: a head's budget and more
_SPLICE_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


class BufferPool:
    """Buffers lent to a direction only while it moves bytes: a large one while fewer than
    `large_limit` are out, else a small one. A direction whose peer stops reading holds its
    buffer, so this bounds what stalled tunnels can pin to `large_limit` large buffers plus a
    small one per direction."""

    def __init__(
        self,
        size: int = BUFFER_SIZE,
        keep: int = POOL_KEEP,
        large_limit: int = LARGE_BUFFERS,
        small_size: int = SMALL_BUFFER_SIZE,
    ) -> None:
        self.size = size
        self.keep = keep
        self.large_limit = large_limit
        self.small_size = small_size
        self.lent = 0
        self._free: list[bytearray] = []

    def take(self) -> bytearray:
        if self.lent >= self.large_limit:
            return bytearray(self.small_size)
        self.lent += 1
        return self._free.pop() if self._free else bytearray(self.size)

    def give(self, buffer: bytearray) -> None:
        if len(buffer) != self.size:
            return  # a small one: freed
        self.lent -= 1
        if len(self._free) < self.keep:
            self._free.append(buffer)


POOL = BufferPool()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


IDLE_TOO_LONG = "the peer was idle too long"  # a wait's timeout, as the wire's log shows it


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError(IDLE_TOO_LONG))


class Conn:
    """A connected non-blocking stream socket, its unread bytes, and byte counts.

    Reading keeps the socket in the loop's selector between waits (a request and its answer
    then cost no epoll_ctl calls); a readiness that no one waits for takes it out again, so an
    idle socket with unread bytes never spins the loop. `close` always takes it out first."""

    def __init__(self, sock: socket.socket, timeout: float | None = None) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.timeout = timeout
        self.deadline: float | None = None  # the loop's time at which every wait ends
        self.buffer = bytearray()
        self.received = 0
        self.sent = 0
        self._loop = asyncio.get_running_loop()
        self._fd = sock.fileno()
        self._watched = False  # in the selector for reading
        self._reader: asyncio.Future[None] | None = None  # the read wait in progress
        self._spoke_last = False  # sent since the last read: the peer owes an answer first
        # Called at readiness instead of waking a read wait: the callback path's
        # (`fast_exchange`), on the same selector entry (a new callback costs two epoll_ctl).
        self.on_readable: Callable[[], None] | None = None

    def _readable(self) -> None:
        callback = self.on_readable
        if callback is not None:
            callback()
            return
        reader = self._reader
        if reader is None:  # no one reads now: stop watching (level-triggered: it would spin)
            self._loop.remove_reader(self._fd)
            self._watched = False
        elif not reader.done():
            reader.set_result(None)
        # else: woken already, its task has not run yet

    async def _wait(self, writable: bool) -> None:
        loop = self._loop
        future: asyncio.Future[None] = loop.create_future()
        if writable:
            loop.add_writer(self._fd, _wake, future)
        else:
            if not self._watched:
                loop.add_reader(self._fd, self._readable)
                self._watched = True
            self._reader = future
        if self.deadline is not None:
            timer: asyncio.TimerHandle | None = loop.call_at(self.deadline, _expire, future)
        elif self.timeout:
            timer = loop.call_later(self.timeout, _expire, future)
        else:
            timer = None
        try:
            await future
        finally:
            if writable:
                loop.remove_writer(self._fd)
            else:
                self._reader = None
            if timer is not None:
                timer.cancel()
        share = CURRENT.get()  # the sandbox's share of the loop: its turn may come later
        if share is not None and (turn := share.take()) is not None:
            await turn

    def watch(self) -> None:
        """Keep the socket in the loop's selector for reading (for `on_readable`)."""
        if not self._watched:
            self._loop.add_reader(self._fd, self._readable)
            self._watched = True

    def unwatch(self) -> None:
        """Take it out (nothing to read now: level-triggered readiness would spin)."""
        if self._watched:
            self._loop.remove_reader(self._fd)
            self._watched = False

    async def readable(self) -> None:
        """Until the socket is readable (or, listening, has a connection to accept)."""
        await self._wait(writable=False)

    @property
    def seen_silent(self) -> bool:
        """Whether the event loop, at its last look, saw nothing to read here (no bytes, no end
        of stream) since this side last read: the socket is still watched and no one took its
        readiness. A change since that look is not seen (a `recv` would see it)."""
        return self._watched and self._reader is None

    async def recv_some(self) -> bool:
        """Append what the peer sent next to `buffer`; False at end of stream."""
        if self._spoke_last:  # the peer answers first: wait, rather than fail a recv
            self._spoke_last = False
            await self._wait(writable=False)
        while True:
            try:
                data = self.sock.recv(READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                await self._wait(writable=False)
                continue
            self.received += len(data)
            self.buffer += data
            return bool(data)

    async def recv_into(self, view: memoryview) -> int:
        """Read what the peer sent next straight into `view` (never through `buffer`, which
        must be empty: its bytes come first); 0 at end of stream."""
        if self._spoke_last:
            self._spoke_last = False
            await self._wait(writable=False)
        while True:
            try:
                count = self.sock.recv_into(view)
            except (BlockingIOError, InterruptedError):
                await self._wait(writable=False)
                continue
            self.received += count
            return count

    async def send(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            try:
                sent = self.sock.send(view)
            except (BlockingIOError, InterruptedError):
                await self._wait(writable=True)
                continue
            self.sent += sent
            view = view[sent:]
        self._spoke_last = True

    async def read_head(self, find_end: Callable[[bytearray], int | None]) -> bytes | None:
        """One head (through its blank line), using `find_end` (which raises past its own
        limit); None when the peer closed before sending a byte; EOFError mid-head."""
        while True:
            end = find_end(self.buffer) if self.buffer else None
            if end is not None:
                head = bytes(self.buffer[:end])
                del self.buffer[:end]
                return head
            if not await self.recv_some():
                if self.buffer:
                    raise EOFError("the peer closed in the middle of a head")
                return None

    async def read_line(self, limit: int) -> bytes:
        """One CRLF-ended line (CRLF included) of at most `limit` bytes."""
        while True:
            end = self.buffer.find(b"\r\n", 0, limit)
            if end >= 0:
                line = bytes(self.buffer[: end + 2])
                del self.buffer[: end + 2]
                return line
            if len(self.buffer) >= limit:
                raise RequestRefused("bad-chunk", f"a line longer than {limit} bytes")
            if not await self.recv_some():
                raise EOFError("the peer closed in the middle of a line")

    async def read_exact(self, count: int) -> bytes:
        while len(self.buffer) < count:
            if not await self.recv_some():
                raise EOFError("the peer closed early")
        data = bytes(self.buffer[:count])
        del self.buffer[:count]
        return data

    async def copy_to(self, dst: Conn, limit: int | None = None) -> int:
        """Move `limit` bytes (all, up to end of stream, when None) to `dst`: buffered ones
        first, then through a pooled buffer. EOFError when the stream ends before `limit`."""
        moved = 0
        if self.buffer:
            take = len(self.buffer) if limit is None else min(limit, len(self.buffer))
            await dst.send(self.buffer[:take])
            del self.buffer[:take]
            moved += take
        while limit is None or moved < limit:
            buffer = POOL.take()
            want = len(buffer) if limit is None else min(len(buffer), limit - moved)
            try:
                try:
                    count = self.sock.recv_into(buffer, want)
                except (BlockingIOError, InterruptedError):
                    count = -1
                if count > 0:
                    self.received += count
                    await dst.send(memoryview(buffer)[:count])
                    moved += count
                    continue
            finally:
                POOL.give(buffer)
            if count == 0:
                if limit is None:
                    return moved
                raise EOFError(f"the peer closed after {moved} of {limit} bytes")
            await self._wait(writable=False)
        return moved

    async def splice_to(self, dst: Conn, pipes: PipePool | None = None) -> None:
        """Move every byte up to end of stream to `dst`, socket to pipe to socket in the kernel
        (`splice`): the bytes never enter this process. A pipe is held only while bytes are in
        flight, from `pipes` (the large pool by default). `_CannotSplice` when a socket cannot
        splice, before any byte moved: also when either end is a `HandedSocket`, whose other
        holder may make it blocking (a TCP socket's splice follows the file's O_NONBLOCK, not
        `SPLICE_F_NONBLOCK`), so its bytes go through `copy_to`'s `MSG_DONTWAIT` calls."""
        if isinstance(self.sock, HandedSocket) or isinstance(dst.sock, HandedSocket):
            raise _CannotSplice
        pool = PIPES if pipes is None else pipes
        if self.buffer:
            await dst.send(self.buffer)
            self.buffer.clear()
        moved = False
        while True:
            pipe = pool.take()
            held = 0  # bytes in the pipe
            try:
                while True:
                    if held == 0:
                        try:
                            held = os.splice(self._fd, pipe[1], pool.size, flags=_SPLICE_FLAGS)
                        except (BlockingIOError, InterruptedError):
                            break  # dry: give the pipe back while we wait
                        if held == 0:
                            return  # end of stream
                        self.received += held
                    try:
                        sent = os.splice(pipe[0], dst._fd, held, flags=_SPLICE_FLAGS)
                    except (BlockingIOError, InterruptedError):
                        await dst._wait(writable=True)
                        continue
                    held -= sent
                    dst.sent += sent
                    moved = True
            except OSError as exc:
                if exc.errno == errno.EINVAL and not moved and held == 0:
                    raise _CannotSplice from exc
                raise
            finally:
                pool.give(pipe, empty=held == 0)
            await self._wait(writable=False)

    def shutdown_write(self) -> None:
        with contextlib.suppress(OSError):  # already reset: the other direction sees it
            self.sock.shutdown(socket.SHUT_WR)

    def detach(self) -> None:
        """Out of the loop's selector and callbacks, the socket left open (its caller closes
        it: `handed_close`)."""
        self.unwatch()  # before the fd is freed: a new socket may get its number
        self.on_readable = None

    def close(self) -> None:
        self.detach()
        self.sock.close()


async def dial(
    address: IPAddress, port: int, timeout_s: float, buffers: TunnelBuffers | None = None
) -> socket.socket:
    """A TCP connection to exactly `address`:`port` (never a name: no second lookup), with
    `buffers`' fixed receive and send buffers (set before connect: the window offered in the
    SYN is sized from them and the kernel never autotunes them) or the kernel's defaults; a
    `tcp_send` of 0 leaves the send buffer to the kernel's autotuning."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if buffers is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffers.tcp_receive)
            if buffers.tcp_send:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffers.tcp_send)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s):  # not wait_for: no extra task per dial
            await loop.sock_connect(sock, (str(address), port))
        share = CURRENT.get()
        if share is not None:
            share.begin()  # resumed by the connect, not by a wait that counted a step
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


class _CannotSplice(Exception):
    """A socket type without splice support (none the proxy makes), or a `HandedSocket` (never
    spliced: see `Conn.splice_to`): copy through a buffer."""


class PipePool:
    """Pipes for `Conn.splice_to`, lent while a direction has bytes in flight and given back
    empty when its source runs dry, so an idle tunnel holds none; at most `keep` are kept."""

    def __init__(self, size: int = BUFFER_SIZE, keep: int = POOL_KEEP) -> None:
        self.size = size
        self.keep = keep
        self.lent = 0
        self._free: list[tuple[int, int]] = []

    def take(self) -> tuple[int, int]:
        if self._free:
            pipe = self._free.pop()
        else:  # OSError (out of descriptors) ends the caller's tunnel, and lends nothing
            pipe = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            with contextlib.suppress(OSError):  # past the user's pipe budget: the default size
                fcntl.fcntl(pipe[1], fcntl.F_SETPIPE_SZ, self.size)
        self.lent += 1
        return pipe

    def give(self, pipe: tuple[int, int], *, empty: bool) -> None:
        self.lent -= 1
        if empty and len(self._free) < self.keep:
            self._free.append(pipe)
        else:  # bytes left in it belong to a broken direction: drop them with the pipe
            os.close(pipe[0])
            os.close(pipe[1])


PIPES = PipePool(size=LARGE.pipe)  # the large tunnels' (and the default)
SMALL_PIPES = PipePool(size=SMALL.pipe)
_PIPES_OF = {LARGE.pipe: PIPES, SMALL.pipe: SMALL_PIPES}


async def tunnel(
    client: Conn,
    upstream: Conn,
    buffers: TunnelBuffers = LARGE,
    spliced_by: Callable[[Conn, Conn, int], Awaitable[None]] | None = None,
) -> None:
    """Move bytes both ways until both directions end; a half-close is passed on. An error on
    either side (a reset) ends both. Cancelling this ends both too. The sandbox's side gets
    `buffers.unix_send` as its send buffer and both directions pipes of `buffers.pipe` (the
    origin side was dialed with `buffers`); `client` is the sandbox's side. `spliced_by`, when
    given, moves the bytes instead (`handed_splice.run`: a handed tunnel in a thread)."""
    pipes = _PIPES_OF.get(buffers.pipe) or PipePool(size=buffers.pipe, keep=0)

    async def one_way(src: Conn, dst: Conn) -> None:
        try:
            await src.splice_to(dst, pipes)
        except _CannotSplice:
            await src.copy_to(dst)  # a socket that cannot splice: through a buffer
        dst.shutdown_write()

    # The sandbox's side, before the tunnel's bytes: its unix connection, or the TCP socket
    # it handed over (`handoff`), whose receive buffer is fixed too (TCP would autotune it).
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffers.unix_send)
    if client.sock.family != socket.AF_UNIX:
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffers.unix_send)
    if spliced_by is not None:
        await spliced_by(client, upstream, buffers.pipe)
        return
    tasks = [
        asyncio.create_task(one_way(client, upstream)),
        asyncio.create_task(one_way(upstream, client)),
    ]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()  # raise the error that ended it, if any
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def bind_listener(path: Path, mode: int) -> socket.socket:
    """A listening socket at `path`, its mode set to `mode` after bind. A missing folder is
    made (mode 0700); an existing one is left as its owner set it. A stale
    socket is replaced; anything else there is a ValueError."""
    if not path.is_absolute():
        raise ValueError(f"{path} is not an absolute path")
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=LISTENER_DIR_MODE)
        os.chmod(path.parent, LISTENER_DIR_MODE)
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise ValueError(f"{path} exists and is not a socket")
        path.unlink()
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, mode)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock
