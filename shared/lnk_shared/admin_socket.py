"""A service's admin socket, both ends: how the controller commands the proxy and the store
bridge, and how `lnk box up` asks whether one is up.

The service binds `<run_dir>/<its folder>/admin.sock`, mode 0600 in its own folder (mode 0700:
the service's user and root reach them, no host user does). Each connection is checked with
SO_PEERCRED: any uid but the controller's is closed with no answer. Then JSON frames
(`lnk_shared.unix`), one reply per command, until the controller closes the connection. What a
frame means is the service's own (its `parse_command`, pure, reads every field as hostile): a
handler here takes an untrusted frame and the descriptors that came with it and returns the
reply and the descriptors to send; a ValueError it raises is answered `{"ok": false, "error":
...}`. The same loop runs on a thread (`serve_connection`, the bridge's) or on an event loop
with the blocking reads on threads (`serve_connection_async`, the proxy's); `serve_admin_threads`
and `serve_admin_async` bind the socket and accept for each.

Security limitations: the peer's uid is the only credential (as of its connect); this does NOT
check which process holds it, nor limit how often the controller asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lnk_shared.errors import StateError
from lnk_shared.unix import bind_socket, peer_cred, recv_frame, send_frame
from lnk_shared.waking_event import WakingEvent

__all__ = [
    "ADMIN_SOCKET_MODE",
    "ADMIN_SOCKET_NAME",
    "ADMIN_TIMEOUT_S",
    "SERVICE_DIR_MODE",
    "AsyncHandler",
    "Handler",
    "admin_answers",
    "admin_socket_in",
    "bind_admin_socket",
    "call_admin",
    "serve_admin_async",
    "serve_admin_threads",
    "serve_connection",
    "serve_connection_async",
]

log = logging.getLogger(__name__)

ADMIN_SOCKET_NAME = "admin.sock"
ADMIN_SOCKET_MODE = 0o600  # the service's user, and root (the controller) past every mode
SERVICE_DIR_MODE = 0o700  # its folder likewise: host users reach neither it nor what is in it
ADMIN_TIMEOUT_S = 10.0  # a frame from the controller comes at once; a stall is a dead peer

Reply = tuple[dict[str, Any], list[int]]  # the answer, and the descriptors sent with it
# (untrusted frame, descriptors that came with it: the handler's to keep or close) -> Reply
Handler = Callable[[dict[str, Any], list[int]], Reply]
AsyncHandler = Callable[[dict[str, Any], list[int]], Awaitable[Reply]]
# What ends a connection with no answer: a broken frame or peer, a frame nested past the parser
_ENDS_CONNECTION = (OSError, ValueError, RecursionError)


def admin_socket_in(run_dir: Path, folder: str) -> Path:
    """Where the service whose own folder is `<run_dir>/<folder>` has its admin socket."""
    return run_dir / folder / ADMIN_SOCKET_NAME


def bind_admin_socket(path: Path) -> socket.socket:
    """The listening admin socket, mode 0600, in its folder set to 0700."""
    return bind_socket(path, mode=ADMIN_SOCKET_MODE, dir_mode=SERVICE_DIR_MODE)


def _from_controller(sock: socket.socket, controller_uid: int) -> bool:
    cred = peer_cred(sock)
    if cred.uid != controller_uid:
        log.warning("admin socket: uid %d (pid %d) is not the controller", cred.uid, cred.pid)
        return False
    return True


def _error_reply(exc: ValueError, fds: list[int]) -> Reply:
    """The answer to a frame its handler refused; the descriptors it did not take are closed."""
    for fd in fds:
        os.close(fd)
    return {"ok": False, "error": str(exc)}, []


def serve_connection(
    sock: socket.socket, controller_uid: int, handle: Handler, *, want_fds: bool = False
) -> None:
    """Serve one admin connection on this thread: frames until the controller closes it."""
    try:
        if not _from_controller(sock, controller_uid):
            return
        sock.settimeout(ADMIN_TIMEOUT_S)
        while True:
            try:
                untrusted, fds = recv_frame(sock, want_fds=want_fds)
            except EOFError:
                return
            try:
                reply, sent = handle(untrusted, fds)
            except ValueError as exc:
                reply, sent = _error_reply(exc, fds)
            send_frame(sock, reply, sent)
    except _ENDS_CONNECTION as exc:
        log.warning("admin connection ended: %s", exc)
    finally:
        sock.close()


async def serve_connection_async(
    sock: socket.socket,
    controller_uid: int,
    handle: AsyncHandler,
    executor: Executor | None = None,
    *,
    want_fds: bool = False,
) -> None:
    """Serve one admin connection on the running loop, its blocking frame reads and writes on
    `executor` (the loop's default one when None), so a stalled peer holds no loop time."""
    loop = asyncio.get_running_loop()
    try:
        if not _from_controller(sock, controller_uid):
            return
        sock.setblocking(True)
        sock.settimeout(ADMIN_TIMEOUT_S)
        while True:
            try:
                untrusted, fds = await loop.run_in_executor(
                    executor, lambda: recv_frame(sock, want_fds=want_fds)
                )
            except EOFError:
                return
            try:
                reply, sent = await handle(untrusted, fds)
            except ValueError as exc:
                reply, sent = _error_reply(exc, fds)
            await loop.run_in_executor(executor, send_frame, sock, reply, sent)
    except _ENDS_CONNECTION as exc:
        log.warning("admin connection ended: %s", exc)
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes a frame read blocked in its thread
        sock.close()


def serve_admin_threads(
    path: Path, controller_uid: int, handle: Handler, stop: WakingEvent
) -> None:
    """Bind the admin socket and serve it until `stop` is set, each connection on a thread of
    its own; the socket is removed at the end. At rest it sleeps in one `select` on the socket
    and `stop` (no timeout: nothing wakes it but a connection or the stop)."""
    stop_fd = stop.fileno()  # before the bind: a stop it cannot wait on fails here, not later
    listening = bind_admin_socket(path)
    listening.setblocking(False)
    try:
        while not stop.is_set():
            ready, _, _ = select.select([listening.fileno(), stop_fd], [], [])
            if listening.fileno() not in ready:
                continue
            try:
                sock, _ = listening.accept()
            except (BlockingIOError, InterruptedError):  # a client that gave up meanwhile
                continue
            sock.setblocking(True)
            sock.settimeout(ADMIN_TIMEOUT_S)
            threading.Thread(
                target=serve_connection, args=(sock, controller_uid, handle), daemon=True
            ).start()
    finally:
        listening.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


async def serve_admin_async(
    path: Path,
    serve_one: Callable[[socket.socket, ThreadPoolExecutor], Coroutine[Any, Any, None]],
    *,
    threads: int,
    thread_name: str,
) -> None:
    """Bind the admin socket and accept on the running loop until cancelled, each connection
    served by `serve_one` (`serve_connection_async`, with the service's handler) with its
    blocking frame calls on `threads` threads of their own; at the end the connections are
    cancelled and the socket removed."""
    listening = bind_admin_socket(path)
    listening.setblocking(False)
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()
    executor = ThreadPoolExecutor(threads, thread_name_prefix=thread_name)
    try:
        while True:
            sock, _ = await loop.sock_accept(listening)
            task = asyncio.create_task(serve_one(sock, executor))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        listening.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        executor.shutdown(wait=False, cancel_futures=True)


def call_admin(
    path: Path,
    message: dict[str, Any],
    fds: list[int] | None = None,
    *,
    service: str,
    timeout: float = ADMIN_TIMEOUT_S,
) -> Reply:
    """One command to a service's admin socket: its untrusted answer and the descriptors that
    came with it (the caller's to close). A service that does not answer is the box's state
    (StateError, exit 1, naming `service` and how to start it), not a refusal."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        send_frame(sock, message, fds)
        return recv_frame(sock, want_fds=True)
    except (OSError, EOFError, ValueError) as exc:
        raise StateError(
            f"the {service} does not answer at {path} ({exc}); `lnk box up` starts it"
        ) from None
    finally:
        sock.close()


def admin_answers(path: Path, timeout: float) -> bool:
    """Whether the service answers a ping on its admin socket now (the caller must be the
    controller's uid, or the service closes the connection with no answer)."""
    try:
        answer, fds = call_admin(path, {"op": "ping"}, service="service", timeout=timeout)
    except StateError:
        return False
    for fd in fds:
        os.close(fd)
    return answer.get("ok") is True
