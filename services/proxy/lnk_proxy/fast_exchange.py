"""The callback path for keep-alive plain http: a small request and its small answer served
from the event loop's readiness callbacks, with no task, future or await per request.

Why: on the coroutine path (`one_request.one_request` and on) a request cost a chain
of coroutines and a future per wait; that interpreter work, not the syscalls, was most of a
small request's CPU (bench/README.md, issue 16). Here a connection's readiness runs a method:
the sandbox's head read and parsed (`parse_request_head`, the same grammar), the same
decision (`ProxyServer.decide_now`: the gate, the flags, `judge_localhost`, the policy memo,
the route check: every request judged), the head sent on a pooled connection to exactly the
judged address, the answer framed (`parse_response_head`, the same reading) and sent back
whole in one send, then the one wire-log line (`ProxyServer.log_allowed`, the same line).

What it takes: an `http://` request without a body, of a method the coroutine path may send
again (`IDEMPOTENT_METHODS`), to a host no service, model or hosted rule names, whose name
needs no lookup now, with an idle pooled connection for its judged address; and an answer
with a Content-Length (or none) that fits `MAX_ANSWER_BYTES` whole. Anything else goes to
the coroutine path as it is, at the point it was seen: before the head is consumed (a bad
head, a refusal by the parser, a CONNECT, a body, a lookup, no pooled connection: the
coroutine path reads the same bytes and decides again), or after the head went upstream (an
interim, chunked, close-framed or large answer, a bad or missing one, a reset or an end:
`ProxyServer.forward` relays it from what was read, retries as it does). A refusal decided
here is answered by `ProxyServer.refuse`, as on the coroutine path.

Bounds: the sandbox's connection is read only while a head is awaited (at most
`MAX_HEAD_BYTES`, `find_head_end` refuses past it), the origin's only while its answer is
(at most `MAX_ANSWER_BYTES` plus one read); an answer the sandbox does not take at once
waits in one bytes object while the loop waits for the sandbox to read (nothing more is read
meanwhile). The coroutine path's timeouts hold: `head_timeout_s` in total for an idle
connection and its next head, `io_timeout_s` idle while an answer is awaited or sent (one
timer per connection, moved forward lazily). Each readiness is a step of the sandbox's share
of the loop (`fair_share`), as on the coroutine path.

Limits: this does NOT serve CONNECT, bodies, lookups or dials (the coroutine path does), nor
stream: an answer larger than `MAX_ANSWER_BYTES` or not framed by a length goes to the
coroutine path once its head is read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, Protocol

from lnk_proxy.conn import IDLE_TOO_LONG, READ_CHUNK, Conn
from lnk_proxy.forward import (
    BAD_GATEWAY,
    BadResponse,
    find_response_head_end,
)
from lnk_proxy.http_request import (
    ProxyRequest,
    RequestRefused,
    find_head_end,
)
from lnk_proxy.listeners import Exchange, Listener, Refusal, SentHead, send_refusal
from lnk_proxy.policy import Allowed, Target
from lnk_proxy.policy_memo import PolicyMemo
from lnk_proxy.tunnel_buffers import PLAIN
from lnk_proxy.upstream_pool import PoolKey

__all__ = ["IDEMPOTENT_METHODS", "MAX_ANSWER_BYTES", "FastExchange", "FastHost", "Step"]

# RFC 9110 9.2.2: a request of these may be sent again (a dropped pooled connection): the
# coroutine path's retry then holds for every request this path sends.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# An answer (head and body) kept whole before one send: small answers are what this path is
# for; a larger one streams on the coroutine path (its pooled 1 MiB buffers).
MAX_ANSWER_BYTES = 64 * 1024

# What the server awaits next: None for `one_request` (the next head is the coroutine
# path's), else a coroutine saying whether the connection may carry another request.
Step = Coroutine[Any, Any, bool] | None

_HEAD, _EXCHANGE, _TURN, _DONE = range(4)  # a connection's states
_STOPPED = "closed: the sandbox was stopped or its listener closed"


class FastHost(Protocol):
    """What the callback path uses of the server (`server.ProxyServer`)."""

    def decide_now(
        self, listener: Listener, request: ProxyRequest, memo: PolicyMemo, port: int
    ) -> Allowed | Refusal | Target: ...

    def reserve_plain(self, listener: Listener) -> Refusal | None: ...

    def log_refusal(
        self, listener: Listener, method: str, target: str, refusal: Refusal
    ) -> None: ...

    async def forward(self, exchange: Exchange, sent: SentHead | None = None) -> bool: ...

    def log_allowed(self, exchange: Exchange, error: str) -> None: ...


class FastExchange:
    """The callback path of one proxy; `serve` runs it on one sandbox connection."""

    def __init__(self, host: FastHost, head_timeout_s: float, io_timeout_s: float) -> None:
        self.host = host
        self.head_timeout_s = head_timeout_s
        self.io_timeout_s = io_timeout_s
        self.decided = 0  # requests decided here (the tests' proof that this path ran)

    async def serve(self, listener: Listener, client: Conn) -> Step:
        """Serve `client`'s requests until one is not this path's: then what comes next (the
        caller awaits it at once: from here on it owns the exchange it was given)."""
        connection = _Connection(self, listener, client)
        try:
            step = await connection.run()
        except asyncio.CancelledError:
            connection.abort()
            raise
        connection.exchange = connection.upstream = None  # the step's now
        return step


async def _ended() -> bool:
    return False


async def _send_refusal(client: Conn, refusal: Refusal, timeout_s: float) -> bool:
    await send_refusal(client, refusal, timeout_s)
    return False


async def _send_rest(host: FastHost, exchange: Exchange, sent: SentHead, rest: bytes) -> bool:
    """A head the origin's socket took only part of: the rest, then the coroutine path."""
    with contextlib.suppress(OSError):  # TimeoutError too: the coroutine path reads the end
        await sent.upstream.send(rest)
    return await host.forward(exchange, sent)


