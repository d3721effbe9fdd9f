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
it ends. A request naming a service rule's host goes to `_service` (`service_relay`), one naming
a model rule's loopback port inside the sandbox to `_model` (`model_relay`: the relay's CONNECT
to that port is answered 200 and its one request read; the runtime is dialed at the rule's own
address only); a hosted kind's (anthropic, openai) and an `http://` request naming its
provider's host go on to `_hosted` (`hosted_relay`: the body judged, the owner's key added, TLS
to the provider), and a CONNECT to that host is refused.

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

import asyncio
import contextlib
import hmac
import logging
import os
import resource
import select
import socket
import ssl
import stat
from collections.abc import Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from lnk_proxy import hosted_budget, json_shape, machine, service_relay
from lnk_proxy.config import ProxyConfig
from lnk_proxy.conn import Conn, bind_listener, dial, tunnel
from lnk_proxy.descriptors import may_accept, usable_limit
from lnk_proxy.fair_share import CURRENT, LoopShares
from lnk_proxy.fast_exchange import FastExchange
from lnk_proxy.flag_watch import EVERYTHING, FlagWatch
from lnk_proxy.forward import BAD_GATEWAY, BadResponse, forward_http
from lnk_proxy.handed_close import close_conn
from lnk_proxy.handed_splice import SLOTS as SPLICE_SLOTS
from lnk_proxy.handed_splice import run as splice_run
from lnk_proxy.handoff import first_read, take_handed
from lnk_proxy.hosted_grant import HostedGrant, hosted_placeholder
from lnk_proxy.hosted_models import judge_hosted
from lnk_proxy.hosted_relay import exchange as exchange_hosted
from lnk_proxy.hosted_relay import read_body, upstream_buffers
from lnk_proxy.hosted_tunnels import judge_tunnel
from lnk_proxy.http_request import (
    ProxyRequest,
    RequestRefused,
    find_head_end,
    parse_request_head,
    refusal_response,
    shown_target,
)
from lnk_proxy.listeners import Exchange, Listener, Refusal, SentHead, send_refusal
from lnk_proxy.machine_watch import MachineWatch
from lnk_proxy.model_relay import (
    CONNECT_OK,
    ModelGrant,
    judge_model_request,
    loopback_address,
    read_tunneled_head,
    relay_model,
)
from lnk_proxy.policy import (
    Allowed,
    MachineView,
    ProxyGrants,
    Refused,
    Rule,
    Target,
    judge_localhost,
)
from lnk_proxy.policy_memo import PolicyMemo
from lnk_proxy.resolver import Resolver, ResolverBusy, SystemResolver, make_resolver
from lnk_proxy.route_check import RouteChecker
from lnk_proxy.service_relay import ServiceGrant, relay, scrub_text, tls_context
from lnk_proxy.tunnel_buffers import LARGE, PLAIN, SMALL, TunnelBuffers, buffers_for
from lnk_proxy.upstream_pool import PoolKey
from lnk_proxy.wire_log import SANDBOX_ID, WireEntry, WireLog
from lnk_shared.addresses import IPAddress
from lnk_shared.errors import StateError
from lnk_shared.handed_socket import HandedSocket
from lnk_shared.spec_models import ModelRule

__all__ = ["FLAG_POLL_S", "HEAD_TIMEOUT_S", "IO_TIMEOUT_S", "LISTENER_MODE", "ProxyServer"]

log = logging.getLogger(__name__)

LISTENER_MODE = 0o666  # the sandbox's uid is not the proxy's; the path itself is the guard
HEAD_TIMEOUT_S = 60.0  # idle keep-alive plus one head: a slow client frees its slot by then
IO_TIMEOUT_S = 300.0  # idle bound on each read or write of a plain http exchange (long polls)
FLAG_POLL_S = 0.5  # how late a stop may close a sandbox's tunnels
# RFC 9110 9.2.2: a request of these may be sent again (a dropped pooled connection)
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# Requests of one sandbox waiting for a lookup at once (many may share one name's lookup):
# a page load asks for a few dozen; past this a sandbox is refused, never queued.
MAX_WAITING_LOOKUPS = 256
ACCEPT_RETRY_S = 0.1  # after an accept error (out of descriptors), let connections close
# Connections accepted from one listener before its next wake-up (a step of its share of the
# loop, `fair_share`): a sandbox's burst of connects waits in its own backlog, not in the loop.
ACCEPT_PER_WAKE = 8


