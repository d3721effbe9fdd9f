"""A sandbox connection's life: accepted from its listener (`accept_forever`: at most
`ACCEPT_PER_WAKE` per wake-up; refused at once past `max_connections_per_sandbox` or when the
proxy's descriptors are taken and this sandbox holds its reserved share, `descriptors`), its
first read maybe a hand-off (`handoff`: the relay's TCP socket, judged, then served in the
unix connection's place), then its requests: on the callback path while it can
(`fast_exchange`), else one by one (`one_request`), until one says the connection ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Coroutine
from typing import Any, Protocol

from lnk_proxy import limits
from lnk_proxy.conn import Conn
from lnk_proxy.descriptors import may_accept
from lnk_proxy.fair_share import CURRENT
from lnk_proxy.fast_exchange import FastExchange
from lnk_proxy.forward import BadResponse
from lnk_proxy.handed_close import close_conn
from lnk_proxy.handoff import first_read, take_handed
from lnk_proxy.http_request import RequestRefused, refusal_response
from lnk_proxy.limits import ACCEPT_PER_WAKE, ACCEPT_RETRY_S
from lnk_proxy.listeners import Listener, Refusal
from lnk_proxy.one_request import RequestHost, one_request
from lnk_proxy.wire_log import WireEntry, WireLog

__all__ = ["ConnectionHost", "accept_forever", "cancel_all", "spawn"]

log = logging.getLogger(__name__)


class ConnectionHost(RequestHost, Protocol):
    """What a connection uses of the server (`server.ProxyServer`), its requests' included."""

    @property
    def wire_log(self) -> WireLog: ...

    @property
    def descriptor_limit(self) -> int: ...


async def accept_forever(
    host: ConnectionHost,
    listener: Listener,
    listeners: dict[str, Listener],
    fast: FastExchange | None,
) -> None:
    """Accept `listener`'s connections and serve each in its own task; `listeners`: every
    sandbox's (their connections share the proxy's descriptors)."""
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
        if len(listener.connections) >= host.config.max_connections_per_sandbox:
            limit = host.config.max_connections_per_sandbox
            _refuse_now(host, listener, sock, "too-many-connections", f"{limit} already open")
            continue
        others = [len(o.connections) for o in listeners.values() if o is not listener]
        if not may_accept(len(listener.connections), others, host.descriptor_limit):
            reason = "the proxy's descriptors are taken (this sandbox's share is in use)"
            _refuse_now(host, listener, sock, "too-many-descriptors", reason)
            continue
        spawn(listener.connections, _serve(host, listener, sock, fast))


def _refuse_now(
    host: ConnectionHost, listener: Listener, sock: socket.socket, rule: str, reason: str
) -> None:
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(refusal_response(rule))
    sock.close()
    host.wire_log.write(WireEntry(listener.sandbox, "", "", "refused", rule, reason=reason))


async def _serve(
    host: ConnectionHost, listener: Listener, sock: socket.socket, fast: FastExchange | None
) -> None:
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
        handed = await _handed(host, listener, client)  # the relay's TCP socket, or itself
        if handed is None:
            return
        client = handed
        while True:  # the callback path while it can (`fast_exchange`), else one by one
            step = await fast.serve(listener, client) if fast else None
            if not await (one_request(host, listener, client) if step is None else step):
                break
    except (OSError, EOFError, TimeoutError, BadResponse, RequestRefused) as exc:
        log.debug("%s: connection ended: %s", listener.sandbox, exc)
    finally:
        await close_conn(client, listener.closer)  # a handed one off the loop: it may linger


async def _handed(host: ConnectionHost, listener: Listener, client: Conn) -> Conn | None:
    """The connection to serve: `client`, or the TCP socket the sandbox's relay handed over
    on it (`handoff`: judged; `client` closed); None when the hand-off was refused."""
    client.deadline = asyncio.get_running_loop().time() + limits.HEAD_TIMEOUT_S
    try:
        received = await first_read(client)
    finally:
        client.deadline = None
    if not received.is_handoff:
        return client
    taken = take_handed(received)
    if isinstance(taken, Refusal):
        await host.refuse(listener, client, "", "", taken)
        return None
    client.close()
    listener.handed += 1
    return taken


def spawn(tasks: set[asyncio.Task[None]], coroutine: Coroutine[Any, Any, None]) -> None:
    task = asyncio.create_task(coroutine)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def cancel_all(listener: Listener) -> None:
    tasks = [*listener.background, *listener.connections]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
