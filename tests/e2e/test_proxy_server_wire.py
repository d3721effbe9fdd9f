"""The filtering proxy alone (`proxy_alone.py`, no sandbox), on the wire: a stop flag closes a
listener's open tunnels and refuses what follows, a pause refuses new requests and keeps open
tunnels, closing a listener closes its tunnels and socket; and the wire's log has one line per
decision, its names cut and cleaned."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from net import OTHER, WWW, TestInternet
from proxy_alone import (
    STOP_SEEN_S,
    Proxy,
    alone_proxy,
    ask,
    connect,
    connect_request,
    counts,
    get,
    read_response,
)

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]


@pytest.fixture(scope="module")
def proxy(internet: TestInternet) -> Iterator[Proxy]:
    with alone_proxy(internet) as built:
        yield built


# -- wire state: stop, pause, close ------------------------------------------------------------


def open_tunnel(path: Path) -> socket.socket:
    """A CONNECT tunnel to www:80 that has carried one request."""
    sock = connect(path)
    sock.sendall(connect_request(f"{WWW}:80"))
    assert read_response(sock)[0] == b"HTTP/1.1 200 Connection Established"
    sock.sendall(f"GET / HTTP/1.1\r\nHost: {WWW}\r\n\r\n".encode())
    assert read_response(sock)[1] == f"{WWW}\n".encode()
    return sock


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_stop_flag_closes_open_tunnels_and_refuses_new_requests(proxy: Proxy) -> None:
    path = proxy.open("sbx-stop", internet=[WWW])
    flag = proxy.flags / "sbx-stop.stop"
    try:
        tunnel = open_tunnel(path)
        idle = connect(path)  # a keep-alive connection between requests
        flag.touch()
        assert closed_within(tunnel, STOP_SEEN_S)
        assert closed_within(idle, STOP_SEEN_S)
        tunnel.close()
        idle.close()
        assert ask(path, get(WWW))[1] == b"lnk: refused (stopped)\n"
        entries = proxy.log("sbx-stop", 2)
        assert [e["rule"] for e in entries] == ["allowed-internet", "stopped"]
        assert "stopped" in entries[0]["error"]
        assert entries[0]["up"] > 0 and entries[0]["down"] > 0
    finally:
        flag.unlink(missing_ok=True)
        proxy.admin({"op": "close", "sandbox": "sbx-stop"})


def test_a_pause_refuses_new_requests_keeps_open_tunnels_and_resume_works(
    proxy: Proxy,
) -> None:
    path = proxy.open("sbx-pause", internet=[WWW])
    flag = proxy.flags / "sbx-pause.pause"
    try:
        tunnel = open_tunnel(path)
        flag.touch()
        assert ask(path, get(WWW))[1] == b"lnk: refused (paused)\n"
        assert ask(path, connect_request(f"{WWW}:443"))[1] == b"lnk: refused (paused)\n"
        # An open tunnel stays open while paused (documented): only a stop closes it.
        tunnel.sendall(f"GET / HTTP/1.1\r\nHost: {WWW}\r\n\r\n".encode())
        assert read_response(tunnel)[1] == f"{WWW}\n".encode()
        flag.unlink()
        assert ask(path, get(WWW))[1] == f"{WWW}\n".encode()  # resumed, no restart
        tunnel.close()
    finally:
        flag.unlink(missing_ok=True)
        proxy.admin({"op": "close", "sandbox": "sbx-pause"})


def test_closing_a_listener_closes_its_tunnels_and_socket(proxy: Proxy) -> None:
    path = proxy.open("sbx-close", internet=[WWW])
    tunnel = open_tunnel(path)
    assert proxy.admin({"op": "close", "sandbox": "sbx-close"}) == {"ok": True}
    assert closed_within(tunnel, STOP_SEEN_S)
    tunnel.close()
    assert not path.exists()


# -- the wire's log --------------------------------------------------------------------------


def test_the_log_has_one_line_per_decision(proxy: Proxy, internet: TestInternet) -> None:
    path = proxy.open("sbx-log", internet=[WWW])
    try:
        ask(path, get(WWW))
        proxy.log("sbx-log", 1)  # lines come in the order exchanges end, not begin
        ask(path, get(OTHER))
        ask(path, connect_request("127.0.0.1:22"))
        entries = proxy.log("sbx-log", 3)
        assert [(e["decision"], e["rule"]) for e in entries] == [
            ("allowed", "allowed-internet"),
            ("refused", "not-listed"),
            ("refused", "never-loopback"),
        ]
        assert entries[0]["address"] == internet.www.address
        assert entries[0]["target"] == f"http://{WWW}/"
        assert entries[0]["method"] == "GET" and entries[0]["down"] > 0
        mode = (proxy.wire / "sbx-log.log").stat().st_mode & 0o777
        assert mode == 0o640
    finally:
        proxy.admin({"op": "close", "sandbox": "sbx-log"})


def test_a_10_kb_hostname_and_escape_sequences_are_cut_and_cleaned(
    proxy: Proxy, internet: TestInternet
) -> None:
    path = proxy.open("sbx-names", internet=[WWW])
    try:
        before = counts(internet)
        huge = "a" * 10_000 + ".example"
        assert ask(path, connect_request(f"{huge}:443"))[1] == b"lnk: refused (head-too-large)\n"
        long = ".".join(["b" * 60] * 100) + ".example"  # ~6 kB, under the line limit
        assert ask(path, connect_request(f"{long}:443"))[1] == b"lnk: refused (bad-host)\n"
        escape = f"CONNECT \x1b[31m\x1b]0;pwned\x07{WWW}:443 HTTP/1.1\r\n\r\n".encode()
        assert ask(path, escape)[1] == b"lnk: refused (bad-request-line)\n"
        assert counts(internet) == before
        entries = proxy.log("sbx-names", 3)
        assert [e["rule"] for e in entries] == ["head-too-large", "bad-host", "bad-request-line"]
        for entry in entries:
            assert len(entry["target"]) <= 300
            for text in (entry["target"], entry["reason"]):
                assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)
        assert len(entries[0]["target"]) == 300 and entries[0]["target"].startswith("aaaa")
        assert len(entries[1]["target"]) == 300
        assert "pwned" in entries[2]["target"] and "\x1b" not in entries[2]["target"]
    finally:
        proxy.admin({"op": "close", "sandbox": "sbx-names"})
