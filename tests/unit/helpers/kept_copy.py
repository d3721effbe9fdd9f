"""A handed socket whose sender kept a copy (`lnk_shared.handed_socket`), for the attack tests:
the socket taken as the proxy takes it (`take`; the caller's test judges the loopback pair as
another namespace's), and the copy that clears O_NONBLOCK on the file they share. Each kept
copy gets SO_RCVTIMEO/SO_SNDTIMEO of `BLOCKED_S`, so a call that does block returns after that
instead of hanging the test."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
from collections.abc import Iterator

from lnk_shared.handed_sockets import HEADER, Received, take

__all__ = ["BLOCKED_S", "kept_copy", "make_blocking"]

BLOCKED_S = 1.0  # a blocking call on the kept copy returns after this (SO_RCVTIMEO/SNDTIMEO)


def make_blocking(kept: socket.socket, taken: socket.socket) -> None:
    """The attack, after the proxy set its socket non-blocking: the flag is the file's."""
    flags = fcntl.fcntl(kept.fileno(), fcntl.F_GETFL)
    fcntl.fcntl(kept.fileno(), fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    assert not fcntl.fcntl(taken.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK  # shared: its too


@contextlib.contextmanager
def kept_copy() -> Iterator[tuple[socket.socket, socket.socket, socket.socket]]:
    """(the proxy's taken socket, the sender's kept copy, the client's end)."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    kept, _ = listener.accept()
    listener.close()
    taken = take(Received(HEADER, (os.dup(kept.fileno()),), False))
    assert isinstance(taken, socket.socket), taken
    bound = struct.pack("ll", int(BLOCKED_S), 0)
    kept.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, bound)
    kept.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, bound)
    try:
        yield taken, kept, client
    finally:
        for sock in (taken, kept, client):
            sock.close()
