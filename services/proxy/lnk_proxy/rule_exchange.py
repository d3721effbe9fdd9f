"""A request to a rule's host or port, from its judgement to its wire line: a service rule's
host (`service_exchange`: `service_relay`, the secret added, TLS upstream at the vetted
address), a model rule's loopback port inside the sandbox (`model_exchange`: `model_relay`,
the relay's CONNECT answered 200 and its one request read; the runtime dialed at the rule's own
address only), a hosted kind's (anthropic, openai) or an `http://` request naming its
provider's host (`hosted_exchange`: `hosted_relay`, the body judged, the owner's key added, TLS
to the provider). Each connection ends with its answer.

Judging is the relays' and `decide`'s; this orders the checks, answers each refusal through the
host's `refuse` and writes the allowed exchange's one line (`log_allowed`), its secret scrubbed:
the three end alike, in `_relayed` (the relay's errors, the 502, the line).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Coroutine
from dataclasses import replace
from typing import Protocol

from lnk_proxy import hosted_budget, limits, service_relay
from lnk_proxy.config import ProxyConfig
from lnk_proxy.conn import Conn
from lnk_proxy.decide import Decider
from lnk_proxy.forward import BAD_GATEWAY, BadResponse
from lnk_proxy.hosted_grant import hosted_placeholder
from lnk_proxy.hosted_models import judge_hosted
from lnk_proxy.hosted_relay import exchange as exchange_hosted
from lnk_proxy.hosted_relay import read_body
from lnk_proxy.http_request import ProxyRequest, RequestRefused, shown_target
from lnk_proxy.limits import IO_TIMEOUT_S
from lnk_proxy.listeners import Exchange, Listener, Refusal
from lnk_proxy.model_relay import CONNECT_OK, judge_model_request, read_tunneled_head, relay_model
from lnk_proxy.policy import Allowed
from lnk_proxy.service_relay import relay, scrub_text
from lnk_proxy.tunnel_buffers import TunnelBuffers
from lnk_shared.spec_models import ModelRule

__all__ = ["RuleHost", "hosted_exchange", "model_exchange", "service_exchange"]

# How a relay says it could not complete its exchange (the TLS ones' certificate and handshake
# failures too): 502 while nothing of the answer has gone, and the wire line says which.
RELAY_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    EOFError,
    TimeoutError,
    BadResponse,
    RequestRefused,
)
TLS_RELAY_ERRORS = (*RELAY_ERRORS, ssl.SSLError)


class RuleHost(Protocol):
    """What a rule's exchange uses of the server (`server.ProxyServer`)."""

    @property
    def config(self) -> ProxyConfig: ...

    @property
    def decider(self) -> Decider: ...

    @property
    def service_tls(self) -> ssl.SSLContext: ...

    @property
    def hosted_buffers(self) -> TunnelBuffers: ...

    async def refuse(
        self, listener: Listener, client: Conn, method: str, target: str, refusal: Refusal
    ) -> None: ...

    def log_allowed(self, exchange: Exchange, error: str) -> None: ...


async def service_exchange(
    host: RuleHost,
    listener: Listener,
    client: Conn,
    request: ProxyRequest,
    target: str,
    *,
    consumed: int,
) -> bool:
    """A request to a service rule's host (`service_relay`): judged, the secret added,
    TLS upstream at the vetted address; the connection ends with the answer."""
    grant = listener.services
    rule = grant.rule_for(request)
    assert rule is not None  # the caller's check
    try:
        check = not host.config.unsafe_skip_service_method_check
        forward, secret = grant.judge(rule, request, check_route=check)
    except RequestRefused as exc:
        await host.refuse(listener, client, request.method, target, Refusal(exc.rule, exc.reason))
        return False
    verdict = await host.decider.decide(listener, request, grant.memo, service_relay.HTTPS_PORT)
    if not isinstance(verdict, Allowed):
        await host.refuse(listener, client, request.method, target, verdict)
        return False
    shown = f"http://{rule.host}{forward.logged_path}"  # the placeholder, never the secret
    exchange = Exchange(listener, client, request, verdict, shown, consumed, client.sent)
    client.timeout = IO_TIMEOUT_S
    relaying = relay(
        forward,
        secret,
        request,
        client,
        verdict.address,
        context=host.service_tls,
        connect_timeout_s=host.config.connect_timeout_s,
        io_timeout_s=IO_TIMEOUT_S,
    )
    return await _relayed(host, exchange, relaying, secret, TLS_RELAY_ERRORS)


