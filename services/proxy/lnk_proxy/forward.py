"""One plain `http://` request through the proxy: its head and body to the origin, the origin's
response back to the sandbox.

The request head is `format_upstream_head` (hop-by-hop and `Proxy-*` headers gone, framing
derived, keep-alive asked in HTTP/1.1). `forward_http` says whether the origin's connection
ended on a message boundary and may carry another request (`Forwarded.upstream_keeps`): the
caller pools it for the same sandbox and the same judged address only. A body
goes as its framing says: a Content-Length body byte for byte, a chunked body re-framed chunk
by chunk (sizes re-written, extensions and trailers dropped). The body and the response move
at the same time, so `Expect: 100-continue` works and an early answer is not stuck.

The response goes back as the origin sent it (status, headers, body; a redirect is passed back,
never followed), except the connection's own headers (`Connection`, `Keep-Alive`,
`Proxy-Connection` and the names `Connection` lists), which are replaced by this proxy's one
`Connection` header. Its framing is judged by `parse_response_head` (sans-io): a response that
another reader could frame differently (both Content-Length and Transfer-Encoding, differing
lengths, an unknown coding) is relayed until the origin closes, then the sandbox's connection
is closed too, so one origin cannot forge the answer to the sandbox's next request.

Limits: this module does NOT look at bodies, decompress, cache, carry `Upgrade` (a 101 is a
bad response: nothing asked for it), or bound a response's size or total time (only the idle
time of each read and write, `Conn.timeout`).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Literal, NamedTuple

from lnk_proxy.conn import Conn
from lnk_proxy.http_request import (
    MAX_HEADERS,
    MAX_LINE,
    ProxyRequest,
    RequestRefused,
    format_upstream_head,
)

__all__ = [
    "BAD_GATEWAY",
    "MAX_CHUNK_LINE",
    "MAX_RESPONSE_HEAD_BYTES",
    "BadResponse",
    "Forwarded",
    "ResponseHead",
    "find_response_head_end",
    "forward_http",
    "parse_chunk_size",
    "parse_response_head",
]

MAX_RESPONSE_HEAD_BYTES = 64 * 1024  # twice a request's: origins send large Set-Cookie heads
MAX_CHUNK_LINE = 4096  # a size line with extensions; real ones are a few bytes
MAX_CHUNK_SIZE_DIGITS = 15  # below 2**60: a size every peer can hold
MAX_TRAILER_BYTES = 32 * 1024  # trailers are read to be dropped; bounded like a head
BODY_SETTLE_S = 1.0  # after the response, time for the last body write to be seen done
BAD_GATEWAY = (
    b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 31\r\nConnection: close\r\n\r\nlnk: the origin did not answer\n"
)

_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?: [\x09\x20-\x7e\x80-\xff]*)?")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,%d})[ \t]*(?:;[^\r\n]*)?\r\n" % MAX_CHUNK_SIZE_DIGITS)
_CONNECTION_HEADERS = frozenset({b"connection", b"keep-alive", b"proxy-connection"})
_HTTP11 = b"HTTP/1.1 "

Framing = Literal["none", "length", "chunked", "close"]


class BadResponse(Exception):
    """The origin's answer cannot be relayed safely: the sandbox gets a 502 or a closed line."""


@dataclass(frozen=True)
class ResponseHead:
    status: int
    framing: Framing
    length: int | None  # for framing "length"
    head_lines: tuple[bytes, ...]  # status line and kept headers, without CRLFs
    origin_keeps: bool = False  # HTTP/1.1 without `Connection: close`: the origin keeps it open

    @property
    def interim(self) -> bool:
        """A 1xx before the real answer (100 Continue, 103 Early Hints)."""
        return 100 <= self.status < 200

    def for_client(self, keep_alive: bool) -> bytes:
        """The head as the sandbox gets it, with this proxy's `Connection` header."""
        if self.interim:
            return b"\r\n".join(self.head_lines) + b"\r\n\r\n"
        connection = b"Connection: keep-alive" if keep_alive else b"Connection: close"
        return b"\r\n".join((*self.head_lines, connection)) + b"\r\n\r\n"


def find_response_head_end(untrusted: bytes | bytearray) -> int | None:
    end = untrusted.find(b"\r\n\r\n", 0, MAX_RESPONSE_HEAD_BYTES)
    if end >= 0:
        return end + 4
    if len(untrusted) >= MAX_RESPONSE_HEAD_BYTES:
        raise BadResponse(f"no blank line in the first {MAX_RESPONSE_HEAD_BYTES} bytes")
    return None


