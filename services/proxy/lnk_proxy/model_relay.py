"""A sandbox's local model rules at work: which requests are a model rule's, the judged request
read whole from the sandbox, and the one exchange with the runtime.

A request is a model rule's when it names the sandbox's loopback (`localhost`, `127.0.0.1`,
`::1`) on a rule's port inside the sandbox (`ModelGrant.rule_for`): either the relay's
`CONNECT localhost:PORT` for a connection a program made to that port (the proxy answers 200,
then reads one origin-form request from it: `read_tunneled_head`), or an absolute-form
`http://127.0.0.1:PORT/...` a program sent through `HTTP_PROXY`. Both are judged the same:
`model_routes.judge_model_route`, then the body read whole (bounded by
`model_bodies.MAX_MODEL_BODY_BYTES`, before anything is dialed) and judged and re-serialised by
`model_bodies.judge_model_body`. Only then is the runtime dialed: on this machine at the rule's
loopback address and port only (the one exception to "never this machine", by this rule),
elsewhere at the address the policy vetted for the rule's host as a `[lan]` grant of exactly it
(a private address only). One request per connection: `Connection: close` both ways; the answer
is streamed back as each read brings it (`answer_stream`: NDJSON and SSE never held for the
next chunk), close-delimited, with the rule's key (vllm, openai-compatible) scrubbed from it; a
model listing's answer is read whole and cut to the rule's models first (`model_listings`: a
502 when it cannot be read).

Security limitations: this does NOT serve the hosted kinds (anthropic, openai: TLS upstream, the
key forced, server tools removed; `hosted_models`), bound an answer's size or total time (each
read's and write's idle time only), nor stop whatever else reaches the runtime's port on this
machine (a `[localhost]` grant of it, another user) from using its whole API.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Sequence

from lnk_proxy.admin_rules import parse_rules
from lnk_proxy.answer_stream import stream_answer
from lnk_proxy.conn import Conn, dial
from lnk_proxy.forward import (
    MAX_CHUNK_LINE,
    MAX_RESPONSE_HEAD_BYTES,
    BadResponse,
    ResponseHead,
    parse_chunk_size,
    parse_response_head,
)
from lnk_proxy.http_request import (
    ProxyRequest,
    RequestRefused,
    find_head_end,
    parse_request_head,
)
from lnk_proxy.model_bodies import MAX_MODEL_BODY_BYTES, judge_model_body
from lnk_proxy.model_listings import (
    MAX_LISTING_BYTES,
    ListingUnreadable,
    filter_listing,
    is_listing,
)
from lnk_proxy.model_routes import (
    ModelRoute,
    judge_model_route,
    model_upstream_head,
    origin_form_as_proxy_head,
)
from lnk_proxy.policy import LOCALHOST_FORMS, ProxyGrants
from lnk_proxy.policy_memo import PolicyMemo
from lnk_proxy.services import SecretScrubber
from lnk_shared.addresses import IPAddress
from lnk_shared.spec import Origin, SpecBuilder
from lnk_shared.spec_models import ModelRule, parse_model_table

__all__ = [
    "ModelGrant",
    "ModelRequest",
    "judge_model_request",
    "loopback_address",
    "parse_models",
    "read_body",
    "read_tunneled_head",
    "relay_model",
]

READ_SIZE = 64 * 1024  # one read of the answer's body
CONNECT_OK = b"HTTP/1.1 200 Connection Established\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"  # the proxy reads the body itself, to judge it


class ModelGrant:
    """One sandbox's model rules; the LAN upstreams judged as `[lan]` grants of exactly them."""

    def __init__(self, rules: Sequence[ModelRule] = ()) -> None:
        self.rules = tuple(rules)
        builder = SpecBuilder(source="admin")
        for rule in self.rules:
            if rule.local and not rule.on_this_machine:  # hosted ones: `hosted_grant`
                builder.add_lan(rule.host, Origin("admin", "models.upstream"))
        self.memo = PolicyMemo(ProxyGrants(lan=builder.build().lan))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ModelGrant):
            return NotImplemented
        return self.rules == other.rules

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ModelGrant(rules={len(self.rules)})"

    def rule_for(self, request: ProxyRequest) -> ModelRule | None:
        """The rule served on the sandbox's loopback port the request names, or None."""
        if not self.rules or LOCALHOST_FORMS.get(request.host.lower().rstrip(".")) is None:
            return None
        return next((r for r in self.rules if r.port == request.port), None)


