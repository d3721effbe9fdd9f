"""The benches' hand-off relay (`lnk-sandbox --relay-handoff`) in a network namespace of its
own, as a sandbox's is: the proxy refuses a handed socket of its own namespace
(`lnk_shared.handed_sockets`), so a relay on the host's loopback could not hand anything over.
Its clients make their sockets in that namespace (`inside`) and connect to 127.0.0.1 there;
`NAMESPACES` maps each such relay's port to its namespace, so every dial of a relay port
(`tcp_socket`, `tcp_connect`) goes where that relay listens."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import secrets
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

CLONE_NEWNET = 0x40000000
NAMESPACES: dict[int, Path] = {}  # a hand-off relay's port: its namespace
_LIBC = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def inside(namespace: Path | None) -> Iterator[None]:
    """This thread in `namespace` while the block makes its sockets (None: where it is)."""
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


def new_namespace(stack: ExitStack) -> Path:
    """A network namespace with loopback up, deleted when `stack` closes."""
    name = f"lnkr-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    stack.callback(subprocess.run, ["ip", "netns", "delete", name], check=False)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    return Path("/run/netns") / name


def handoff_argv(stack: ExitStack, binary: Path, listener: Path, port: int) -> list[str]:
    """The argv of a hand-off relay on `port` in a namespace of its own (`ip netns exec`
    execs it: its pid is the relay's)."""
    namespace = new_namespace(stack)
    NAMESPACES[port] = namespace
    name = namespace.name
    return ["ip", "netns", "exec", name, str(binary), "--relay-handoff", str(listener), str(port)]


def tcp_socket(host: str, port: int, timeout: float) -> socket.socket:
    """A connection to host:port, in the namespace of the relay on that port if one is."""
    with inside(NAMESPACES.get(port) if host == "127.0.0.1" else None):
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.settimeout(timeout)
    try:
        sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def tcp_connect(host: str, port: int) -> Callable[[Callable[[], asyncio.Protocol]], Any]:
    """asyncio's `create_connection` to host:port, made in the relay's namespace if any."""
    namespace = NAMESPACES.get(port) if host == "127.0.0.1" else None
    if namespace is None:
        return lambda factory: asyncio.get_running_loop().create_connection(factory, host, port)

    async def connect(factory: Callable[[], asyncio.Protocol]) -> Any:
        loop = asyncio.get_running_loop()
        with inside(namespace):
            sock = socket.socket()
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (host, port))
        except BaseException:
            sock.close()
            raise
        return await loop.create_connection(factory, sock=sock)

    return connect