def parse_response_head(untrusted: bytes, request_method: str) -> ResponseHead:
    """Judge an origin's response head (through its blank line); BadResponse if unusable."""
    lines = untrusted[:-4].split(b"\r\n")
    if len(lines) - 1 > MAX_HEADERS or any(len(line) > MAX_LINE for line in lines):
        raise BadResponse("too many or too long header lines")
    status_match = _STATUS_LINE.fullmatch(lines[0])
    if status_match is None:
        raise BadResponse(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    status = int(status_match.group(1))
    if status == 101 or status < 100:
        raise BadResponse(f"status {status}: nothing asked for it")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
            raise BadResponse(f"a malformed header line: {line[:80]!r}")
        headers.append((name.lower(), value.strip(b" \t")))
    named = {
        option.strip(b" \t").lower()
        for name, value in headers
        if name == b"connection"
        for option in value.split(b",")
    }
    dropped = (_CONNECTION_HEADERS | named) - {b"content-length", b"transfer-encoding"}
    kept = [lines[0]] + [
        line for line, (name, _) in zip(lines[1:], headers, strict=True) if name not in dropped
    ]
    framing, length = _response_framing(headers, status, request_method)
    if framing == "close":
        kept = [line for line in kept if not line.lower().startswith(b"content-length:")]
    origin_keeps = lines[0].startswith(_HTTP11) and b"close" not in named and framing != "close"
    return ResponseHead(status, framing, length, tuple(kept), origin_keeps)


def _response_framing(
    headers: list[tuple[bytes, bytes]], status: int, method: str
) -> tuple[Framing, int | None]:
    """RFC 9112 6.3, read strictly: anything another reader could frame otherwise is "close"."""
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return "none", None
    codings = [value for name, value in headers if name == b"transfer-encoding"]
    lengths = [value for name, value in headers if name == b"content-length"]
    if codings:
        if lengths or len(codings) != 1 or codings[0].lower() != b"chunked":
            return "close", None
        return "chunked", None
    if lengths:
        items = {item.strip(b" \t") for value in lengths for item in value.split(b",")}
        if len(items) != 1:
            return "close", None
        (item,) = items
        if not item.isdigit() or len(item) > MAX_CHUNK_SIZE_DIGITS:
            raise BadResponse(f"a bad Content-Length: {item[:40]!r}")
        return "length", int(item)
    return "close", None


def parse_chunk_size(untrusted_line: bytes) -> int:
    """The size a chunk-size line (CRLF included) gives; extensions are ignored and dropped.
    RequestRefused("bad-chunk") when it is not one."""
    match = _CHUNK_SIZE.fullmatch(untrusted_line)
    if match is None:
        raise RequestRefused("bad-chunk", f"not a chunk-size line: {untrusted_line[:40]!r}")
    return int(match.group(1), 16)


async def copy_chunked(src: Conn, dst: Conn) -> None:
    """Re-frame a chunked body from `src` to `dst`; trailers are read and dropped."""
    while True:
        size = parse_chunk_size(await src.read_line(MAX_CHUNK_LINE))
        if size == 0:
            trailer_bytes = 0
            while (line := await src.read_line(MAX_CHUNK_LINE)) != b"\r\n":
                trailer_bytes += len(line)
                if trailer_bytes > MAX_TRAILER_BYTES:
                    raise RequestRefused("bad-chunk", "trailers past their budget")
            await dst.send(b"0\r\n\r\n")
            return
        await dst.send(b"%x\r\n" % size)
        await src.copy_to(dst, size)
        if await src.read_exact(2) != b"\r\n":
            raise RequestRefused("bad-chunk", "a chunk not followed by CRLF")
        await dst.send(b"\r\n")


class Forwarded(NamedTuple):
    """How an exchange ended: may the sandbox's connection carry its next request, and may the
    origin's (the whole response read on its framing, nothing more sent, keep-alive)."""

    client_keeps: bool
    upstream_keeps: bool


async def _send_body(request: ProxyRequest, client: Conn, upstream: Conn) -> None:
    framing = request.body_length()
    if framing.kind == "length" and framing.length:
        await client.copy_to(upstream, framing.length)
    elif framing.kind == "chunked":
        await copy_chunked(client, upstream)


async def _relay_response(request: ProxyRequest, upstream: Conn, client: Conn) -> Forwarded:
    """Relay interim answers and the response, and say how it ended."""
    while True:
        head = await upstream.read_head(find_response_head_end)
        if head is None:
            raise BadResponse("the origin closed without answering")
        response = parse_response_head(head, request.method)
        keep_alive = request.keep_alive and response.framing != "close"
        head_out = response.for_client(keep_alive)
        if response.interim:
            await client.send(head_out)
            continue
        length = response.length
        if response.framing == "length" and length and len(upstream.buffer) >= length:
            # A small answer read whole with its head: one send, not two (each send to a
            # local peer costs as much as the rest of the request's Python).
            await client.send(head_out + upstream.buffer[:length])
            del upstream.buffer[:length]
        elif response.framing == "length" and length:
            await client.send(head_out)
            await upstream.copy_to(client, length)
        elif response.framing == "chunked":
            await client.send(head_out)
            await copy_chunked(upstream, client)
        elif response.framing == "close":
            await client.send(head_out)
            await upstream.copy_to(client)
        else:
            await client.send(head_out)
        origin_keeps = response.origin_keeps and request.version == "HTTP/1.1"
        return Forwarded(keep_alive, origin_keeps and not upstream.buffer)


async def forward_http(
    request: ProxyRequest, client: Conn, upstream: Conn, head_sent: bool = False
) -> Forwarded:
    """Send `request` (unless `head_sent`: its head went already) and its body upstream, relay
    the answer; say which connections may carry another request. BadResponse before any
    answer went back means the caller still owes a 502 (`client.sent` tells)."""
    if not head_sent:
        await upstream.send(format_upstream_head(request))
    if request.body_length().kind == "none":  # most requests: no body to move alongside
        return await _relay_response(request, upstream, client)
    relay = asyncio.create_task(_relay_response(request, upstream, client))
    body = asyncio.create_task(_send_body(request, client, upstream))
    try:
        pending: set[asyncio.Task[object]] = {relay, body}
        while not relay.done():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if body in done:
                body.result()  # a bad body ends the exchange: the origin holds half a request
        forwarded = relay.result()
        if not body.done():
            await asyncio.wait({body}, timeout=BODY_SETTLE_S)
        if not body.done():
            # Answered before the whole body came: the rest of it is not a request, on either
            # side (the origin still waits for it).
            return Forwarded(False, False)
        body.result()
        return forwarded
    finally:
        for task in (relay, body):
            task.cancel()
        await asyncio.gather(relay, body, return_exceptions=True)
