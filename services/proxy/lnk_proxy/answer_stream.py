"""A service's or hosted model's answer relayed to the sandbox as it arrives: the head (interim
ones too), then the body on its framing, scrubbed of the secret, each read of the upstream going
out in one send to the client (`stream_answer`), and the chunked framing decoded by a pure,
incremental `ChunkedBody`.

Why reads, not lines (issue 18's first byte): the answer used to be read with asyncio's stream
calls a step at a time (the head by `readuntil`, then per chunk a size line, its data and its
CRLF, each its own await and timer), and the head was sent on its own before the first chunk was
looked for. Under `strace` of the proxy while the test upstream streamed SSE, the first event
left the proxy a loop turn and four awaits after the record holding it was read. Here one read
of whatever the TLS layer has decrypted is parsed whole: a head and the chunks that came with it
go out in one send, and every complete chunk of a later read in one more. The reads come from
`upstream_tls.UpstreamTls` (all that the socket's records decrypt to, in one call), which
bounds its own waits, so no timer context is made per read (`io_timeout_s=None`).

Security limitations: this does NOT bound an answer's size or total time (only each read's idle
time), look at the body beyond the scrubber and `observe`, or read trailers (the answer goes on
close-delimited, so nothing after the last chunk is relayed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from lnk_proxy.conn import Conn
from lnk_proxy.forward import (
    MAX_CHUNK_LINE,
    BadResponse,
    ResponseHead,
    find_response_head_end,
    parse_chunk_size,
    parse_response_head,
)
from lnk_proxy.http_request import ProxyRequest, RequestRefused
from lnk_proxy.services import SecretScrubber

__all__ = ["READ_SIZE", "AnswerReader", "ChunkedBody", "stream_answer"]

READ_SIZE = 64 * 1024  # one read of the answer: a few TLS records
_HEAD_END = b"\r\n\r\n"  # a head's blank line


class ChunkedBody:
    """A chunked body decoded as its bytes arrive: `feed` returns the data of every chunk (or
    part of one) they complete, `done` is set at the last chunk; BadResponse on bad framing."""

    def __init__(self) -> None:
        self._pending = bytearray()  # a size line or a CRLF not yet whole
        self._left = 0  # bytes of the current chunk's data still to come
        self._crlf = False  # the current chunk's data is whole; its CRLF comes next
        self.done = False

    def feed(self, data: bytes | bytearray) -> bytes:
        if self.done:
            return b""
        self._pending += data
        buffer, at, out = self._pending, 0, bytearray()
        while not self.done:
            if self._left:
                take = min(self._left, len(buffer) - at)
                if not take:
                    break
                out += buffer[at : at + take]
                at += take
                self._left -= take
                self._crlf = not self._left
            elif self._crlf:
                if len(buffer) - at < 2:
                    break
                if buffer[at : at + 2] != b"\r\n":
                    raise BadResponse("a chunk not followed by CRLF")
                at += 2
                self._crlf = False
            else:
                end = buffer.find(b"\r\n", at, at + MAX_CHUNK_LINE)
                if end < 0:
                    if len(buffer) - at >= MAX_CHUNK_LINE:
                        raise BadResponse(f"a chunk-size line past {MAX_CHUNK_LINE} bytes")
                    break
                try:
                    size = parse_chunk_size(bytes(buffer[at : end + 2]))
                except RequestRefused as exc:
                    raise BadResponse(exc.reason) from None
                at = end + 2
                self._left = size
                self.done = size == 0
        del buffer[:at]
        return bytes(out)


class AnswerReader(Protocol):
    """Where the answer comes from: `upstream_tls.UpstreamTls`, or an asyncio StreamReader."""

    async def read(self, n: int, /) -> bytes: ...


async def stream_answer(
    request: ProxyRequest,
    reader: AnswerReader,
    client: Conn,
    scrubbing: tuple[bytes, bytes] | None,
    io_timeout_s: float | None,
    *,
    observe: Callable[[bytes], None] | None = None,
) -> None:
    """The answer's head (interim ones too), then its body on its framing, scrubbed; what one
    read brings goes to the client in one send (never held for the next read), and the body's
    bytes to `observe` as they came (a hosted model's response ids are learnt there). Each
    read waits at most `io_timeout_s` (None: `reader` bounds its own waits, as `UpstreamTls`
    does by its `Conn`'s timeout, with no timer context per read). `scrubbing`: (the secret,
    what replaces it), or None when the upstream was given none (a local runtime's)."""
    scrubber = SecretScrubber(*scrubbing) if scrubbing is not None else _NoSecret()

    async def read() -> bytes:
        if io_timeout_s is None:
            return await reader.read(READ_SIZE)
        async with asyncio.timeout(io_timeout_s):
            return await reader.read(READ_SIZE)

    def feed(data: bytes) -> bytes:
        if observe is not None:
            observe(data)
        return scrubber.feed(data)

    buffer = bytearray()
    while True:
        end = find_response_head_end(buffer)  # BadResponse past MAX_RESPONSE_HEAD_BYTES
        if end is None:
            data = await read()
            if not data:
                raise BadResponse("the upstream closed without answering")
            buffer += data
            continue
        response = parse_response_head(bytes(buffer[:end]), request.method)
        del buffer[:end]
        # A head is scrubbed whole (nothing of it held back for the body), by the stream's
        # own scrubber: nothing is held in it yet, and flush leaves nothing held after.
        out = scrubber.feed(_head_out(response)) + scrubber.flush()
        if not response.interim:
            break
        await client.send(out)
    if response.framing == "length":
        remaining = response.length or 0
        data = bytes(buffer[:remaining])
        while True:
            remaining -= len(data)
            await client.send(out + feed(data) if data else out)
            out = b""
            if not remaining:
                break
            data = await read()
            if not data:
                raise BadResponse("the upstream's answer ended early")
            data = data[:remaining]
    elif response.framing == "chunked":
        chunked = ChunkedBody()
        data = chunked.feed(buffer)
        while True:
            if data or out:
                await client.send(out + feed(data) if data else out)
                out = b""
            if chunked.done:
                break
            more = await read()
            if not more:
                raise BadResponse("the upstream's answer ended early")
            data = chunked.feed(more)
    elif response.framing == "close":
        data = bytes(buffer)
        while True:
            if data or out:
                await client.send(out + feed(data) if data else out)
                out = b""
            data = await read()
            if not data:
                break
    else:  # no body (HEAD, 204, 304): whatever else the service sent is not relayed
        await client.send(out)
    await client.send(scrubber.flush())
    client.shutdown_write()


def _head_out(response: ResponseHead) -> bytes:
    """The head as the client gets it: close-delimited, no framing header (an interim one as
    it came)."""
    if response.interim:
        return b"\r\n".join(response.head_lines) + _HEAD_END
    kept = [
        line
        for line in response.head_lines
        if not line.lower().startswith((b"content-length:", b"transfer-encoding:"))
    ]
    return b"\r\n".join((*kept, b"Connection: close")) + _HEAD_END


class _NoSecret:
    """The scrubber of an answer from an upstream that was given no secret: nothing to hold."""

    def feed(self, data: bytes) -> bytes:
        return data

    def flush(self) -> bytes:
        return b""
