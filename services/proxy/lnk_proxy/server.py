"""The proxy's listeners: one unix socket per sandbox, and every connection through it.

Per connection: its first read may be a hand-off (`handoff`: the sandbox's relay sends the
client's own TCP socket, judged, then served in the unix connection's place); then, per
request: read a head (bounded in size by `find_head_end`, in time by
`HEAD_TIMEOUT_S`), parse it, the sandbox's stop and pause flags as they are now (read again
whenever the flags folder's inotify watch says a name of this sandbox changed, and on every
request while there is no watch: `flag_watch`; a flag that cannot be checked counts as set),
`judge_target`, resolve (the system resolver's
answers are kept per sandbox for `ANSWER_CACHE_S`, and judged again on every request),
`judge_addresses`, the kernel's route to the judged address (`route_check`: refused when it is
delivered here or out of a guests' bridge), then reach exactly `Allowed.address`.
A CONNECT becomes a tunnel (`conn.tunnel`) on a connection dialed for it; a plain http request
is forwarded (`forward`) on an idle keep-alive connection of this sandbox's `UpstreamPool` to
that same host, port and judged address, or one dialed for it; its connection may carry the
next request, judged anew. Each refusal is `refusal_response`
(403, the rule id) and one wire-log line with the reason; each allowed exchange one line when
it ends. A request naming a service rule's host goes to `rule_exchange.service_exchange`
(`service_relay`), one naming a model rule's loopback port inside the sandbox to
`model_exchange` (`model_relay`: the relay's CONNECT to that port is answered 200 and its one
request read; the runtime is dialed at the rule's own address only); a hosted kind's
(anthropic, openai) and an `http://` request naming its provider's host go on to
`hosted_exchange` (`hosted_relay`: the body judged, the owner's key added, TLS to the
provider), and a CONNECT to that host is refused.

Fairness: a CONNECT takes one of its sandbox's `max_tunnels_per_sandbox` slots as soon as its
head is read, before any await (lookup, dial), so concurrent CONNECTs cannot pass the cap
together; a request needing a lookup takes one of `MAX_WAITING_LOOKUPS` slots, and each
sandbox has its own resolver (`resolver.SystemResolver`: its own threads, capped), so one
sandbox's dead or slow names never hold another's lookups, the machine view (read on its own
thread) or listener management. At a cap the request gets the 403 with `too-many-tunnels` or
`too-many-lookups` (and its wire line) at once, never a queue. A CONNECT also reserves its
tunnel's fixed kernel buffers from its sandbox's budget (`tunnel_buffers`: large ones for the
first, small ones after, `too-much-buffer` past the budget). A new connection is refused
(`too-many-descriptors`) when the proxy's descriptors are taken and this sandbox already holds
its reserved share of them (`descriptors.may_accept`). A plain http exchange reserves its origin
socket's fixed buffers (`tunnel_buffers.PLAIN`) from the same budget while it runs, a hosted
model exchange its worst case, body included (`hosted_budget`).

Wire state: `<flags_dir>/<sandbox>.stop` refuses every request (`stopped`) and, seen by a
watcher that polls it every `FLAG_POLL_S`, closes every connection of that sandbox, open
tunnels and requests in flight included. `<sandbox>.pause` refuses new requests and tunnels
(`paused`), but tunnels and exchanges already open stay open while paused: a pause is
"nothing new", a stop is "nothing at all".

Trusts: the controller (through `admin`) for the socket path, grants and secret; this
machine's `ip` for its addresses. The listener's socket is mode 0666 (the sandbox runs as
another uid): whoever can reach its path can use that sandbox's grants. Put it in the proxy's
own 0700 folder (`<run_dir>/proxy/...`, made 0700 when missing) and bind it into the sandbox:
on the host only root and the proxy reach it, and no other sandbox may be given its path.

Security limitations: this does NOT
- authenticate requests: the per-sandbox secret is kept (`secret_matches`) for the page-open
  endpoint, which is not built here; the socket's reachability is the only credential;
- look inside tunnels (TLS names, inner Host headers), nor limit bandwidth or time per tunnel;
- log allowed tunnels until they close (see `wire_log`).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import resource
import socket
import ssl
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from lnk_proxy import json_shape, limits, plain_exchange, reservations
from lnk_proxy.config import ProxyConfig
from lnk_proxy.conn import Conn, bind_listener
from lnk_proxy.connections import accept_forever, cancel_all, spawn
from lnk_proxy.decide import Decider
from lnk_proxy.descriptors import usable_limit
from lnk_proxy.fair_share import LoopShares
from lnk_proxy.fast_exchange import FastExchange
from lnk_proxy.hosted_grant import HostedGrant
from lnk_proxy.hosted_relay import upstream_buffers
from lnk_proxy.http_request import ProxyRequest
from lnk_proxy.limits import FLAG_POLL_S, HEAD_TIMEOUT_S, IO_TIMEOUT_S, LISTENER_MODE
from lnk_proxy.listeners import Exchange, Listener, Refusal, SentHead, send_refusal
from lnk_proxy.model_relay import ModelGrant
from lnk_proxy.policy import Allowed, MachineView, ProxyGrants, Target
from lnk_proxy.policy_memo import PolicyMemo
from lnk_proxy.resolver import Resolver, SystemResolver, make_resolver
from lnk_proxy.route_check import RouteChecker
from lnk_proxy.service_relay import ServiceGrant, tls_context
from lnk_proxy.watches import Watches
from lnk_proxy.wire_log import SANDBOX_ID, WireEntry, WireLog

__all__ = ["FLAG_POLL_S", "HEAD_TIMEOUT_S", "IO_TIMEOUT_S", "LISTENER_MODE", "ProxyServer"]

log = logging.getLogger(__name__)


class ProxyServer:
    """Per-sandbox listeners on one event loop. Call `start` first, `close` last.

    Owns the proxy's state and wires its parts: `watches` (this machine, the flags),
    `decider` (the verdicts), `connections` and `one_request` (the coroutine path),
    `fast_exchange` (the callback path), `rule_exchange` and `plain_exchange` (the bytes)."""

    def __init__(
        self, config: ProxyConfig, resolver: Resolver | None = None, *, fast_path: bool = True
    ) -> None:
        """`fast_path`: serve keep-alive plain http by callbacks (`fast_exchange`) where it
        can; False leaves every request to the coroutine path (the tests' other reading)."""
        self.config = config
        # A test box's (config.py warns): nesting counted by a pass per level, as without the
        # C module, so `lnk sandbox check` can show that cost class leak. The process's whole.
        json_shape.count_nesting_per_level(config.unsafe_per_level_nesting)
        head_timeout_s = limits.HEAD_TIMEOUT_S
        self._fast = FastExchange(self, head_timeout_s, IO_TIMEOUT_S) if fast_path else None
        self._shared_resolver = resolver  # a test's; else each sandbox gets its own
        # Descriptors for sandboxes' connections, shared out per sandbox (`descriptors`).
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.descriptor_limit = usable_limit(soft)
        bounds = (config.wire_log_max_bytes, config.wire_box_max_bytes)
        self.wire_log = WireLog(
            config.wire_log_dir, *bounds, unsafe_every_refusal=config.unsafe_log_every_refusal
        )
        # Sizes the wire folder (`wire_log.box_used`): its own thread, never the event loop.
        self._wire_scanner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wire-scan")
        self.wire_log.scanner = self._wire_scanner
        self.routes = None if config.unsafe_skip_route_check else RouteChecker()
        self._listeners: dict[str, Listener] = {}
        self.watches = Watches(config, self.routes, self._listeners)
        self.decider = Decider(self.wire_log, self.watches, self.routes)
        # Service rules' upstreams (`rule_exchange`).
        self.service_tls: ssl.SSLContext = tls_context(config.unsafe_service_ca)
        self.shares = LoopShares()  # each sandbox's steps per turn of the loop (`fair_share`)
        self.hosted_buffers = upstream_buffers()  # read once: the send side's autotuned maximum

    @property
    def machine(self) -> MachineView | None:
        """This machine's view as last read (`watches`); None before `start`."""
        return self.watches.machine

    async def start(self) -> None:
        """Prepare the log folder, read this machine (StateError if it cannot), and read it
        again whenever the kernel says a link, address or route changed."""
        self.wire_log.prepare()
        await self.watches.start()

    async def close(self) -> None:
        for sandbox in list(self._listeners):
            await self.close_listener(sandbox)
        await self.watches.close()
        self._wire_scanner.shutdown(wait=False, cancel_futures=True)
        if self.routes is not None:
            self.routes.close()

    def is_open(self, sandbox: str) -> bool:
        return sandbox in self._listeners

    def secret_matches(self, sandbox: str, candidate: str) -> bool:
        """Whether `candidate` is `sandbox`'s proxy secret (constant-time)."""
        listener = self._listeners.get(sandbox)
        if listener is None:
            return False
        return hmac.compare_digest(listener.secret.encode(), candidate.encode())

    async def open_listener(
        self,
        sandbox: str,
        socket_path: Path,
        grants: ProxyGrants,
        secret: str,
        *,
        services: ServiceGrant | None = None,
        models: ModelGrant | None = None,
    ) -> None:
        """Bind `socket_path` (mode 0666) and serve `sandbox` there with `grants`.
        ValueError for a bad id, an id already open, or a path that is not a fresh socket."""
        self._check_new(sandbox)
        sock = bind_listener(socket_path, LISTENER_MODE)
        self._serve_listener(
            sandbox, socket_path, grants, secret, sock, services=services, models=models
        )

    async def adopt_listener(
        self,
        sandbox: str,
        socket_path: Path,
        grants: ProxyGrants,
        secret: str,
        sock: socket.socket,
        *,
        services: ServiceGrant | None = None,
        models: ModelGrant | None = None,
    ) -> None:
        """Serve `sandbox` on `sock`, a listening socket a previous proxy bound at `socket_path`
        (the controller kept it). ValueError when it is anything else: it is never served."""
        self._check_new(sandbox)
        try:
            listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            bound = sock.getsockname()
        except OSError as exc:
            raise ValueError(f"the socket handed over for {sandbox} is unusable: {exc}") from None
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM or not listening:
            raise ValueError(f"the socket handed over for {sandbox} is not a listening unix socket")
        if bound != str(socket_path):
            raise ValueError(f"the socket handed over for {sandbox} is bound at {bound!r}")
        self._serve_listener(
            sandbox, socket_path, grants, secret, sock, services=services, models=models
        )

    def _check_new(self, sandbox: str) -> None:
        if not SANDBOX_ID.fullmatch(sandbox):
            raise ValueError(f"not a sandbox id: {sandbox!r}")
        if sandbox in self._listeners:
            raise ValueError(f"{sandbox} already has a listener: close it first")

    def _serve_listener(
        self,
        sandbox: str,
        socket_path: Path,
        grants: ProxyGrants,
        secret: str,
        sock: socket.socket,
        *,
        services: ServiceGrant | None,
        models: ModelGrant | None = None,
    ) -> None:
        if self.config.unsafe_ssh_port_by_any_entry:  # a test switch (config.py warns)
            grants = replace(grants, unsafe_listed_only_ports_open=True)
        listener = Listener(sandbox, socket_path, grants, secret, sock)
        listener.share = share = self.shares.share()
        listener.services = services or ServiceGrant()
        listener.models = models or ModelGrant()
        listener.hosted = HostedGrant(listener.models.rules)
        listener.resolver = self._shared_resolver or make_resolver(
            self.config.unsafe_dns_table, kept=self.config.unsafe_dns_table_kept
        )
        if isinstance(listener.resolver, SystemResolver) and self._shared_resolver is None:
            listener.resolver.charge = share.charge  # its lookup threads' CPU is its time too
        listener.flags = tuple(
            (str(self.config.flags_dir / f"{sandbox}.{name}"), name, rule)
            for name, rule in (("stop", "stopped"), ("pause", "paused"))
        )
        self._listeners[sandbox] = listener
        fast = self._fast
        spawn(listener.background, accept_forever(self, listener, self._listeners, fast))
        spawn(listener.background, self.watches.watch_stop(listener, self.wire_log))
        log.info("listener for %s at %s", sandbox, socket_path)

    def listener_fd(self, sandbox: str) -> int:
        """The listening socket's descriptor (to send to the controller, which keeps a copy)."""
        return self._listeners[sandbox].sock.fileno()

    def sandboxes(self) -> list[str]:
        return sorted(self._listeners)

    def fast_decided(self, sandbox: str) -> int:
        """The sandbox's requests decided on the callback path (admin `stats`: tests)."""
        return self._listener_of(sandbox).fast_decided

    def handed(self, sandbox: str) -> int:
        """The sandbox's connections its relay handed over (`handoff`; admin `stats`: tests)."""
        return self._listener_of(sandbox).handed

    def _listener_of(self, sandbox: str) -> Listener:
        listener = self._listeners.get(sandbox)
        if listener is None:
            raise ValueError(f"no listener for sandbox {sandbox}")
        return listener

    def share_stats(self, sandbox: str) -> dict[str, float]:
        """The sandbox's share of the proxy's time in all (admin `stats`: tests, benches)."""
        share = self._listeners[sandbox].share if sandbox in self._listeners else None
        if share is None:
            raise ValueError(f"no listener for sandbox {sandbox}")
        return {"charged_s": share.charged_s, "holds": share.holds, "held_s": share.held_s}

    def set_service_secrets(self, sandbox: str, secrets: dict[str, bytes]) -> None:
        """The secrets' values now (one left out: its rule refuses from the next request)."""
        listener = self._listeners.get(sandbox)
        if listener is None:
            raise ValueError(f"{sandbox} has no listener")
        listener.services.replace_secrets(secrets)

    async def close_listener(self, sandbox: str) -> bool:
        """Close `sandbox`'s listener and every connection in flight; False if none was open."""
        listener = self._listeners.pop(sandbox, None)
        if listener is None:
            return False
        listener.closer.abandon()  # its tasks end now, whatever a handed socket's close does
        await cancel_all(listener)  # first: the accept loop still watches the socket
        listener.pool.close()
        if listener.watch is not None:
            listener.watch.close()  # out of the selector, then closed
        listener.sock.close()
        with contextlib.suppress(FileNotFoundError):
            listener.path.unlink()
        self.wire_log.close(sandbox)  # after the cancelled exchanges wrote their lines
        log.info("listener for %s closed", sandbox)
        return True

    def decide_now(
        self, listener: Listener, request: ProxyRequest, memo: PolicyMemo, port: int
    ) -> Allowed | Refusal | Target:
        """The verdict on the request's host with no await (`Decider.decide_now`)."""
        return self.decider.decide_now(listener, request, memo, port)

    def reserve_plain(self, listener: Listener) -> Refusal | None:
        """A plain http exchange's buffers from the sandbox's budget (`reservations`)."""
        return reservations.reserve_plain(listener, self.config)

    async def forward(self, exchange: Exchange, sent: SentHead | None = None) -> bool:
        """Forward a plain http request whose buffers `reserve_plain` took (`plain_exchange`)."""
        return await plain_exchange.forward(self, exchange, sent)

    async def refuse(
        self, listener: Listener, client: Conn, method: str, target: str, refusal: Refusal
    ) -> None:
        self.log_refusal(listener, method, target, refusal)
        await send_refusal(client, refusal, IO_TIMEOUT_S)

    def log_refusal(self, listener: Listener, method: str, target: str, refusal: Refusal) -> None:
        entry = WireEntry(listener.sandbox, method, target, "refused", refusal.rule)
        self.wire_log.write(replace(entry, reason=refusal.reason))

    def log_allowed(self, exchange: Exchange, error: str) -> None:
        client, allowed = exchange.client, exchange.allowed
        up = client.received - len(client.buffer) - exchange.consumed
        down = client.sent - exchange.sent
        sandbox, method = exchange.listener.sandbox, exchange.request.method
        address, target, rule = str(allowed.address), exchange.target, allowed.rule
        self.wire_log.write(
            WireEntry(
                sandbox, method, target, "allowed", rule, address, up, down, allowed.reason, error
            )
        )