class ModelRequest:
    """A judged model request: its route, the body to forward, and how to log it."""

    def __init__(self, rule: ModelRule, route: ModelRoute, body: bytes | None) -> None:
        self.rule, self.route, self.body = rule, route, body

    @property
    def shown(self) -> str:
        return f"{self.rule.upstream}{self.route.path}"


def parse_models(untrusted: object) -> tuple[ModelRule, ...]:
    """The rules of an admin command, each read by the spec model's own rules."""
    return parse_rules(
        untrusted, "models", parse_model_table, lambda r: r.port, "two rules on one port"
    )


async def read_tunneled_head(client: Conn, port: int, timeout_s: float) -> ProxyRequest | None:
    """After the relay's CONNECT to a model port: the one origin-form request on it, parsed as
    the proxy parses any (None: the program closed without one). RequestRefused if malformed."""
    async with asyncio.timeout(timeout_s):
        head = await client.read_head(find_head_end)
    if head is None:
        return None
    return parse_request_head(origin_form_as_proxy_head(head, port))


async def read_body(request: ProxyRequest, client: Conn) -> bytes:
    """The request's whole body as framed, at most MAX_MODEL_BODY_BYTES (RequestRefused past).
    A client waiting on `Expect: 100-continue` (curl, past 1 KiB) is told to go on first."""
    framing = request.framing
    expects = any(v.strip().lower() == "100-continue" for v in request.header_values("expect"))
    fits = framing.kind == "chunked" or (framing.length or 0) <= MAX_MODEL_BODY_BYTES
    if framing.kind != "none" and expects and fits:
        await client.send(CONTINUE)
    if framing.kind == "length" and framing.length:
        if framing.length > MAX_MODEL_BODY_BYTES:
            raise RequestRefused("model-body", f"a body over {MAX_MODEL_BODY_BYTES} bytes")
        return await client.read_exact(framing.length)
    if framing.kind != "chunked":
        return b""
    parts: list[bytes] = []
    total = 0
    while True:
        size = parse_chunk_size(await client.read_line(MAX_CHUNK_LINE))
        if size == 0:
            while await client.read_line(MAX_CHUNK_LINE) != b"\r\n":
                pass  # trailers: read and dropped
            return b"".join(parts)
        total += size
        if total > MAX_MODEL_BODY_BYTES:
            raise RequestRefused("model-body", f"a body over {MAX_MODEL_BODY_BYTES} bytes")
        parts.append(await client.read_exact(size))
        if await client.read_exact(2) != b"\r\n":
            raise RequestRefused("bad-chunk", "a chunk not followed by CRLF")


async def judge_model_request(
    rule: ModelRule,
    request: ProxyRequest,
    client: Conn,
    *,
    check_route: bool = True,
    bounded: bool = True,
) -> ModelRequest:
    """The route (judged before a byte of the body is read), the body read whole, judged and
    re-serialised; RequestRefused naming why not (`model_routes`, `model_bodies`; `bounded`:
    `model_bodies.parse_strict_json`)."""
    path = request.path
    route = judge_model_route(rule, request.method, path, check_route=check_route)
    body = await read_body(request, client)
    return ModelRequest(rule, route, judge_model_body(rule, route, body, bounded=bounded))


def loopback_address(rule: ModelRule) -> IPAddress:
    """The runtime's address on this machine (a rule whose upstream is its loopback)."""
    return ipaddress.ip_address(rule.host)