async def model_exchange(
    host: RuleHost,
    listener: Listener,
    client: Conn,
    request: ProxyRequest,
    target: str,
    *,
    consumed: int,
) -> bool:
    """A request to a model rule's port (`model_relay`): the relay's CONNECT answered and
    its one request read, judged (route, then body), then the runtime dialed at the rule's
    own address; the connection ends with the answer."""
    rule = listener.models.rule_for(request)
    assert rule is not None  # the caller's check
    if request.kind == "connect":
        gate = host.decider.gate(listener)
        if gate is not None:
            await host.refuse(listener, client, request.method, target, gate)
            return False
        await client.send(CONNECT_OK)
        try:
            tunneled = await read_tunneled_head(client, rule.port, limits.HEAD_TIMEOUT_S)
        except TimeoutError:
            return False
        except RequestRefused as exc:
            await host.refuse(listener, client, "", target, Refusal(exc.rule, exc.reason))
            return False
        if tunneled is None:
            return False
        consumed = client.received - len(client.buffer)
        request, target = tunneled, shown_target(tunneled)
    if not rule.local:  # anthropic, openai: the provider over TLS, the key forced
        return await hosted_exchange(
            host, listener, client, request, target, consumed=consumed, rule=rule
        )
    try:
        check = not host.config.unsafe_skip_model_route_check
        bounded = not host.config.unsafe_unbounded_model_bodies
        judged = await judge_model_request(
            rule, request, client, check_route=check, bounded=bounded
        )
    except RequestRefused as exc:
        await host.refuse(listener, client, request.method, target, Refusal(exc.rule, exc.reason))
        return False
    secret = listener.services.secret(rule.secret) if rule.secret else None
    if rule.secret and secret is None:
        await host.refuse(listener, client, request.method, target, _secret_gone(rule.secret))
        return False
    verdict = await host.decider.decide_model(listener, request, rule)
    if not isinstance(verdict, Allowed):
        await host.refuse(listener, client, request.method, target, verdict)
        return False
    exchange = Exchange(listener, client, request, verdict, target, consumed, client.sent)
    client.timeout = IO_TIMEOUT_S
    relaying = relay_model(
        judged,
        request,
        client,
        verdict.address,
        secret,
        connect_timeout_s=host.config.connect_timeout_s,
        io_timeout_s=IO_TIMEOUT_S,
        cut_listings=not host.config.unsafe_uncut_model_listings,
    )
    return await _relayed(host, exchange, relaying, secret, RELAY_ERRORS)


def _secret_gone(name: str | None) -> Refusal:
    """A model rule's refusal once its secret is gone (`lnk secret rm` after the launch)."""
    return Refusal("model-secret-gone", f"the secret {name} is not set: `lnk secret set {name}`")


async def hosted_exchange(
    host: RuleHost,
    listener: Listener,
    client: Conn,
    request: ProxyRequest,
    target: str,
    *,
    consumed: int,
    rule: ModelRule,
) -> bool:
    """A request to a hosted model rule: its worst case reserved from the sandbox's buffer
    budget before any await (`hosted_budget`), given back however it ends."""
    config = host.config  # the budget its tunnels and plain http exchanges share
    budget, unbounded = config.tunnel_buffer_budget_bytes, config.unsafe_unbounded_tunnels
    held = hosted_budget.reserve(listener, request, budget, host.hosted_buffers, unbounded)
    if isinstance(held, Refusal):
        await host.refuse(listener, client, request.method, target, held)
        return False
    try:
        return await _hosted_reserved(
            host, listener, client, request, target, consumed=consumed, rule=rule, held=held
        )
    finally:
        held.release()


