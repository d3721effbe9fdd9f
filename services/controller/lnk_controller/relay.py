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

__all__ = ["RELAY_HOST", "serve_forever", "start_relay"]

RELAY_HOST = "127.0.0.1"  # the sandbox's own loopback: nothing outside its namespace sees it
BUFFER = 256 * 1024  # bytes per read: large reads keep a tunnel near the speed of the proxy
MAX_ANSWER = 4096  # the proxy's answer to a CONNECT: a status line and a few headers
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


def _connect_localhost(upstream: socket.socket, port: int) -> bool:
    """Ask the proxy for this machine's `[localhost]` port: a CONNECT it answers 200 or not."""
    upstream.sendall(
        f"CONNECT localhost:{port} HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head and len(head) < MAX_ANSWER:
        chunk = upstream.recv(MAX_ANSWER - len(head))
        if not chunk:
            return False
        head += chunk
    return head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200"))


def _serve(listener: socket.socket, proxy_socket: str, localhost_port: int | None) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(proxy_socket)
            if localhost_port is not None and not _connect_localhost(upstream, localhost_port):
                raise ConnectionRefusedError
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _listen(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((RELAY_HOST, port))
    listener.listen(BACKLOG)
    return listener


def _serve_all(listeners: list[tuple[socket.socket, int | None]], proxy_socket: str) -> None:
    for listener, local in listeners[1:]:
        threading.Thread(target=_serve, args=(listener, proxy_socket, local), daemon=True).start()
    _serve(listeners[0][0], proxy_socket, None)


def serve_forever(proxy_socket: str, port: int) -> None:
    """Serve the proxy on 127.0.0.1:port in this process, until it is killed (the benchmark
    measures the relay this way; a sandbox gets it from `start_relay`)."""
    _serve_all([(_listen(port), None)], proxy_socket)


def start_relay(proxy_socket: str, port: int, localhost_ports: list[int] | None = None) -> None:
    """Listen on 127.0.0.1:port (the proxy) and on each `[localhost]` port (forwarded raw to
    that port of this machine, through the proxy, which checks it is granted); detach a relay
    process serving them all; return at once."""
    listeners: list[tuple[socket.socket, int | None]] = [(_listen(port), None)]
    listeners += [(_listen(p), p) for p in localhost_ports or []]
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked relay
        try:
            if os.fork() == 0:  # the grandchild: re-parented to bwrap's init, ends with it
                _serve_all(listeners, proxy_socket)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    for listener, _ in listeners:
        listener.close()
