"""Forged senders of hand-offs (`lnk_proxy.handoff`): root test code in a network namespace of
its own (as a sandbox's is) making TCP connections there and handing them to a listener of the
proxy run alone (`proxy_alone.py`), as a sandbox's relay, or its program, would."""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

from proxy_alone import connect

# The benches' namespace helpers (bench/relay_netns.py): one copy of the setns dance.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from relay_netns import inside, new_namespace

IO_S = 10.0

__all__ = ["IO_S", "fresh_connection", "hand", "inside", "make_blocking", "own_netns"]


@contextlib.contextmanager
def own_netns() -> Iterator[Path]:
    """A network namespace of its own with loopback up: where a sandbox's relay accepts."""
    with ExitStack() as stack:
        yield new_namespace(stack)


def fresh_connection(namespace: Path) -> tuple[socket.socket, socket.socket, socket.socket]:
    """(listener, client, accepted) on 127.0.0.1 of `namespace`, nothing sent yet."""
    with inside(namespace):
        listener = socket.create_server(("127.0.0.1", 0))
        client = socket.socket()
    client.settimeout(IO_S)
    client.connect(listener.getsockname())
    accepted, _ = listener.accept()
    return listener, client, accepted


def hand(path: Path, data: bytes, fds: list[int]) -> bytes:
    """Send `data` with `fds` in one message on a new connection to `path`, as the relay does;
    what the proxy answered there, to its close (by then it took the socket, or refused it)."""
    with connect(path) as sock:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        sock.sendmsg([data], rights)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def make_blocking(kept: socket.socket) -> None:
    """Clear O_NONBLOCK on the open file description a kept copy shares with the proxy's."""
    flags = fcntl.fcntl(kept.fileno(), fcntl.F_GETFL)
    fcntl.fcntl(kept.fileno(), fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
