"""An allowed request's bytes on the coroutine path: a CONNECT's tunnel on a connection dialed
for it (`tunnel_exchange`), a plain http request forwarded (`forward`) on an idle keep-alive
connection of its sandbox's `UpstreamPool` to that same host, port and judged address, or one
dialed for it. Each ends with one wire-log line (the host's `log_allowed`), and a 502 when
nothing reached the sandbox yet.

The decision is made before (`decide`, `one_request`): this dials exactly `Allowed.address`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from lnk_proxy.config import ProxyConfig
from lnk_proxy.conn import Conn, dial, tunnel
from lnk_proxy.forward import BAD_GATEWAY, BadResponse, forward_http
from lnk_proxy.handed_splice import SLOTS as SPLICE_SLOTS
from lnk_proxy.handed_splice import run as splice_run
from lnk_proxy.http_request import ProxyRequest, RequestRefused
from lnk_proxy.limits import IO_TIMEOUT_S
from lnk_proxy.listeners import Exchange, SentHead
from lnk_proxy.policy import Allowed
from lnk_proxy.tunnel_buffers import PLAIN, TunnelBuffers
from lnk_proxy.upstream_pool import PoolKey
from lnk_shared.handed_socket import HandedSocket

__all__ = ["IDEMPOTENT_METHODS", "ExchangeHost", "dial_origin", "forward", "tunnel_exchange"]

# RFC 9110 9.2.2: a request of these may be sent again (a dropped pooled connection)
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


class ExchangeHost(Protocol):
    """What an exchange uses of the server (`server.ProxyServer`)."""

    @property
    def config(self) -> ProxyConfig: ...

    def log_allowed(self, exchange: Exchange, error: str) -> None: ...


async def dial_origin(host: ExchangeHost, allowed: Allowed, buffers: TunnelBuffers = PLAIN) -> Conn:
    """A new origin connection with fixed buffers: a tunnel's, else plain http's."""
    timeout = host.config.connect_timeout_s
    return Conn(await dial(allowed.address, allowed.port, timeout, buffers))


async def _upstream(host: ExchangeHost, exchange: Exchange, key: PoolKey) -> tuple[Conn, bool]:
    """An idle pooled connection to exactly the judged address, else a new one; and
    whether it was reused. OSError or TimeoutError when dialing fails."""
    pooled = exchange.listener.pool.take(key, retryable=_retryable(exchange.request))
    if pooled is not None:
        return pooled, True
    return await dial_origin(host, exchange.allowed), False


async def tunnel_exchange(host: ExchangeHost, exchange: Exchange) -> None:
    client, error, dial_failed = exchange.client, "", False
    try:
        try:
            upstream = await dial_origin(host, exchange.allowed, exchange.buffers)
        except (OSError, TimeoutError) as exc:
            error, dial_failed = f"dial failed: {exc!r}", True
            return
        try:
            await client.send(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            sandbox = exchange.listener.sandbox  # a handed one spliced in a thread, if room
            threads = isinstance(client.sock, HandedSocket) and SPLICE_SLOTS.take(sandbox)
            try:
                await tunnel(client, upstream, exchange.buffers, splice_run if threads else None)
            finally:
                if threads:
                    SPLICE_SLOTS.give(sandbox)
        finally:
            upstream.close()
    except asyncio.CancelledError:
        error = "closed: the sandbox was stopped or its listener closed"
        raise
    except (OSError, EOFError, TimeoutError) as exc:
        error = f"ended: {exc!r}"
    finally:
        host.log_allowed(exchange, error)  # before the 502: a client reading it sees the line
        if dial_failed:
            with contextlib.suppress(OSError, TimeoutError):
                await client.send(BAD_GATEWAY)


async def forward(host: ExchangeHost, exchange: Exchange, sent: SentHead | None = None) -> bool:
    """Forward a plain http request whose buffers `reserve_plain` took (given back here);
    `sent`: its head went already, on that upstream connection (`fast_exchange`)."""
    try:
        return await _forward_reserved(host, exchange, sent)
    finally:
        exchange.listener.buffers -= PLAIN.worst_case()


async def _forward_reserved(host: ExchangeHost, exchange: Exchange, sent: SentHead | None) -> bool:
    client, request, allowed = exchange.client, exchange.request, exchange.allowed
    key: PoolKey = (request.host.lower(), allowed.port, allowed.address)
    client.timeout = IO_TIMEOUT_S
    error, client_keeps = "", False
    try:
        upstream, reused = await _upstream(host, exchange, key) if sent is None else sent[:2]
    except (OSError, TimeoutError) as exc:
        host.log_allowed(exchange, f"dial failed: {exc!r}")
        with contextlib.suppress(OSError, TimeoutError):
            await client.send(BAD_GATEWAY)
        return False
    pooled = False
    try:
        upstream.timeout = IO_TIMEOUT_S
        answered_before = upstream.received if sent is None else sent.answered_before
        try:
            forwarded = await forward_http(request, client, upstream, sent is not None)
        except (OSError, EOFError, BadResponse):
            # A reused connection the origin closed as it was taken: nothing came back and
            # nothing reached the sandbox; a request without a body that may be repeated
            # (RFC 9110 9.2.2, as clients retry) goes again on a new connection.
            retry = reused and upstream.received == answered_before
            if not (retry and client.sent == exchange.sent and _retryable(request)):
                raise
            upstream.close()
            upstream = await dial_origin(host, allowed)
            upstream.timeout = IO_TIMEOUT_S
            forwarded = await forward_http(request, client, upstream)
        client_keeps = forwarded.client_keeps
        if forwarded.upstream_keeps:
            exchange.listener.pool.give(key, upstream)
            pooled = True
    except asyncio.CancelledError:
        error = "closed: the sandbox was stopped or its listener closed"
        raise
    except (OSError, EOFError, TimeoutError, BadResponse, RequestRefused) as exc:
        error = f"ended: {exc!r}"
        if client.sent == exchange.sent:
            with contextlib.suppress(OSError, TimeoutError):
                await client.send(BAD_GATEWAY)
    finally:
        if not pooled:
            upstream.close()
        host.log_allowed(exchange, error)
    return client_keeps


def _retryable(request: ProxyRequest) -> bool:
    """Whether a request may go again on a new connection when a reused one failed before
    any answer: no body, and a method RFC 9110 9.2.2 lets clients repeat."""
    return request.framing.kind == "none" and request.method in IDEMPOTENT_METHODS