class _Connection:
    """One sandbox connection on the callback path: its state and its readiness methods.
    `exchange` (with `upstream` once its head went) is held from its decision until its
    line is written or a step took it: what `abort` ends as the coroutine path would."""

    def __init__(self, fast: FastExchange, listener: Listener, client: Conn) -> None:
        self.fast = fast
        self.host = fast.host
        self.listener = listener
        self.client = client
        self.loop = asyncio.get_running_loop()
        self.outcome: asyncio.Future[Step] = self.loop.create_future()
        if listener.share is not None:  # the step that takes the outcome is the sandbox's
            listener.share.owns(self.outcome)
        self.state = _HEAD
        self.deadline = 0.0  # the loop's time the current wait ends at
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        self.turn: asyncio.Future[None] | None = None  # a share's turn awaited
        self.exchange: Exchange | None = None
        self.upstream: Conn | None = None
        self.key: PoolKey | None = None
        self.answered_before = 0
        self.pending = b""  # the answer's bytes the sandbox has not taken yet
        self.keeps = (False, False)  # may the client's and the origin's connections carry more

    async def run(self) -> Step:
        self._next_head()
        return await self.outcome

    # -- the sandbox's side --

    def _next_head(self) -> None:
        buffer = self.client.buffer
        if buffer:  # pipelined, or the rest of a head split across reads
            try:
                end = find_head_end(buffer)
            except RequestRefused:
                return self._finish(None)  # the coroutine path refuses it (`read_head`)
            if end is not None:
                return self._take(end)
        self.state = _HEAD
        self._wait(self.fast.head_timeout_s)
        self.client.on_readable = self._client_readable
        self.client.watch()

    def _client_readable(self) -> None:
        if self.state != _HEAD:  # not read now: out of the selector until it is
            self.client.unwatch()
            return
        if self._turn_waits(self._client_turn):
            self.client.unwatch()
            return
        self._read_client()

    def _client_turn(self, _: asyncio.Future[None]) -> None:
        if self.state == _TURN:
            self.state, self.turn = _HEAD, None
            self._read_client()

    def _read_client(self) -> None:
        client = self.client
        try:
            data = client.sock.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            client.watch()
            return
        except OSError:
            return self._finish(_ended())  # as `_serve` ends it: no line, no answer
        if not data:
            return self._finish(_ended())  # closed (mid-head too: `_serve` logs no line)
        client.received += len(data)
        client.buffer += data
        try:
            end = find_head_end(client.buffer)
        except RequestRefused:
            return self._finish(None)
        if end is None:
            client.watch()
            return
        self._take(end)

    def _take(self, end: int) -> None:
        """A whole head at the start of the buffer: served here, or left for the coroutine
        path (nothing consumed) when it is not this path's."""
        client, listener, host = self.client, self.listener, self.host
        try:
            parsed = listener.heads.request(bytes(client.buffer[:end]))
        except RequestRefused:
            return self._finish(None)  # the coroutine path names the rule
        request = parsed.request
        if (
            request.kind != "http"
            or request.framing.kind != "none"
            or request.method not in IDEMPOTENT_METHODS
            or listener.hosted.rules
            or listener.services.rule_for(request) is not None
            or listener.models.rule_for(request) is not None
        ):
            return self._finish(None)
        verdict = host.decide_now(listener, request, listener.memo, request.port)
        if isinstance(verdict, Target):
            return self._finish(None)  # a lookup: the coroutine path's
        self.fast.decided += 1
        listener.fast_decided += 1
        consumed = client.received - len(client.buffer)
        del client.buffer[:end]
        target = parsed.target
        if not isinstance(verdict, Allowed):
            return self._refuse(request, target, verdict)
        refused = host.reserve_plain(listener)
        if refused is not None:
            return self._refuse(request, target, refused)
        exchange = Exchange(listener, client, request, verdict, target, consumed, client.sent)
        self.exchange = exchange
        key: PoolKey = (request.host.lower(), verdict.port, verdict.address)
        upstream = listener.pool.take(key, retryable=True)
        if upstream is None:
            return self._finish(host.forward(exchange))  # a dial: the coroutine path's
        self.upstream, self.key = upstream, key
        self.answered_before = upstream.received
        head = parsed.upstream_head
        try:
            sent = upstream.sock.send(head)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            return self._hand_over()  # the coroutine path reads the end and retries
        upstream.sent += sent
        if sent < len(head):
            return self._hand_over(head[sent:])
        self.state = _EXCHANGE
        upstream.timeout = self.fast.io_timeout_s
        self._wait(self.fast.io_timeout_s)
        upstream.on_readable = self._upstream_readable
        upstream.watch()

    def _refuse(self, request: ProxyRequest, target: str, refusal: Refusal) -> None:
        """As `ProxyServer.refuse`: the line now, the answer sent by the step."""
        self.host.log_refusal(self.listener, request.method, target, refusal)
        self._finish(_send_refusal(self.client, refusal, self.fast.io_timeout_s))

    # -- the origin's side --

    def _upstream_readable(self) -> None:
        upstream = self.upstream
        assert upstream is not None  # set with the readiness method
        if self.state != _EXCHANGE:
            upstream.unwatch()
            return
        if self._turn_waits(self._upstream_turn):
            upstream.unwatch()
            return
        self._read_upstream()

    def _upstream_turn(self, _: asyncio.Future[None]) -> None:
        if self.state == _TURN:
            self.state, self.turn = _EXCHANGE, None
            self._read_upstream()

    def _read_upstream(self) -> None:
        upstream, exchange = self.upstream, self.exchange
        assert upstream is not None and exchange is not None
        try:
            data = upstream.sock.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            upstream.watch()
            return
        except OSError:
            return self._hand_over()
        if not data:
            return self._hand_over()  # an end: the coroutine path reads it and retries
        upstream.received += len(data)
        buffer = upstream.buffer
        buffer += data
        self.deadline = self.loop.time() + self.fast.io_timeout_s  # an idle bound per read
        request = exchange.request
        try:
            end = find_response_head_end(buffer)
            if end is None:
                upstream.watch()
                return
            memo = self.listener.heads
            response, head = memo.response(bytes(buffer[:end]), request.method, request.keep_alive)
        except BadResponse:
            return self._hand_over()
        length = response.length or 0
        if response.interim or response.framing not in ("length", "none"):
            return self._hand_over()
        if end + length > MAX_ANSWER_BYTES:
            return self._hand_over()
        if len(buffer) < end + length:
            upstream.watch()
            return
        # `forward._relay_response`'s answer, byte for byte, in one send.
        answer = head + buffer[end : end + length]
        del buffer[: end + length]
        origin_keeps = response.origin_keeps and request.version == "HTTP/1.1"
        self.keeps = (request.keep_alive, origin_keeps and not buffer)
        upstream.on_readable = None
        upstream.watch()  # as the coroutine path leaves it: the pool's `seen_silent` reads it
        self._send(answer)

    def _send(self, answer: bytes) -> None:
        client = self.client
        try:
            sent = client.sock.send(answer)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            return self._fail(exc)
        client.sent += sent
        if sent < len(answer):  # the sandbox reads slowly: the rest when it can take it
            self.pending = answer[sent:]
            self._wait(self.fast.io_timeout_s)
            self.loop.add_writer(client.sock.fileno(), self._client_writable)
            return
        self._answered()

    def _client_writable(self) -> None:
        client = self.client
        try:
            sent = client.sock.send(self.pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            return self._fail(exc)
        client.sent += sent
        self.pending = self.pending[sent:]
        self.deadline = self.loop.time() + self.fast.io_timeout_s
        if not self.pending:
            self.loop.remove_writer(client.sock.fileno())
            self._answered()

    def _answered(self) -> None:
        """As `ProxyServer.forward` ends an exchange: the origin's connection pooled (or
        closed), the wire line, the buffers given back; then the next head, or the end."""
        exchange, upstream, key = self.exchange, self.upstream, self.key
        assert exchange is not None and upstream is not None and key is not None
        self.exchange = self.upstream = self.key = None
        client_keeps, upstream_keeps = self.keeps
        if upstream_keeps:
            exchange.listener.pool.give(key, upstream)
        else:
            upstream.close()
        self.host.log_allowed(exchange, "")
        exchange.listener.buffers -= PLAIN.worst_case()
        if client_keeps:
            self._next_head()
        else:
            self._finish(_ended())

    def _fail(self, exc: BaseException) -> None:
        """The sandbox's side failed mid-answer, or took nothing for `io_timeout_s`: as
        `ProxyServer.forward` ends the exchange (no retry: an answer came)."""
        self._end(f"ended: {exc!r}")
        self._finish(_ended())

    def _hand_over(self, rest: bytes = b"") -> None:
        """The head went upstream (all but `rest`): the coroutine path relays what comes."""
        exchange, upstream = self.exchange, self.upstream
        assert exchange is not None and upstream is not None
        upstream.on_readable = None
        sent = SentHead(upstream, True, self.answered_before)
        step = _send_rest(self.host, exchange, sent, rest) if rest else None
        self._finish(step or self.host.forward(exchange, sent))

    def _end(self, error: str) -> None:
        """The exchange held here ends with `error`, as `ProxyServer.forward` ends one."""
        exchange, upstream = self.exchange, self.upstream
        self.exchange = self.upstream = self.key = None
        if self.pending:
            self.loop.remove_writer(self.client.sock.fileno())
            self.pending = b""
        if exchange is None:
            return
        if upstream is not None:
            upstream.close()
            if self.client.sent == exchange.sent and error != _STOPPED:
                with contextlib.suppress(OSError):
                    self.client.sock.send(BAD_GATEWAY)
            self.host.log_allowed(exchange, error)
        exchange.listener.buffers -= PLAIN.worst_case()

    # -- waits, turns and the end --

    def _turn_waits(self, then: Any) -> bool:
        """Count this readiness as a step of the sandbox's share; True when it waits."""
        share = self.listener.share
        turn = share.take() if share is not None else None
        if turn is None:
            return False
        self.state, self.turn = _TURN, turn
        turn.add_done_callback(then)
        return True

    def _wait(self, seconds: float) -> None:
        """The current wait ends `seconds` from now: one timer, moved only when earlier."""
        self.deadline = self.loop.time() + seconds
        if self.timer is not None and self.timer_at <= self.deadline:
            return  # it fires first and looks again
        if self.timer is not None:
            self.timer.cancel()
        self.timer, self.timer_at = self.loop.call_at(self.deadline, self._expired), self.deadline

    def _expired(self) -> None:
        self.timer = None
        if self.state == _DONE:
            return
        if self.loop.time() < self.deadline:  # moved forward since: wait for the rest
            self.timer, self.timer_at = (
                self.loop.call_at(self.deadline, self._expired),
                self.deadline,
            )
            return
        if self.pending:  # the sandbox took nothing for `io_timeout_s`
            return self._fail(TimeoutError(IDLE_TOO_LONG))
        if self.upstream is not None:  # the origin said nothing: its wait times out there
            self.upstream.deadline = self.loop.time()
            return self._hand_over()
        if self.client.buffer:  # `one_request`'s head timeout, and its refusal
            refusal = Refusal("head-timeout", "slow")
            self.host.log_refusal(self.listener, "", "", refusal)
            return self._finish(_send_refusal(self.client, refusal, self.fast.io_timeout_s))
        self._finish(_ended())

    def _finish(self, step: Step) -> None:
        self._finish_waits()
        if self.outcome.done():  # cannot happen: every path finishes once
            raise RuntimeError("the callback path finished a connection twice")
        self.outcome.set_result(step)

    def _finish_waits(self) -> None:
        self.state = _DONE
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.turn is not None:
            self.turn.cancel()
            self.turn = None
        self.client.on_readable = None  # the client's own waits again

    def abort(self) -> None:
        """The connection's task was cancelled (a stop, the listener closed) before it took
        the step: the exchange held here ends as the coroutine path's would."""
        outcome = self.outcome
        if outcome.done() and not outcome.cancelled():  # a step was made and never ran
            step = outcome.result()
            if step is not None:
                step.close()
        self._end(_STOPPED)
        if not outcome.done():  # (the cancel cancels it when it was awaited)
            self._finish(None)
        else:
            self._finish_waits()