class ProxyServer:
    """Per-sandbox listeners on one event loop. Call `start` first, `close` last."""

    def __init__(
        self, config: ProxyConfig, resolver: Resolver | None = None, *, fast_path: bool = True
    ) -> None:
        """`fast_path`: serve keep-alive plain http by callbacks (`fast_exchange`) where it
        can; False leaves every request to the coroutine path (the tests' other reading)."""
        self.config = config
        # A test box's (config.py warns): nesting counted by a pass per level, as without the
        # C module, so `lnk sandbox check` can show that cost class leak. The process's whole.
        json_shape.count_nesting_per_level(config.unsafe_per_level_nesting)
        self._fast = FastExchange(self, HEAD_TIMEOUT_S, IO_TIMEOUT_S) if fast_path else None
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
        self.machine: MachineView | None = None
        self.routes = None if config.unsafe_skip_route_check else RouteChecker()
        self._listeners: dict[str, Listener] = {}
        self._watch: MachineWatch | None = None
        self._flag_watch: FlagWatch | None = None
        self._events = select.poll()  # the two watches: one poll, with no wait, per decision
        self._stale = False
        self._refresher: asyncio.Task[None] | None = None
        # Reads the machine view: its own thread, never behind sandboxes' lookups.
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="machine-view")
        self.service_tls = tls_context(config.unsafe_service_ca)  # service rules' upstreams
        self.shares = LoopShares()  # each sandbox's steps per turn of the loop (`fair_share`)
        self.hosted_buffers = upstream_buffers()  # read once: the send side's autotuned maximum

    async def start(self) -> None:
        """Prepare the log folder, read this machine (StateError if it cannot), and read it
        again whenever the kernel says a link, address or route changed."""
        self.wire_log.prepare()
        self._watch = MachineWatch()
        await self.refresh_machine(fatal=True)
        loop = asyncio.get_running_loop()
        loop.add_reader(self._watch.fileno(), self._machine_changed)
        self._events.register(self._watch.fileno(), select.POLLIN)
        try:
            self._flag_watch = FlagWatch(self.config.flags_dir)
        except StateError as exc:
            log.warning("%s", exc)
        else:
            self._flag_watch.arm()
            loop.add_reader(self._flag_watch.fileno(), self._flags_changed)
            self._events.register(self._flag_watch.fileno(), select.POLLIN)

    async def close(self) -> None:
        for sandbox in list(self._listeners):
            await self.close_listener(sandbox)
        if self._watch is not None:
            asyncio.get_running_loop().remove_reader(self._watch.fileno())
            self._events.unregister(self._watch.fileno())
            self._watch.close()
            self._watch = None
        if self._flag_watch is not None:
            asyncio.get_running_loop().remove_reader(self._flag_watch.fileno())
            self._events.unregister(self._flag_watch.fileno())
            self._flag_watch.close()
            self._flag_watch = None
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
        self._reader.shutdown(wait=False, cancel_futures=True)
        self._wire_scanner.shutdown(wait=False, cancel_futures=True)
        if self.routes is not None:
            self.routes.close()

    async def refresh_machine(self, *, fatal: bool = False) -> None:
        """Read the view on the proxy's own thread: never queued behind sandboxes' lookups."""
        try:
            networks = self.config.public_networks
            loop = asyncio.get_running_loop()
            self.machine = await loop.run_in_executor(
                self._reader, machine.read_machine_view, networks
            )
        except Exception:
            if fatal or self.machine is None:
                raise
            log.exception("reading this machine's addresses failed; the previous view is kept")

    def _machine_changed(self) -> None:
        if self._watch is None:
            return
        try:
            changed = self._watch.drain()
        except OSError:
            log.exception("reading netlink change messages failed; reading the view again")
            changed = True
        if not changed:
            return
        if self.routes is not None:
            self.routes.invalidate()
        self._stale = True
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.create_task(self._refresh_while_stale())

    def _flags_changed(self) -> None:
        """The flags watch said something: forget the flags of the sandboxes it names (of all,
        when it cannot say), so their next decision reads them again."""
        if self._flag_watch is None:
            return
        try:
            changed = self._flag_watch.drain()
        except OSError:
            log.exception("reading the flags watch failed; every flag is read again")
            changed = EVERYTHING
        if changed is EVERYTHING:
            self._flags_changed_everywhere()
            return
        for name in changed:
            listener = self._listeners.get(name.rpartition(".")[0])
            if listener is not None:
                listener.flags_known = False

    def _take_events(self) -> None:
        """What the kernel queued on the two watches, taken now: before a decision uses the
        flags or the kernel's routes (the loop's readers would take it one turn later)."""
        if not self._events.poll(0):
            return
        self._machine_changed()
        self._flags_changed()

    async def _refresh_while_stale(self) -> None:
        # Changes that arrive during a read make it stale again: one more read follows.
        while self._stale:
            self._stale = False
            await self.refresh_machine()

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
        _spawn(listener.background, self._accept_forever(listener))
        _spawn(listener.background, self._watch_stop(listener))
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
        await _cancel_all(listener)  # first: the accept loop still watches the socket
        listener.pool.close()
        if listener.watch is not None:
            listener.watch.close()  # out of the selector, then closed
        listener.sock.close()
        with contextlib.suppress(FileNotFoundError):
            listener.path.unlink()
        self.wire_log.close(sandbox)  # after the cancelled exchanges wrote their lines
        log.info("listener for %s closed", sandbox)
        return True

    async def _accept_forever(self, listener: Listener) -> None:
        # Accept first, wait only when none is pending; the listening socket stays in the
        # selector between waits (`Conn`): a connection per request costs no epoll_ctl here.
        CURRENT.set(listener.share)  # its wake-ups are steps of its sandbox's share
        listener.watch = Conn(listener.sock)
        in_a_row = 0
        while True:
            if in_a_row >= ACCEPT_PER_WAKE:  # the rest wait in the backlog for a later turn
                in_a_row = 0
                await listener.watch.readable()
            try:
                sock, _ = listener.sock.accept()
            except (BlockingIOError, InterruptedError):
                in_a_row = 0
                await listener.watch.readable()
                continue
            except OSError as exc:
                log.error("accept on %s failed: %s", listener.path, exc)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            in_a_row += 1  # a refused one counts too: its line and its answer are work
            if len(listener.connections) >= self.config.max_connections_per_sandbox:
                limit = self.config.max_connections_per_sandbox
                self._refuse_now(listener, sock, "too-many-connections", f"{limit} already open")
                continue
            others = [len(o.connections) for o in self._listeners.values() if o is not listener]
            if not may_accept(len(listener.connections), others, self.descriptor_limit):
                reason = "the proxy's descriptors are taken (this sandbox's share is in use)"
                self._refuse_now(listener, sock, "too-many-descriptors", reason)
                continue
            _spawn(listener.connections, self._serve(listener, sock))

    def _refuse_now(self, listener: Listener, sock: socket.socket, rule: str, reason: str) -> None:
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(refusal_response(rule))
        sock.close()
        self.wire_log.write(WireEntry(listener.sandbox, "", "", "refused", rule, reason=reason))

    async def _watch_stop(self, listener: Listener) -> None:
        stop_flag = self.config.flags_dir / f"{listener.sandbox}.stop"
        while True:
            await asyncio.sleep(FLAG_POLL_S)
            if _flag_set(stop_flag):
                listener.pool.close()
                for task in list(listener.connections):
                    task.cancel()
            listener.pool.sweep()
            self.wire_log.flush(listener.sandbox)  # the counts of ended refusal windows
            watch = self._flag_watch
            if watch is not None and not watch.armed and watch.arm():  # the folder is back
                self._flags_changed_everywhere()

    def _flags_changed_everywhere(self) -> None:
        for listener in self._listeners.values():
            listener.flags_known = False

    def _flags(self, listener: Listener) -> Refusal | None:
        """The stop and pause flags as they are now: as last read while the watch has said
        no name of this sandbox changed since, else read (and kept while the watch is on)."""
        self._take_events()
        if listener.flags_known:
            return listener.flag_refusal
        refusal, by_path = None, False
        for path, name, rule in listener.flags:
            is_set, link = _flag_state(path)
            by_path = by_path or link
            if is_set:
                refusal = Refusal(rule, f"the sandbox's {name} flag is set")
                break
        watch = self._flag_watch
        if watch is not None and watch.armed and not by_path:
            listener.flag_refusal, listener.flags_known = refusal, True
        return refusal

    async def _serve(self, listener: Listener, sock: socket.socket) -> None:
        CURRENT.set(listener.share)  # this task's (and its children's) steps are its sandbox's
        share = listener.share  # its first step too: a flood's head is there at its accept
        if share is not None and (turn := share.take()) is not None:
            try:
                await turn
            except BaseException:  # cancelled while waiting (a stop): nothing else holds it
                sock.close()
                raise
        client = Conn(sock)
        try:
            handed = await self._handed(listener, client)  # the relay's TCP socket, or itself
            if handed is None:
                return
            client = handed
            while True:  # the callback path while it can (`fast_exchange`), else one by one
                step = await self._fast.serve(listener, client) if self._fast else None
                if not await (self._one_request(listener, client) if step is None else step):
                    break
        except (OSError, EOFError, TimeoutError, BadResponse, RequestRefused) as exc:
            log.debug("%s: connection ended: %s", listener.sandbox, exc)
        finally:
            await close_conn(client, listener.closer)  # a handed one off the loop: it may linger

    async def _handed(self, listener: Listener, client: Conn) -> Conn | None:
        """The connection to serve: `client`, or the TCP socket the sandbox's relay handed over
        on it (`handoff`: judged; `client` closed); None when the hand-off was refused."""
        client.deadline = asyncio.get_running_loop().time() + HEAD_TIMEOUT_S
        try:
            received = await first_read(client)
        finally:
            client.deadline = None
        if not received.is_handoff:
            return client
        taken = take_handed(received)
        if isinstance(taken, Refusal):
            await self.refuse(listener, client, "", "", taken)
            return None
        client.close()
        listener.handed += 1
        return taken

    async def _one_request(self, listener: Listener, client: Conn) -> bool:
        """Serve one request; True when the connection may carry another."""
        client.timeout = None
        consumed = client.received - len(client.buffer)  # this request's bytes start here
        client.deadline = asyncio.get_running_loop().time() + HEAD_TIMEOUT_S  # in total
        try:
            try:
                head = await client.read_head(find_head_end)
            finally:
                client.deadline = None  # before any answer: its send has its own bound
        except TimeoutError:
            if client.buffer:
                await self.refuse(listener, client, "", "", Refusal("head-timeout", "slow"))
            return False
        except RequestRefused as exc:
            await self.refuse(listener, client, "", "", Refusal(exc.rule, exc.reason))
            return False
        if head is None:
            return False
        try:
            request = parse_request_head(head)
        except RequestRefused as exc:
            method, _, rest = head.partition(b" ")
            target = rest.partition(b" ")[0].decode("latin-1")
            refusal = Refusal(exc.rule, exc.reason)
            await self.refuse(listener, client, method.decode("latin-1"), target, refusal)
            return False
        target = shown_target(request)
        if listener.services.rule_for(request) is not None:  # a rule's host: never elsewhere
            return await self._service(listener, client, request, target, consumed)
        if listener.models.rule_for(request) is not None:  # a model rule's port in the sandbox
            return await self._model(listener, client, request, target, consumed)
        if listener.hosted.rules:  # a hosted provider's host: its rule only, never a tunnel
            try:
                listener.hosted.refuse_connect(request)
            except RequestRefused as exc:
                refusal = Refusal(exc.rule, exc.reason)
                await self.refuse(listener, client, request.method, target, refusal)
                return False
            hosted = listener.hosted.rule_for_host(request.host)
            if hosted is not None:
                return await self._hosted(listener, client, request, target, consumed, rule=hosted)
        buffers: TunnelBuffers | None = None
        if request.kind == "connect":  # reserved now, before any await: no cap is passed
            reserved = self._reserve_tunnel(listener)
            if isinstance(reserved, Refusal):
                await self.refuse(listener, client, request.method, target, reserved)
                return False
            buffers = reserved
        try:
            verdict = await self._decide(listener, request)
            if buffers is not None and isinstance(verdict, Allowed):  # no provider by address
                verdict = await judge_tunnel(listener, verdict, self.config)
            if not isinstance(verdict, Allowed):
                await self.refuse(listener, client, request.method, target, verdict)
                return False
            exchange = Exchange(listener, client, request, verdict, target, consumed, client.sent)
            if buffers is not None:
                await self._tunnel(replace(exchange, buffers=buffers))
                return False
        finally:
            if buffers is not None:
                self._release_tunnel(listener, buffers)
        refused = self.reserve_plain(listener)  # its origin socket's buffers, from the budget
        if refused is not None:
            await self.refuse(listener, client, request.method, target, refused)
            return False
        return await self.forward(exchange)

    def _reserve_tunnel(self, listener: Listener) -> TunnelBuffers | Refusal:
        """One of the sandbox's tunnel slots and its tunnel's buffers, taken before any await."""
        unbounded = self.config.unsafe_unbounded_tunnels  # a test box's: `check` shows the leak
        if listener.tunnels >= self.config.max_tunnels_per_sandbox and not unbounded:
            limit = self.config.max_tunnels_per_sandbox
            return Refusal("too-many-tunnels", f"{limit} tunnels already open")
        budget = self.config.tunnel_buffer_budget_bytes
        buffers = buffers_for(listener.large_buffers, listener.buffers, budget)
        if buffers is None and unbounded:
            log.warning("unsafe_unbounded_tunnels: %s's tunnel past its caps", listener.sandbox)
            buffers = SMALL  # still counted, so its release balances
        if buffers is None:
            reason = f"the sandbox's open tunnels hold its {budget} bytes of kernel buffers"
            return Refusal("too-much-buffer", reason)
        listener.tunnels += 1
        listener.buffers += buffers.worst_case()
        if buffers is LARGE:
            listener.large_buffers += buffers.worst_case()
        return buffers

    def reserve_plain(self, listener: Listener) -> Refusal | None:
        """A plain http exchange's buffers (`tunnel_buffers.PLAIN`) from the sandbox's budget,
        taken before any await, shared with its tunnels."""
        budget = self.config.tunnel_buffer_budget_bytes
        over = listener.buffers + PLAIN.worst_case() > budget
        if over and not self.config.unsafe_unbounded_tunnels:
            reason = f"the sandbox's open exchanges hold its {budget} bytes of kernel buffers"
            return Refusal("too-much-buffer", reason)
        listener.buffers += PLAIN.worst_case()
        return None

    def _release_tunnel(self, listener: Listener, buffers: TunnelBuffers) -> None:
        listener.tunnels -= 1
        listener.buffers -= buffers.worst_case()
        if buffers is LARGE:
            listener.large_buffers -= buffers.worst_case()

    async def _service(
        self, listener: Listener, client: Conn, request: ProxyRequest, target: str, consumed: int
    ) -> bool:
        """A request to a service rule's host (`service_relay`): judged, the secret added,
        TLS upstream at the vetted address; the connection ends with the answer."""
        grant = listener.services
        rule = grant.rule_for(request)
        assert rule is not None  # the caller's check
        try:
            check = not self.config.unsafe_skip_service_method_check
            forward, secret = grant.judge(rule, request, check_route=check)
        except RequestRefused as exc:
            await self.refuse(
                listener, client, request.method, target, Refusal(exc.rule, exc.reason)
            )
            return False
        verdict = await self._decide(listener, request, grant.memo, service_relay.HTTPS_PORT)
        if not isinstance(verdict, Allowed):
            await self.refuse(listener, client, request.method, target, verdict)
            return False
        shown = f"http://{rule.host}{forward.logged_path}"  # the placeholder, never the secret
        exchange = Exchange(listener, client, request, verdict, shown, consumed, client.sent)
        client.timeout = IO_TIMEOUT_S
        error = ""
        try:
            await relay(
                forward,
                secret,
                request,
                client,
                verdict.address,
                context=self.service_tls,
                connect_timeout_s=self.config.connect_timeout_s,
                io_timeout_s=IO_TIMEOUT_S,
            )
        except asyncio.CancelledError:
            error = "closed: the sandbox was stopped or its listener closed"
            raise
        except (OSError, EOFError, TimeoutError, ssl.SSLError, BadResponse, RequestRefused) as exc:
            error = scrub_text(f"ended: {exc!r}", secret)
            if client.sent == exchange.sent:
                with contextlib.suppress(OSError, TimeoutError):
                    await client.send(BAD_GATEWAY)
        finally:
            self.log_allowed(exchange, error)
        return False

    async def _model(
        self, listener: Listener, client: Conn, request: ProxyRequest, target: str, consumed: int
    ) -> bool:
        """A request to a model rule's port (`model_relay`): the relay's CONNECT answered and
        its one request read, judged (route, then body), then the runtime dialed at the rule's
        own address; the connection ends with the answer."""
        rule = listener.models.rule_for(request)
        assert rule is not None  # the caller's check
        if request.kind == "connect":
            gate = self._gate(listener)
            if gate is not None:
                await self.refuse(listener, client, request.method, target, gate)
                return False
            await client.send(CONNECT_OK)
            try:
                tunneled = await read_tunneled_head(client, rule.port, HEAD_TIMEOUT_S)
            except TimeoutError:
                return False
            except RequestRefused as exc:
                await self.refuse(listener, client, "", target, Refusal(exc.rule, exc.reason))
                return False
            if tunneled is None:
                return False
            consumed = client.received - len(client.buffer)
            request, target = tunneled, shown_target(tunneled)
        if not rule.local:  # anthropic, openai: the provider over TLS, the key forced
            return await self._hosted(listener, client, request, target, consumed, rule=rule)
        try:
            check = not self.config.unsafe_skip_model_route_check
            bounded = not self.config.unsafe_unbounded_model_bodies
            judged = await judge_model_request(
                rule, request, client, check_route=check, bounded=bounded
            )
        except RequestRefused as exc:
            await self.refuse(
                listener, client, request.method, target, Refusal(exc.rule, exc.reason)
            )
            return False
        secret = listener.services.secret(rule.secret) if rule.secret else None
        if rule.secret and secret is None:
            reason = f"the secret {rule.secret} is not set: `lnk secret set {rule.secret}`"
            refusal = Refusal("model-secret-gone", reason)
            await self.refuse(listener, client, request.method, target, refusal)
            return False
        verdict = await self._decide_model(listener, request, rule)
        if not isinstance(verdict, Allowed):
            await self.refuse(listener, client, request.method, target, verdict)
            return False
        exchange = Exchange(listener, client, request, verdict, target, consumed, client.sent)
        client.timeout = IO_TIMEOUT_S
        error = ""
        try:
            await relay_model(
                judged,
                request,
                client,
                verdict.address,
                secret,
                connect_timeout_s=self.config.connect_timeout_s,
                io_timeout_s=IO_TIMEOUT_S,
                cut_listings=not self.config.unsafe_uncut_model_listings,
            )
        except asyncio.CancelledError:
            error = "closed: the sandbox was stopped or its listener closed"
            raise
        except (OSError, EOFError, TimeoutError, BadResponse, RequestRefused) as exc:
            error = f"ended: {exc!r}" if secret is None else scrub_text(f"ended: {exc!r}", secret)
            if client.sent == exchange.sent:
                with contextlib.suppress(OSError, TimeoutError):
                    await client.send(BAD_GATEWAY)
        finally:
            self.log_allowed(exchange, error)
        return False

    async def _hosted(
        self,
        listener: Listener,
        client: Conn,
        request: ProxyRequest,
        target: str,
        consumed: int,
        *,
        rule: ModelRule,
    ) -> bool:
        """A request to a hosted model rule: its worst case reserved from the sandbox's buffer
        budget before any await (`hosted_budget`), given back however it ends."""
        config = self.config  # the budget its tunnels and plain http exchanges share
        budget, unbounded = config.tunnel_buffer_budget_bytes, config.unsafe_unbounded_tunnels
        held = hosted_budget.reserve(listener, request, budget, self.hosted_buffers, unbounded)
        if isinstance(held, Refusal):
            await self.refuse(listener, client, request.method, target, held)
            return False
        try:
            return await self._hosted_reserved(
                listener, client, request, target, consumed, rule=rule, held=held
            )
        finally:
            held.release()

    async def _hosted_reserved(
        self,
        listener: Listener,
        client: Conn,
        request: ProxyRequest,
        target: str,
        consumed: int,
        *,
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
                keep_tools=self.config.unsafe_keep_server_tools,
                bounded=not self.config.unsafe_unbounded_model_bodies,
                naive_screen=self.config.unsafe_naive_content_screen,
            )
        except RequestRefused as exc:
            await self.refuse(
                listener, client, request.method, target, Refusal(exc.rule, exc.reason)
            )
            return False
        del untrusted  # the serialisation alone is held from here: the reservation follows it
        grown = held.settle(len(forward.body))
        if grown is not None:
            await self.refuse(listener, client, request.method, target, grown)
            return False
        secret = listener.services.secret(rule.secret) if rule.secret else None
        if secret is None:
            reason = f"the secret {rule.secret} is not set: `lnk secret set {rule.secret}`"
            await self.refuse(
                listener, client, request.method, target, Refusal("model-secret-gone", reason)
            )
            return False
        upstream = replace(request, host=rule.host)
        verdict = await self._decide(listener, upstream, hosted.memo, rule.upstream_port)
        if not isinstance(verdict, Allowed):
            await self.refuse(listener, client, request.method, target, verdict)
            return False
        why = "; ".join(forward.removed)
        shown = replace(verdict, reason=f"{verdict.reason}; {why}" if why else verdict.reason)
        exchange = Exchange(listener, client, request, shown, target, consumed, client.sent)
        client.timeout = IO_TIMEOUT_S
        error = ""
        try:
            await exchange_hosted(
                forward,
                rule.host,
                secret,
                placeholder=placeholder,
                request=request,
                client=client,
                address=verdict.address,
                issued=hosted.issued(rule),
                context=self.service_tls,
                connect_timeout_s=self.config.connect_timeout_s,
                io_timeout_s=IO_TIMEOUT_S,
                buffers=self.hosted_buffers,
                port=rule.upstream_port,
            )
        except asyncio.CancelledError:
            error = "closed: the sandbox was stopped or its listener closed"
            raise
        except (OSError, EOFError, TimeoutError, ssl.SSLError, BadResponse, RequestRefused) as exc:
            error = scrub_text(f"ended: {exc!r}", secret)
            if client.sent == exchange.sent:
                with contextlib.suppress(OSError, TimeoutError):
                    await client.send(BAD_GATEWAY)
        finally:
            self.log_allowed(exchange, error)
        return False

    def _gate(self, listener: Listener) -> Refusal | None:
        """What refuses every request before its host is judged: no room in the wire's log,
        the stop or pause flag."""
        if not self.wire_log.can_admit(listener.sandbox):  # never an exchange it cannot log
            reason = "no room for its line in the sandbox's wire log or in the box's wire logs"
            return Refusal("log-full", reason)
        return self._flags(listener)

    async def _decide_model(
        self, listener: Listener, request: ProxyRequest, rule: ModelRule
    ) -> Allowed | Refusal:
        """A runtime on this machine: its loopback address and port, by the rule (the one
        exception to "never this machine"); elsewhere: the rule's host judged as a `[lan]`
        grant of exactly it (a private address), as the kernel routes it."""
        if not rule.on_this_machine:
            upstream = replace(request, host=rule.host)
            return await self._decide(listener, upstream, listener.models.memo, rule.upstream_port)
        gate = self._gate(listener)
        if gate is not None:
            return gate
        reason = f"[[models]] {rule.kind} on this machine's {rule.upstream}"
        return Allowed(loopback_address(rule), rule.upstream_port, Rule.ALLOWED_MODEL, reason)

    def decide_now(
        self, listener: Listener, request: ProxyRequest, memo: PolicyMemo, port: int
    ) -> Allowed | Refusal | Target:
        """The verdict on the request's host by `memo` at `port`, with no await: the name's
        `Target` when it needs a lookup (not a literal, not in the sandbox's kept answers)."""
        gate = self._gate(listener)
        if gate is not None:
            return gate
        local = judge_localhost(memo.grants, request.host, port)
        if local is not None:
            return local
        target = memo.target(request.host, port)
        if isinstance(target, Refused):
            return Refusal(target.rule, target.reason)
        resolver = listener.resolver
        assert resolver is not None  # set by open_listener
        if target.literal is not None:
            return self._judge_addresses(memo, target, (target.literal,))
        if resolver.caches_answers and (cached := listener.answers.get(target.host)):
            return self._judge_addresses(memo, target, cached)
        return target

    async def _decide(
        self,
        listener: Listener,
        request: ProxyRequest,
        memo: PolicyMemo | None = None,
        port: int | None = None,
    ) -> Allowed | Refusal:
        """The verdict on the request's host, by `memo` (the sandbox's own grants unless a
        service rule's) at `port` (the request's unless a service rule's)."""
        memo = memo or listener.memo
        target = self.decide_now(listener, request, memo, request.port if port is None else port)
        if not isinstance(target, Target):
            return target
        resolver = listener.resolver
        assert resolver is not None  # set by open_listener
        refused = self._reserve_lookup(listener)
        if refused is not None:
            return refused
        try:
            addresses = await resolver.resolve(target.host)
        except ResolverBusy as exc:
            return Refusal("too-many-lookups", str(exc))
        finally:
            listener.lookups -= 1
        share = listener.share  # the answer's wake-up is a step of the sandbox's share
        if share is not None and (turn := share.take()) is not None:
            await turn
        if resolver.caches_answers:
            listener.answers.put(target.host, addresses)
        # An await: the loop ran other work since the flags' look. Change messages taken again
        # (as at `_flags`): an interface's kept answer is never older than a change queued
        # before this decision's last look.
        self._take_events()
        return self._judge_addresses(memo, target, addresses)

    def _judge_addresses(
        self, memo: PolicyMemo, target: Target, addresses: Sequence[IPAddress]
    ) -> Allowed | Refusal:
        """The addresses judged, then the vetted one as the kernel routes it now."""
        if self.machine is None:
            raise RuntimeError("ProxyServer.start() was not called: this machine is unknown")
        verdict = memo.addresses(target, addresses, self.machine)
        if isinstance(verdict, Refused):
            return Refusal(verdict.rule, verdict.reason)
        routed = self.routes.check(verdict.address) if self.routes is not None else None
        if routed is not None:
            return Refusal(routed.rule, routed.reason)
        return verdict

    def _reserve_lookup(self, listener: Listener) -> Refusal | None:
        """One of the sandbox's `MAX_WAITING_LOOKUPS` slots, taken before the await."""
        if listener.lookups >= MAX_WAITING_LOOKUPS:
            return Refusal("too-many-lookups", f"{listener.lookups} lookups already waiting")
        listener.lookups += 1
        return None

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

    async def _dial(self, allowed: Allowed, buffers: TunnelBuffers = PLAIN) -> Conn:
        """A new origin connection with fixed buffers: a tunnel's, else plain http's."""
        timeout = self.config.connect_timeout_s
        return Conn(await dial(allowed.address, allowed.port, timeout, buffers))

    async def _upstream(self, exchange: Exchange, key: PoolKey) -> tuple[Conn, bool]:
        """An idle pooled connection to exactly the judged address, else a new one; and
        whether it was reused. OSError or TimeoutError when dialing fails."""
        pooled = exchange.listener.pool.take(key, retryable=_retryable(exchange.request))
        if pooled is not None:
            return pooled, True
        return await self._dial(exchange.allowed), False

    async def _tunnel(self, exchange: Exchange) -> None:
        client, error, dial_failed = exchange.client, "", False
        try:
            try:
                upstream = await self._dial(exchange.allowed, exchange.buffers)
            except (OSError, TimeoutError) as exc:
                error, dial_failed = f"dial failed: {exc!r}", True
                return
            try:
                await client.send(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                sandbox = exchange.listener.sandbox  # a handed one spliced in a thread, if room
                threads = isinstance(client.sock, HandedSocket) and SPLICE_SLOTS.take(sandbox)
                try:
                    await tunnel(
                        client, upstream, exchange.buffers, splice_run if threads else None
                    )
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
            self.log_allowed(exchange, error)  # before the 502: a client reading it sees the line
            if dial_failed:
                with contextlib.suppress(OSError, TimeoutError):
                    await client.send(BAD_GATEWAY)

    async def forward(self, exchange: Exchange, sent: SentHead | None = None) -> bool:
        """Forward a plain http request whose buffers `_reserve_plain` took (given back here);
        `sent`: its head went already, on that upstream connection (`fast_exchange`)."""
        try:
            return await self._forward_reserved(exchange, sent)
        finally:
            exchange.listener.buffers -= PLAIN.worst_case()

    async def _forward_reserved(self, exchange: Exchange, sent: SentHead | None) -> bool:
        client, request, allowed = exchange.client, exchange.request, exchange.allowed
        key: PoolKey = (request.host.lower(), allowed.port, allowed.address)
        client.timeout = IO_TIMEOUT_S
        error, client_keeps = "", False
        try:
            upstream, reused = await self._upstream(exchange, key) if sent is None else sent[:2]
        except (OSError, TimeoutError) as exc:
            self.log_allowed(exchange, f"dial failed: {exc!r}")
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
                upstream = await self._dial(allowed)
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
            self.log_allowed(exchange, error)
        return client_keeps


def _flag_set(path: Path | str) -> bool:
    """Whether a flag file exists; one that cannot be checked (EACCES, ELOOP) counts as set,
    so a flags folder the proxy cannot read stops sandboxes instead of freeing them."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        log.error("cannot check the flag %s (%s): taken as set", path, exc)
    return True


def _flag_state(path: str) -> tuple[bool, bool]:
    """Whether a flag is set, and whether it is a link (then read by path every time: a
    change to its target is not a change the folder's watch sees)."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False, False
    except OSError as exc:
        log.error("cannot check the flag %s (%s): taken as set", path, exc)
        return True, False
    if stat.S_ISLNK(info.st_mode):
        return _flag_set(path), True
    return True, False


def _retryable(request: ProxyRequest) -> bool:
    """Whether a request may go again on a new connection when a reused one failed before
    any answer: no body, and a method RFC 9110 9.2.2 lets clients repeat."""
    return request.framing.kind == "none" and request.method in IDEMPOTENT_METHODS


def _spawn(tasks: set[asyncio.Task[None]], coroutine: Coroutine[Any, Any, None]) -> None:
    task = asyncio.create_task(coroutine)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def _cancel_all(listener: Listener) -> None:
    tasks = [*listener.background, *listener.connections]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
