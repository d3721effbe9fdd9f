"""What the proxy keeps per sandbox's listener (`Listener`) and per allowed request
(`Exchange`), and a refusal's rule and reason (`Refusal`): shared by the server's coroutine
path (`server`) and its callback path for keep-alive plain http (`fast_exchange`).

Holds state only: deciding is `policy`'s, moving bytes `conn`'s and the two paths'.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from lnk_proxy.conn import Conn
from lnk_proxy.fair_share import Share
from lnk_proxy.handed_close import HandedCloser
from lnk_proxy.head_memo import HeadMemo
from lnk_proxy.hosted_grant import HostedGrant
from lnk_proxy.http_request import ProxyRequest, refusal_response
from lnk_proxy.model_relay import ModelGrant
from lnk_proxy.policy import Allowed, ProxyGrants
from lnk_proxy.policy_memo import PolicyMemo
from lnk_proxy.resolver import AnswerCache, Resolver
from lnk_proxy.service_relay import ServiceGrant
from lnk_proxy.tunnel_buffers import LARGE, TunnelBuffers
from lnk_proxy.upstream_pool import UpstreamPool

__all__ = ["Exchange", "Listener", "Refusal", "SentHead", "send_refusal"]


@dataclass(frozen=True)
class Refusal:
    rule: str
    reason: str


@dataclass(eq=False)
class Listener:
    sandbox: str
    path: Path
    grants: ProxyGrants
    secret: str
    sock: socket.socket
    connections: set[asyncio.Task[None]] = field(default_factory=set)
    background: set[asyncio.Task[None]] = field(default_factory=set)  # accept loop, watcher
    tunnels: int = 0  # reserved when a CONNECT is read, before any await
    lookups: int = 0  # this sandbox's requests waiting for a lookup now
    buffers: int = 0  # tunnels' worst-case kernel buffers reserved (`tunnel_buffers`)
    large_buffers: int = 0  # of which by large tunnels
    resolver: Resolver | None = None  # this sandbox's only (the system one's threads)
    pool: UpstreamPool = field(default_factory=UpstreamPool)  # this sandbox's only
    answers: AnswerCache = field(default_factory=AnswerCache)  # this sandbox's only
    flags: tuple[tuple[str, str, str], ...] = ()  # (path, flag, rule): stop first, then pause
    watch: Conn | None = None  # the listening socket's readiness, for the accept loop
    services: ServiceGrant = field(default_factory=ServiceGrant)  # its rules, their secrets
    models: ModelGrant = field(default_factory=ModelGrant)  # its [[models]] rules
    hosted: HostedGrant = field(default_factory=HostedGrant)  # the hosted ones' providers
    flag_refusal: Refusal | None = None  # its flags as last read, while `flags_known`
    flags_known: bool = False  # read since the watch last said a name of it changed
    share: Share | None = None  # its share of the event loop's turns (`fair_share`)
    heads: HeadMemo = field(default_factory=HeadMemo)  # its parsed heads (`fast_exchange`)
    fast_decided: int = 0  # its requests decided on the callback path (admin `stats`)
    handed: int = 0  # its connections handed over by its relay (`handoff`; admin `stats`)
    closer: HandedCloser = field(default_factory=HandedCloser)  # its handed sockets' closes

    def __post_init__(self) -> None:
        self.memo = PolicyMemo(self.grants)  # this sandbox's only


@dataclass(slots=True)  # not frozen: one per request, and a frozen init sets each field slowly
class Exchange:
    """One allowed request or tunnel, and where its byte counts start (never changed)."""

    listener: Listener
    client: Conn
    request: ProxyRequest
    allowed: Allowed
    target: str  # as the wire's log shows it
    consumed: int  # the client's bytes read before this request's head
    sent: int  # the bytes sent to the client before this answer
    buffers: TunnelBuffers = LARGE  # a tunnel's, reserved from its sandbox's budget


class SentHead(NamedTuple):
    """A plain http request whose head went upstream on the callback path, handed to the
    coroutine path to relay the answer (`plain_exchange.forward`)."""

    upstream: Conn
    reused: bool  # taken from the sandbox's pool, not dialed for this request
    answered_before: int  # `upstream.received` when the head went: what came since is its answer


async def send_refusal(client: Conn, refusal: Refusal, timeout_s: float) -> None:
    """The refusal's one answer (`refusal_response`); a sandbox that left gets nothing."""
    with contextlib.suppress(OSError, TimeoutError):
        client.timeout = timeout_s
        await client.send(refusal_response(refusal.rule))
