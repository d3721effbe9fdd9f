"""Forged senders of hand-offs (`lnk_proxy.handoff`): root test code in a network namespace of
its own (as a sandbox's is) making TCP connections there and handing them to a listener of the
proxy run alone (`proxy_alone.py`), as a sandbox's relay, or its program, would."""

from __future__ import annotations

import array
import contextlib
import ctypes
import fcntl
import os
import secrets
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

from proxy_alone import connect

IO_S = 10.0
CLONE_NEWNET = 0x40000000
_LIBC = ctypes.CDLL(None, use_errno=True)

__all__ = ["IO_S", "fresh_connection", "hand", "inside", "make_blocking", "own_netns"]


@contextlib.contextmanager
def own_netns() -> Iterator[Path]:
    """A network namespace of its own with loopback up: where a sandbox's relay accepts."""
    name = f"lnkh-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield Path("/run/netns") / name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


@contextlib.contextmanager
def inside(namespace: Path | None) -> Iterator[None]:
    """This thread in `namespace` (None: where it is) while the block makes its sockets."""
    if namespace is None:
        yield
        return
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(namespace, os.O_RDONLY)
    try:
        if _LIBC.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")
        try:
            yield
        finally:
            if _LIBC.setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
    finally:
        os.close(own)
        os.close(target)


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