async def _hosted_reserved(
    host: RuleHost,
    listener: Listener,
    client: Conn,
    request: ProxyRequest,
    target: str,
    *,
    consumed: int,
    rule: ModelRule,
    held: hosted_budget.HostedReservation,
) -> bool:
    """A request to a hosted model rule (`hosted_relay`): its body read whole and judged,
    the proxy's serialisation sent to the provider with the owner's key over TLS at the
    vetted address; the answer streamed back; the connection ends with it."""
    hosted = listener.hosted
    placeholder = hosted_placeholder(rule)
    try:
        untrusted = await read_body(request, client)
        forward = judge_hosted(
            rule.kind,
            placeholder,
            rule.allows_model,
            method=request.method,
            target=request.path,
            headers=request.headers,
            untrusted_body=untrusted,
            issued=hosted.issued(rule),
            keep_tools=host.config.unsafe_keep_server_tools,
            bounded=not host.config.unsafe_unbounded_model_bodies,
            naive_screen=host.config.unsafe_naive_content_screen,
        )
    except RequestRefused as exc:
        await host.refuse(listener, client, request.method, target, Refusal(exc.rule, exc.reason))
        return False
    del untrusted  # the serialisation alone is held from here: the reservation follows it
    grown = held.settle(len(forward.body))
    if grown is not None:
        await host.refuse(listener, client, request.method, target, grown)
        return False
    secret = listener.services.secret(rule.secret) if rule.secret else None
    if secret is None:
        await host.refuse(listener, client, request.method, target, _secret_gone(rule.secret))
        return False
    upstream = replace(request, host=rule.host)
    verdict = await host.decider.decide(listener, upstream, hosted.memo, rule.upstream_port)
    if not isinstance(verdict, Allowed):
        await host.refuse(listener, client, request.method, target, verdict)
        return False
    why = "; ".join(forward.removed)
    shown = replace(verdict, reason=f"{verdict.reason}; {why}" if why else verdict.reason)
    exchange = Exchange(listener, client, request, shown, target, consumed, client.sent)
    client.timeout = IO_TIMEOUT_S
    relaying = exchange_hosted(
        forward,
        rule.host,
        secret,
        placeholder=placeholder,
        request=request,
        client=client,
        address=verdict.address,
        issued=hosted.issued(rule),
        context=host.service_tls,
        connect_timeout_s=host.config.connect_timeout_s,
        io_timeout_s=IO_TIMEOUT_S,
        buffers=host.hosted_buffers,
        port=rule.upstream_port,
    )
    return await _relayed(host, exchange, relaying, secret, TLS_RELAY_ERRORS)


async def _relayed(
    host: RuleHost,
    exchange: Exchange,
    relaying: Coroutine[None, None, None],
    secret: bytes | None,
    errors: tuple[type[BaseException], ...],
) -> bool:
    """The allowed exchange's relay run to its end, and its one wire line: `errors` (the ways
    the relay says it could not complete) answer 502 while nothing of the answer has reached
    the sandbox, their text scrubbed of `secret` in the line; a cancel (the sandbox stopped,
    its listener closed) is logged as that and goes on up; anything else goes on up, logged
    with no error. The connection ends with it (False: never kept)."""
    client = exchange.client
    error = ""
    try:
        await relaying
    except asyncio.CancelledError:
        error = "closed: the sandbox was stopped or its listener closed"
        raise
    except errors as exc:
        error = f"ended: {exc!r}" if secret is None else scrub_text(f"ended: {exc!r}", secret)
        if client.sent == exchange.sent:
            with contextlib.suppress(OSError, TimeoutError):
                await client.send(BAD_GATEWAY)
    finally:
        host.log_allowed(exchange, error)
    return False
