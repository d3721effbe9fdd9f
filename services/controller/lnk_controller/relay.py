"""The relay inside a sandbox: serves the sandbox's proxy listener (a unix socket the controller
bound in) on 127.0.0.1 of the sandbox's own network namespace, where HTTP_PROXY points.

It only moves bytes: every decision is the proxy's, outside. It runs as the sandbox's user,
under the same Landlock and seccomp filter as the program (but before the unix-socket block,
which it is the one exception to), as a grandchild re-parented to bwrap's init, so it ends with
the sandbox. It reaches nothing but the one socket it was given.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading

__all__ = ["RELAY_HOST", "start_relay"]

RELAY_HOST = "127.0.0.1"  # the sandbox's own loopback: nothing outside its namespace sees it
BUFFER = 256 * 1024  # bytes per read: large reads keep a tunnel near the speed of the proxy
BACKLOG = 128  # connections waiting for the relay: a burst of parallel downloads


def _pump(source: socket.socket, sink: socket.socket) -> None:
    buffer = bytearray(BUFFER)
    view = memoryview(buffer)
    try:
        while n := source.recv_into(buffer):
            sink.sendall(view[:n])
    except OSError:
        pass
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                sock.shutdown(how)


def _serve(listener: socket.socket, proxy_socket: str) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(proxy_socket)
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def start_relay(proxy_socket: str, port: int) -> None:
    """Listen on 127.0.0.1:port and detach a relay process serving it; return at once."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((RELAY_HOST, port))
    listener.listen(BACKLOG)
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked relay
        try:
            if os.fork() == 0:  # the grandchild: re-parented to bwrap's init, ends with it
                _serve(listener, proxy_socket)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    listener.close()