async def relay_model(
    judged: ModelRequest,
    request: ProxyRequest,
    client: Conn,
    address: IPAddress,
    secret: bytes | None,
    *,
    connect_timeout_s: float,
    io_timeout_s: float,
    cut_listings: bool = True,
) -> None:
    """The exchange with the runtime at `address`; the answer goes to `client` as it comes,
    close-delimited. OSError, TimeoutError or BadResponse when it cannot be completed.
    `cut_listings=False` (the proxy's `unsafe_uncut_model_listings`, tests only) passes a
    listing on as it came, so `lnk sandbox check` can show that class leak."""
    rule = judged.rule
    sock = await dial(address, rule.upstream_port, connect_timeout_s)
    try:
        reader, writer = await asyncio.open_connection(sock=sock, limit=MAX_RESPONSE_HEAD_BYTES)
    except BaseException:
        sock.close()
        raise
    try:
        body = judged.body
        head = model_upstream_head(
            rule,
            judged.route,
            request.headers,
            version=request.version,
            body_length=None if body is None else len(body),
            secret=secret,
        )
        writer.write(head + (body or b""))
        async with asyncio.timeout(io_timeout_s):
            await writer.drain()
        cut = cut_listings and is_listing(rule, judged.route)
        listing = (rule, judged.route.path) if cut else None
        await _answer(request, reader, client, secret, io_timeout_s, listing=listing)
    finally:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), io_timeout_s)


async def _answer(
    request: ProxyRequest,
    reader: asyncio.StreamReader,
    client: Conn,
    secret: bytes | None,
    io_timeout_s: float,
    *,
    listing: tuple[ModelRule, str] | None = None,
) -> None:
    """The answer's head (interim ones too), then its body on its framing as each read brings
    it (`answer_stream.stream_answer`: the head and the first chunk in one send, no await per
    chunk line); a listing's (`listing`: the rule to cut it to, its path) read whole and cut
    before its head goes."""
    replacement = b"<secret>"
    if listing is None:
        scrubbing = (secret, replacement) if secret else None
        await stream_answer(request, reader, client, scrubbing, io_timeout_s)
        return
    while True:
        async with asyncio.timeout(io_timeout_s):
            try:
                raw = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                raise BadResponse("the runtime closed without answering") from None
            except asyncio.LimitOverrunError:
                raise BadResponse("an answer's head past its limit") from None
        response = parse_response_head(raw, request.method)
        if not response.interim:
            break
        await client.send(b"\r\n".join(response.head_lines) + b"\r\n\r\n")
    kept = [
        line
        for line in response.head_lines
        if not line.lower().startswith((b"content-length:", b"transfer-encoding:"))
    ]
    head = b"\r\n".join((*kept, b"Connection: close")) + b"\r\n\r\n"
    scrubber = SecretScrubber(secret, replacement) if secret else None
    if scrubber is not None:
        head = head.replace(secret or b"", replacement)
    # Cut first: nothing of the runtime's list goes unfiltered.
    whole = filter_listing(
        *listing, await _listing_body(response, reader, io_timeout_s, listing[1])
    )
    if scrubber is not None:
        whole = scrubber.feed(whole) + scrubber.flush()
    await client.send(head + whole)
    client.shutdown_write()


async def _listing_body(
    response: ResponseHead, reader: asyncio.StreamReader, io_timeout_s: float, path: str
) -> bytes:
    """A listing's whole body (at most MAX_LISTING_BYTES), plain: ListingUnreadable if not."""
    if any(line.lower().startswith(b"content-encoding:") for line in response.head_lines):
        raise ListingUnreadable(f"{path}: a compressed listing (the proxy cuts plain JSON only)")
    parts: list[bytes] = []
    size = 0
    async with asyncio.timeout(io_timeout_s):  # a listing is small: one bound for all of it
        while True:
            if response.framing == "length":
                if size >= (response.length or 0):
                    break
                data = await reader.read(min((response.length or 0) - size, READ_SIZE))
            elif response.framing == "chunked":
                chunk = parse_chunk_size(await reader.readuntil(b"\r\n"))
                if chunk == 0:
                    break
                data = await reader.readexactly(min(chunk, MAX_LISTING_BYTES + 1))
                if len(data) == chunk and await reader.readexactly(2) != b"\r\n":
                    raise BadResponse("a chunk not followed by CRLF")
            else:
                data = await reader.read(READ_SIZE)
            if not data:
                if response.framing == "length":
                    raise BadResponse("the runtime's answer ended early")
                break
            size += len(data)
            if size > MAX_LISTING_BYTES:
                raise ListingUnreadable(f"{path}: a listing past {MAX_LISTING_BYTES} bytes")
            parts.append(data)
    return b"".join(parts)
