"""Probe steps against the shared proxy's per-sandbox caps (`plan_caps.py` says what and why).

Part of the probe program (`probes.py`, which merges `STEPS` into its own table), run INSIDE
the sandbox with the box's Python (standard library only). Each step reports "through" when
its attempt worked (every tunnel held, or a flood request not refused) and decides nothing
else: the outside reads the proxy's wire log (`verdicts.py`).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from typing import Any

__all__ = ["STEPS", "proxy_address"]

NET_TIMEOUT_S = 10.0  # one proxy answer; far above a loaded box's
HEAD_LIMIT = 4096  # a proxy's answer head is a few hundred bytes


def proxy_address() -> tuple[str, int] | None:
    """The proxy's (host, port) from HTTP_PROXY, as the box sets it; None when unset or not
    `http://HOST:PORT` (the one reading of it for every probe module)."""
    url = os.environ.get("HTTP_PROXY", "")
    if not url.startswith("http://"):
        return None
    host, _, port = url[len("http://") :].rstrip("/").rpartition(":")
    return (host, int(port)) if port.isdigit() else None


def _connect(address: tuple[str, int], target: str) -> tuple[socket.socket, str]:
    """A CONNECT to `target` through the proxy: the socket (open) and the answer's status line
    and body start ("" when the proxy closed without answering)."""
    sock = socket.create_connection(address, timeout=NET_TIMEOUT_S)
    try:
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer and len(answer) < HEAD_LIMIT:
            chunk = sock.recv(HEAD_LIMIT)
            if not chunk:
                break
            answer += chunk
    except BaseException:
        sock.close()
        raise
    status = answer.split(b"\r\n", 1)[0].decode("latin-1")
    body = answer.partition(b"\r\n\r\n")[2][:100].decode("latin-1").strip()
    return sock, f"{status} {body}".strip()


def _hold(step: dict[str, Any]) -> dict[str, Any]:
    """Hold tunnels until the proxy refuses one, or something else ends them (the sandbox's
    own descriptor limit; or its relay's thread and descriptor limits, where the relay still
    relays bytes: Linux < 5.14); then ask once more, so a proxy that fell
    over (every sandbox's way out) is told from one that held."""
    address = proxy_address()
    if address is None:
        return {"outcome": "stopped", "detail": "no proxy (HTTP_PROXY unset)", "data": ""}
    held: list[socket.socket] = []
    ended = ""
    try:
        for _ in range(int(step["count"])):
            try:
                sock, answer = _connect(address, step["target"])
            except OSError as exc:
                ended = f"stopped after {len(held)} tunnels by {type(exc).__name__}"
                break
            if not answer.startswith("HTTP/1.1 200"):
                sock.close()
                ended = f"refused after {len(held)} tunnels: {answer}"
                break
            held.append(sock)  # never read: what the origin sends waits in the proxy
    finally:
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()
    if not ended:
        detail = f"held {len(held)} tunnels open and unread"
        return {"outcome": "through", "detail": detail, "data": ""}
    try:
        again, answer = _connect(address, step["target"])
        again.close()
    except OSError as exc:
        answer = type(exc).__name__
    if not answer.startswith(("HTTP/1.1 200", "HTTP/1.1 403")):
        detail = f"{ended}; then the proxy did not answer ({answer or 'closed'})"
        return {"outcome": "through", "detail": detail[:200], "data": ""}
    return {"outcome": "stopped", "detail": f"{ended}; the proxy still answers"[:200], "data": ""}


def _flood(step: dict[str, Any]) -> dict[str, Any]:
    address = proxy_address()
    if address is None:
        return {"outcome": "stopped", "detail": "no proxy (HTTP_PROXY unset)", "data": ""}
    refused, unanswered, other = 0, 0, ""
    for _ in range(int(step["count"])):
        sock, answer = _connect(address, step["target"])
        sock.close()
        if answer.startswith("HTTP/1.1 403"):
            refused += 1
        elif not answer:
            unanswered += 1  # closed unanswered: not through, and not the proxy's refusal
        elif not other:
            other = answer
    if other:
        detail = f"{refused} refused, others answered: {other}"[:200]
        return {"outcome": "through", "detail": detail, "data": ""}
    detail = f"{refused} refused" + (f", {unanswered} closed unanswered" if unanswered else "")
    return {"outcome": "stopped", "detail": detail, "data": ""}


STEPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "proxy_hold": _hold,
    "proxy_flood": _flood,
}
