"""While the filtering proxy is down, the controller answers for it on the listeners it keeps.

The controller holds every running sandbox's listening socket (`proxy_link.HELD`); with the
proxy dead, a sandbox's connection would sit in that socket's backlog (then hang in connect
once the backlog is full) and its client would wait for its own timeout with no word of why.
`StandIn.serve` asks whether the proxy answers again before each accept (so a connection made
once `lnk box up` has started it waits for the new proxy rather than get the 503: it stays in
the backlog, and `keep_listeners` hands the listener back at once), then accepts each waiting
connection, reads its request head (bounded in size and
time), answers `ANSWER` (an HTTP 503 naming what happened and what to do), reads and drops
what the client still sends (a body: closing on unread bytes would reset the connection and
lose the answer) for at most `LINGER_S` and `MAX_DRAIN` bytes, and closes it; the request goes
nowhere. `proxy_link.keep_listeners` calls it only while the proxy does not
answer, and stops once the proxy is back, before it hands the listeners back.

A connection the sandbox's relay hands over (its client's TCP socket sent with `SCM_RIGHTS`:
`lnk_shared.handed_sockets`, as the proxy receives it) is judged as the proxy judges it, and
the 503 goes to that socket, read and closed as above; a refused hand-off is closed unanswered.

Does NOT: judge or forward anything (every request gets the 503, whatever it asks), nor write
the wire log (nothing was decided or sent; the controller's log counts the 503s); tell a
sandbox apart from another (each held listener is its own sandbox's); keep a connection past
`HEAD_TIMEOUT_S`; answer while the proxy runs but hangs (the proxy answers `list` at once, so
a proxy that does not is counted down: its listeners then get the 503 too, with its
connections in flight left to it).
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from lnk_shared.handed_sockets import Received, receive, take

__all__ = ["ANSWER", "HEAD_TIMEOUT_S", "MAX_PENDING", "StandIn"]

log = logging.getLogger(__name__)

_BODY = (
    b"lnk: the box's filtering proxy is down (it stopped or is being restarted), so nothing was "
    b"sent. The box's administrator runs `lnk box up` to start it; try again then.\n"
)
ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Retry-After: 5\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(_BODY) + _BODY
)
HEAD_TIMEOUT_S = 2.0  # a client sends its head at once; one that does not gets the 503 anyway
MAX_HEAD = 64 * 1024  # the proxy's own head limit: more is read no further
MAX_PENDING = 256  # connections read at once: past it, new ones are answered at once
LINGER_S = 2.0  # after the answer, the client's rest is read this long (it stops on the 503)
MAX_DRAIN = 1 << 20  # and at most this much of it: an upload's first round trips
_CHUNK = 4096


@dataclass
class _Pending:
    sock: socket.socket
    deadline: float
    head: bytearray = field(default_factory=bytearray)
    answered: bool = False
    drained: int = 0
    first: bool = True  # nothing read yet: the read that may carry a hand-off


def head_complete(head: bytes | bytearray) -> bool:
    """Whether a request head has ended (or is past what is read of one)."""
    return b"\r\n\r\n" in head or len(head) >= MAX_HEAD


class StandIn:
    """Answers the held listeners' connections with `ANSWER`; one thread calls it."""

    def __init__(self) -> None:
        self._pending: dict[int, _Pending] = {}
        self.answered = 0

    def serve(self, listeners: list[int], seconds: float, proxy_back: Callable[[], bool]) -> bool:
        """For `seconds`: accept on `listeners` (descriptors, not taken), read each head,
        answer and close. Returns True early, accepting nothing more, when `proxy_back()`
        (asked before each accept) says the proxy answers again."""
        end = time.monotonic() + seconds
        while True:
            now = time.monotonic()
            for fd, pending in list(self._pending.items()):
                if now >= pending.deadline and pending.answered:
                    self._close(fd)
                elif now >= pending.deadline:
                    self._answer(fd)
            left = end - now
            if left <= 0:
                return False
            waits = [p.deadline - now for p in self._pending.values()]
            timeout = min([left, *waits])
            try:
                ready, _, _ = select.select([*listeners, *self._pending], [], [], timeout)
            except (OSError, ValueError):  # a listener closed meanwhile: next round
                return False
            for fd in ready:
                if fd in self._pending:
                    self._read(fd)
                elif proxy_back():  # its connection waits in the backlog for the proxy
                    return True
                else:
                    self._accept(fd)

    def finish(self) -> None:
        """The proxy is back: answer every connection still being read, and close all, now."""
        for fd, pending in list(self._pending.items()):
            if not pending.answered:
                self._answer(fd)
            self._close(fd)

    def _accept(self, listener: int) -> None:
        with contextlib.suppress(OSError):  # gone from the backlog meanwhile
            server = socket.socket(fileno=listener)
            try:
                server.setblocking(False)  # shared with the proxy's copy: it is non-blocking too
                sock, _ = server.accept()
            finally:
                server.detach()  # the descriptor stays HELD's
            sock.setblocking(False)
            self._pending[sock.fileno()] = _Pending(sock, time.monotonic() + HEAD_TIMEOUT_S)
            if len(self._pending) > MAX_PENDING:
                self._answer(sock.fileno())
                self._close(sock.fileno())

    def _read(self, fd: int) -> None:
        pending = self._pending[fd]
        try:
            data = self._first(fd, pending) if pending.first else pending.sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data is None:
            return  # handed over (or refused): the handed socket is read from now on
        if pending.answered:
            pending.drained += len(data)
            if not data or pending.drained >= MAX_DRAIN:
                self._close(fd)
            return
        pending.head += data
        if not data:
            self._answer(fd)
            self._close(fd)
        elif head_complete(pending.head):
            self._answer(fd)

    def _first(self, fd: int, pending: _Pending) -> bytes | None:
        """The first read, with any descriptors: its bytes, or None for a hand-off (the handed
        socket, judged, takes the connection's place; a refused one is closed)."""
        received: Received = receive(pending.sock, _CHUNK)
        pending.first = False
        if not received.is_handoff:
            return received.data
        taken = take(received)
        self._close(fd)
        if isinstance(taken, socket.socket):
            self._pending[taken.fileno()] = _Pending(taken, pending.deadline, first=False)
        else:
            log.info("a hand-off refused while the proxy is down: %s", taken.reason)
        return None

    def _answer(self, fd: int) -> None:
        pending = self._pending[fd]
        with contextlib.suppress(OSError):
            pending.sock.send(ANSWER)  # far below a socket's buffer: never blocks
            pending.sock.shutdown(socket.SHUT_WR)
        pending.answered = True
        pending.deadline = time.monotonic() + LINGER_S
        self.answered += 1
        if self.answered == 1 or self.answered % 1000 == 0:
            log.warning("the proxy is down: %d connection(s) answered 503", self.answered)

    def _close(self, fd: int) -> None:
        self._pending.pop(fd).sock.close()
