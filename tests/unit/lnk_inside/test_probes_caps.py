"""The cap probes' steps against a stand-in proxy on loopback (a real socket): tunnels are held
open and unread until the proxy refuses one, a flood counts the proxy's refusals, and any other
answer is reported as having got through."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from lnk_inside.probes import run_step

CAP = 5  # the stand-in's tunnel cap
REFUSAL = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 32\r\n\r\nlnk: refused (too-many-tunnels)\n"


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[socket.socket]]:
    """Answers 200 to the first CAP CONNECTs to www:80 (kept open), 403 to every other."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)
    done = threading.Event()
    opened: list[socket.socket] = []

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.settimeout(5)
            head = conn.recv(4096)
            if head.startswith(b"CONNECT www:80 ") and len(opened) < CAP:
                conn.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                opened.append(conn)
                continue
            with conn:
                conn.sendall(REFUSAL)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.getsockname()[1]}")
    try:
        yield opened
    finally:
        done.set()
        thread.join(timeout=5)
        for conn in opened:
            conn.close()
        server.close()


def test_tunnels_are_held_until_the_proxy_refuses_one(proxy: list[socket.socket]) -> None:
    result = run_step({"id": "t", "kind": "proxy_hold", "target": "www:80", "count": CAP + 3})
    assert result["outcome"] == "stopped"
    assert result["detail"].startswith(f"refused after {CAP} tunnels: HTTP/1.1 403")
    assert "too-many-tunnels" in result["detail"]
    assert result["detail"].endswith("; the proxy still answers")
    # every tunnel was closed by the probe when it ended
    for conn in proxy:
        assert conn.recv(1) == b""


def test_every_tunnel_held_got_through(proxy: list[socket.socket]) -> None:
    result = run_step({"id": "t", "kind": "proxy_hold", "target": "www:80", "count": CAP})
    assert (result["outcome"], result["detail"]) == (
        "through",
        f"held {CAP} tunnels open and unread",
    )


def test_a_flood_refused_every_time_is_stopped(proxy: list[socket.socket]) -> None:
    result = run_step({"id": "f", "kind": "proxy_flood", "target": "127.0.0.1:9", "count": 40})
    assert (result["outcome"], result["detail"]) == ("stopped", "40 refused")


def test_a_flood_request_answered_otherwise_got_through(proxy: list[socket.socket]) -> None:
    result = run_step({"id": "f", "kind": "proxy_flood", "target": "www:80", "count": CAP + 2})
    assert result["outcome"] == "through"
    assert result["detail"].startswith("2 refused, others answered: HTTP/1.1 200")


def test_without_a_proxy_both_are_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    for kind in ("proxy_hold", "proxy_flood"):
        step = {"id": "x", "kind": kind, "target": "www:80", "count": 1}
        assert run_step(step)["outcome"] == "stopped"


def test_a_proxy_that_stops_answering_after_the_tunnels_got_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stand-in that takes CAP tunnels, then closes every connection unanswered (a proxy
    that fell over): the sandbox knocked out every sandbox's way out."""
    server = socket.create_server(("127.0.0.1", 0))
    kept: list[socket.socket] = []

    def serve() -> None:
        while len(kept) < CAP + 2:
            conn, _ = server.accept()
            conn.recv(4096)
            if len(kept) < CAP:
                conn.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:
                conn.close()  # unanswered, as a dead proxy's relay would
            kept.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.getsockname()[1]}")
    try:
        result = run_step({"id": "t", "kind": "proxy_hold", "target": "www:80", "count": 50})
    finally:
        thread.join(timeout=5)
        for conn in kept:
            conn.close()
        server.close()
    assert result["outcome"] == "through"
    assert result["detail"].startswith(f"refused after {CAP} tunnels")
    assert "then the proxy did not answer" in result["detail"]
