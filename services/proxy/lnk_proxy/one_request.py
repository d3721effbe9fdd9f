"""One request on a sandbox connection's coroutine path, from its head to its exchange: the
head read (bounded in size by `find_head_end`, in time by `HEAD_TIMEOUT_S`) and parsed, then
sent where its host says: a service rule's host, a model rule's port, a hosted provider's host
(its rule only, never a tunnel: `rule_exchange`); else a CONNECT's tunnel slot and buffers
reserved before any await (`reservations`), the verdict (`decide`), and the tunnel or the
plain http exchange (`plain_exchange`). Each refusal is the host's `refuse`: the 403 with its
rule id, and one wire-log line with the reason.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Protocol

from lnk_proxy import limits
from lnk_proxy.conn import Conn
from lnk_proxy.hosted_tunnels import judge_tunnel
from lnk_proxy.http_request import (
    RequestRefused,
    find_head_end,
    parse_request_head,
    shown_target,
)
from lnk_proxy.listeners import Exchange, Listener, Refusal
from lnk_proxy.plain_exchange import ExchangeHost, forward, tunnel_exchange
from lnk_proxy.policy import Allowed
from lnk_proxy.reservations import release_tunnel, reserve_plain, reserve_tunnel
from lnk_proxy.rule_exchange import RuleHost, hosted_exchange, model_exchange, service_exchange
from lnk_proxy.tunnel_buffers import TunnelBuffers

__all__ = ["RequestHost", "one_request"]


class RequestHost(RuleHost, ExchangeHost, Protocol):
    """What a request uses of the server (`server.ProxyServer`): its exchanges' needs."""


async def one_request(host: RequestHost, listener: Listener, client: Conn) -> bool:
    """Serve one request; True when the connection may carry another."""
    client.timeout = None
    consumed = client.received - len(client.buffer)  # this request's bytes start here
    client.deadline = asyncio.get_running_loop().time() + limits.HEAD_TIMEOUT_S  # in total
    try:
        try:
            head = await client.read_head(find_head_end)
        finally:
            client.deadline = None  # before any answer: its send has its own bound
    except TimeoutError:
        if client.buffer:
            await host.refuse(listener, client, "", "", Refusal("head-timeout", "slow"))
        return False
    except RequestRefused as exc:
        await host.refuse(listener, client, "", "", Refusal(exc.rule, exc.reason))
        return False
    if head is None:
        return False
    try:
        request = parse_request_head(head)
    except RequestRefused as exc:
        method, _, rest = head.partition(b" ")
        target = rest.partition(b" ")[0].decode("latin-1")
        refusal = Refusal(exc.rule, exc.reason)
        await host.refuse(listener, client, method.decode("latin-1"), target, refusal)
        return False
    target = shown_target(request)
    if listener.services.rule_for(request) is not None:  # a rule's host: never elsewhere
        return await service_exchange(host, listener, client, request, target, consumed=consumed)
    if listener.models.rule_for(request) is not None:  # a model rule's port in the sandbox
        return await model_exchange(host, listener, client, request, target, consumed=consumed)
    if listener.hosted.rules:  # a hosted provider's host: its rule only, never a tunnel
        try:
            listener.hosted.refuse_connect(request)
        except RequestRefused as exc:
            refusal = Refusal(exc.rule, exc.reason)
            await host.refuse(listener, client, request.method, target, refusal)
            return False
        hosted = listener.hosted.rule_for_host(request.host)
        if hosted is not None:
            return await hosted_exchange(
                host, listener, client, request, target, consumed=consumed, rule=hosted
            )
    buffers: TunnelBuffers | None = None
    if request.kind == "connect":  # reserved now, before any await: no cap is passed
        reserved = reserve_tunnel(listener, host.config)
        if isinstance(reserved, Refusal):
            await host.refuse(listener, client, request.method, target, reserved)
            return False
        buffers = reserved
    try:
        verdict = await host.decider.decide(listener, request)
        if buffers is not None and isinstance(verdict, Allowed):  # no provider by address
            verdict = await judge_tunnel(listener, verdict, host.config)
        if not isinstance(verdict, Allowed):
            await host.refuse(listener, client, request.method, target, verdict)
            return False
        exchange = Exchange(listener, client, request, verdict, target, consumed, client.sent)
        if buffers is not None:
            await tunnel_exchange(host, replace(exchange, buffers=buffers))
            return False
    finally:
        if buffers is not None:
            release_tunnel(listener, buffers)
    refused = reserve_plain(listener, host.config)  # its origin socket's buffers, from the budget
    if refused is not None:
        await host.refuse(listener, client, request.method, target, refused)
        return False
    return await forward(host, exchange)
