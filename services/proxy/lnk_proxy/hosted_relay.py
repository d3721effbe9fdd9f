"""A hosted model rule at work (`[[models]]` kinds `anthropic`, `openai`): the request's body read
whole and judged (`hosted_models.judge_hosted`), the proxy's own serialisation (a proven-plain
conversation in it as the client's bytes) sent to the provider over verified TLS with the
owner's key, and the answer streamed back piece by piece as it arrives (SSE events are never
held for the next one) with the key scrubbed from it and, for OpenAI, its response ids learnt
(`IssuedIds`: only those may be fetched or continued later).

`read_body` takes the body as the client framed it, at most `strict_json.MAX_BODY_BYTES`
(refused before reading when a Content-Length says more); `exchange` makes one request on one
connection (`Connection: close` both ways, never pooled), dialed at the address the policy
vetted with a fixed receive buffer (`tunnel_buffers.hosted_buffers`, set before connect; the send
buffer autotuned, counted by its maximum: `upstream_buffers` reads it once, at the proxy's
start), with SNI and the certificate checked against the rule's host.

Memory: the body is held whole while it is judged, then the proxy's serialisation of it while
it is sent; the caller reserves each exchange's worst case (those, the upstream socket's kernel
buffers and the fixed user-space ones) from the sandbox's buffer budget before the body is read
(`hosted_budget`), so a sandbox's exchanges in flight together hold at most its budget.

Security limitations: this does NOT bound an answer's size or total time (only each read's and
write's idle time), follow redirects, or look at the answer beyond the key and response ids.
A body's parse while it is judged (a few times the body) is charged to no sandbox: the judge
never awaits, so the proxy holds one at a time.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from lnk_proxy.answer_stream import stream_answer
from lnk_proxy.conn import READ_CHUNK, Conn, dial
from lnk_proxy.forward import MAX_CHUNK_LINE, parse_chunk_size
from lnk_proxy.hosted_models import HostedForward, IssuedIds, upstream_head
from lnk_proxy.http_request import ProxyRequest, RequestRefused
from lnk_proxy.service_relay import HTTPS_PORT
from lnk_proxy.strict_json import MAX_BODY_BYTES, BodyRefused
from lnk_proxy.tunnel_buffers import TunnelBuffers, hosted_buffers, tcp_send_max
from lnk_proxy.upstream_tls import UpstreamTls
from lnk_shared.addresses import IPAddress
from lnk_shared.errors import StateError

__all__ = ["TCP_WMEM", "exchange", "read_body", "upstream_buffers"]

TCP_WMEM = Path("/proc/sys/net/ipv4/tcp_wmem")  # the proxy's own network namespace's


def upstream_buffers(tcp_wmem: Path = TCP_WMEM) -> TunnelBuffers:
    """The buffers every hosted exchange's upstream socket is dialed with and reserves by, from
    this kernel's `tcp_wmem` (read once: call it at start). StateError when it cannot be read."""
    try:
        text = tcp_wmem.read_text()
    except OSError as exc:
        raise StateError(
            f"cannot read {tcp_wmem} ({exc.strerror}): the proxy counts a hosted exchange's "
            "send buffer by its maximum; start it where /proc/sys/net is readable"
        ) from exc
    return hosted_buffers(tcp_send_max(text))


async def read_body(request: ProxyRequest, client: Conn) -> bytes | bytearray:
    """The request's body as the client framed it; BodyRefused past MAX_BODY_BYTES."""
    framing = request.framing
    if framing.kind == "length":
        length = framing.length or 0
        if length > MAX_BODY_BYTES:
            raise BodyRefused(f"a body of {length} B past the {MAX_BODY_BYTES} B a model takes")
        return await _take(client, length)
    if framing.kind != "chunked":
        return b""
    parts: list[bytes | bytearray] = []
    total = 0
    while True:
        size = parse_chunk_size(await client.read_line(MAX_CHUNK_LINE))
        if size == 0:
            while await client.read_line(MAX_CHUNK_LINE) != b"\r\n":
                pass  # trailers: read and dropped
            return b"".join(parts)
        total += size
        if total > MAX_BODY_BYTES:
            raise BodyRefused(f"a chunked body past the {MAX_BODY_BYTES} B a model takes")
        parts.append(await _take(client, size))
        if await client.read_exact(2) != b"\r\n":
            raise RequestRefused("bad-chunk", "a chunk not followed by CRLF")


async def _take(client: Conn, count: int) -> bytes | bytearray:
    """`count` bytes of the client's. A large body is read straight into one buffer sized from
    its length, the socket's bytes written there once (gathered in the client's buffer and
    copied out, a 1 MiB body was two fresh MiB of memory, each page faulted in: 0.6 ms of the
    proxy's 1 MiB request, issue 18); its last `READ_CHUNK` bytes or fewer, and a small body,
    through the client's buffer as before, so whatever follows the body stays there."""
    buffered = min(len(client.buffer), count)
    if count - buffered < READ_CHUNK:
        while len(client.buffer) < count:
            if not await client.recv_some():
                raise EOFError("the client's body ended early")
        with memoryview(client.buffer) as view:
            out = bytes(view[:count])
        del client.buffer[:count]
        return out
    body = bytearray(count)
    with memoryview(body) as view:
        with memoryview(client.buffer) as held:
            view[:buffered] = held[:buffered]
        del client.buffer[:buffered]
        got = buffered
        while count - got >= READ_CHUNK:
            received = await client.recv_into(view[got : count - READ_CHUNK // 2])
            if not received:
                raise EOFError("the client's body ended early")
            got += received
        while len(client.buffer) < count - got:
            if not await client.recv_some():
                raise EOFError("the client's body ended early")
        with memoryview(client.buffer) as held:
            view[got:] = held[: count - got]
        del client.buffer[: count - got]
    return body


async def exchange(
    forward: HostedForward,
    host: str,
    secret: bytes,
    *,
    placeholder: str,
    request: ProxyRequest,
    client: Conn,
    address: IPAddress,
    issued: IssuedIds,
    context: ssl.SSLContext,
    connect_timeout_s: float,
    io_timeout_s: float,
    buffers: TunnelBuffers,
    port: int = HTTPS_PORT,
) -> None:
    """One exchange with the provider at the vetted `address`; the answer, scrubbed, goes to
    `client` close-delimited. OSError, TimeoutError, ssl.SSLError or BadResponse when it
    cannot be completed (their texts never hold the key: the caller scrubs its log line)."""
    sock = await dial(address, port, connect_timeout_s, buffers)  # what was reserved
    upstream = await UpstreamTls.open(sock, context, host, connect_timeout_s)
    upstream.conn.timeout = io_timeout_s  # each wait's idle bound, reads and writes alike
    try:
        # Two pieces, not one joined copy of a body of up to MAX_BODY_BYTES: each is
        # encrypted from where it lies.
        await upstream.write(upstream_head(forward, host, secret), forward.body)
        observe = issued.reader() if forward.kind == "openai" else None
        scrubbing = (secret, placeholder.encode())
        await stream_answer(request, upstream, client, scrubbing, None, observe=observe)
    finally:
        upstream.close()
