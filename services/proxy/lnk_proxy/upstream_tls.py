"""One TLS client connection to a rule's host (a service's or a hosted model's), on the proxy's
own `Conn`: `ssl.MemoryBIO` and an `SSLObject` from the caller's context, the handshake, writes
encrypted in slices, and reads that return all that the socket's bytes decrypt to.

Why not asyncio's SSL transport (`open_connection(ssl=...)`, issue 18's first byte): under
uvloop every record read made and shrank a 256 KiB bytes object (an mmap, an mremap and a
munmap per record, and one more per read that found none: strace of the bench), then the bytes
went through a StreamReader's buffer, a future and a task's wake-up, each read had its own
`asyncio.timeout`, and the close ran the transport's shutdown (flush, timer, the peer's
close_notify awaited). On 2 cores the sandbox's side, woken by the send of the first event,
waits behind that CPU (`perf sched`: its wake-up delay was the proxy still running). Here the
socket is read into one buffer, decrypted into another that is reused, and the waits are
`Conn`'s (its idle timeout, the sandbox's share of the loop); `close` sends close_notify and
does not wait for the answer's (the answer is whole by its framing, or it was not wanted).

Security: the verification is the caller's `SSLContext` (chain and name, `server_hostname` =
the rule's host): nothing here can weaken it. TLS failures are `ssl.SSLError`, socket ones
`OSError`, idle ones `TimeoutError`, as with the transport. An end of stream with no
close_notify reads as the end, as the transport's did: a length or chunked answer's framing
says whether it is whole; a close-delimited one cannot be told from a truncated one (a known
limit, unchanged).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import cast

from lnk_proxy.conn import Conn

__all__ = ["CLOSE_DRAIN_READS", "RAW_READ", "WRITE_SLICE", "UpstreamTls"]

RAW_READ = 64 * 1024  # one recv of ciphertext: a few full records
WRITE_SLICE = 256 * 1024  # a body is encrypted this much at a time: bounded ciphertext held
# Reads at close, for the host's close_notify: bounded, so a host that keeps sending cannot
# hold the loop (or grow the BIO) while the connection is being dropped.
CLOSE_DRAIN_READS = 4


class UpstreamTls:
    """A TLS client on a connected socket. Not thread-safe: the proxy's event loop only."""

    def __init__(
        self, conn: Conn, tls: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO
    ) -> None:
        self.conn = conn
        self._tls = tls
        self._incoming, self._outgoing = incoming, outgoing  # the BIOs `tls` was made on
        self._raw = bytearray(RAW_READ)  # ciphertext, reused for every recv
        self._plain = bytearray()  # plaintext, reused for every read (grown to its limit)
        self._ended = False  # TLS saw the end: the host's close_notify, or the socket's end

    @classmethod
    async def open(
        cls, sock: socket.socket, context: ssl.SSLContext, host: str, timeout_s: float
    ) -> UpstreamTls:
        """The handshake with `host` (SNI and the name checked) within `timeout_s` in total;
        the socket is closed when it fails."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        conn = Conn(sock)
        try:
            tls = context.wrap_bio(incoming, outgoing, server_side=False, server_hostname=host)
            upstream = cls(conn, tls, incoming, outgoing)
            conn.deadline = asyncio.get_running_loop().time() + timeout_s
            try:
                while True:
                    try:
                        tls.do_handshake()
                        break
                    except ssl.SSLWantReadError:
                        await upstream._flush()
                        if not await upstream._fill():
                            raise ConnectionResetError(
                                "the host closed during the TLS handshake"
                            ) from None
                await upstream._flush()
            finally:
                conn.deadline = None
        except BaseException:
            conn.close()
            raise
        return upstream

    async def write(self, *pieces: bytes | bytearray | memoryview) -> None:
        """Encrypt and send `pieces` in order, in one send when they are small, a slice at a
        time when not (a 1 MiB body never becomes 1 MiB of ciphertext held at once)."""
        for piece in pieces:
            with memoryview(piece) as view:
                for at in range(0, len(view), WRITE_SLICE):
                    self._tls.write(view[at : at + WRITE_SLICE])  # a memory BIO takes it all
                    if self._outgoing.pending >= WRITE_SLICE:
                        await self._flush()
        await self._flush()

    async def read(self, limit: int) -> bytes:
        """At least one byte of plaintext and at most `limit`: all that what has arrived
        decrypts to (several records at once); b"" at the end of the stream."""
        while True:
            data = self._decrypt(limit)
            if self._outgoing.pending:  # TLS 1.3 answers some records (a key update)
                await self._flush()
            if data:
                return data
            if self._ended or not await self._fill():
                return b""

    def close(self) -> None:
        """Send close_notify (without waiting for the host's) and close the socket."""
        with contextlib.suppress(OSError):
            self._drain_nowait()  # what the host sent last (its close_notify): no RST for it
        with contextlib.suppress(ssl.SSLError, ValueError):
            self._tls.unwrap()  # queues close_notify; SSLWantReadError: the host's not read
        pending = self._outgoing.read()
        if pending:
            with contextlib.suppress(OSError):
                self.conn.sock.send(pending)  # non-blocking, best effort: the answer is over
        self.conn.close()

    def _decrypt(self, limit: int) -> bytes:
        """The plaintext that the ciphertext fed so far makes, up to `limit` (b"": none yet,
        or the end), decrypted record by record into one reused buffer."""
        if len(self._plain) < limit:
            self._plain = bytearray(limit)
        got = 0
        with memoryview(self._plain) as view:
            while got < limit:
                try:
                    # With a buffer it returns a count (typeshed says bytes).
                    count = cast(int, self._tls.read(limit - got, view[got:]))
                except ssl.SSLWantReadError:
                    break
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    self._ended = True
                    break
                if not count:
                    self._ended = True
                    break
                got += count
            return bytes(view[:got])

    async def _fill(self) -> bool:
        """Feed what the socket has (waiting for it if nothing) to TLS; False at its end."""
        conn = self.conn
        while True:
            try:
                count = conn.sock.recv_into(self._raw)
            except (BlockingIOError, InterruptedError):
                await conn.readable()
                continue
            if not count:
                self._incoming.write_eof()
                return False
            conn.received += count
            with memoryview(self._raw) as view:
                self._incoming.write(view[:count])
            return True

    def _drain_nowait(self) -> None:
        """What the socket holds now (at most `CLOSE_DRAIN_READS` reads), fed to TLS, without
        waiting."""
        for _ in range(CLOSE_DRAIN_READS):
            try:
                count = self.conn.sock.recv_into(self._raw)
            except (BlockingIOError, InterruptedError):
                return
            if not count:
                return
            with memoryview(self._raw) as view:
                self._incoming.write(view[:count])

    async def _flush(self) -> None:
        """Send every byte of ciphertext TLS has made."""
        if self._outgoing.pending:
            await self.conn.send(self._outgoing.read())
