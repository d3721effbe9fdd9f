"""One request on the coroutine path (`one_request`) with a stand-in server: each refusal is
answered and recorded with its rule, and a cap is taken before any decision is asked."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from proxy_fake_host import FakeHost, listener_at

from lnk_proxy import limits
from lnk_proxy.conn import Conn
from lnk_proxy.http_request import refusal_response
from lnk_proxy.listeners import Refusal
from lnk_proxy.one_request import one_request


def served(host: FakeHost, sent: bytes, *, close: bool = True) -> tuple[bool, bytes]:
    """`sent` from a sandbox's side, one request served; whether the connection may go on,
    and what the sandbox got."""

    async def run() -> tuple[bool, bytes]:
        ours, theirs = socket.socketpair()
        listener = listener_at(Path("/nonexistent"))
        try:
            theirs.sendall(sent)
            if close:
                theirs.shutdown(socket.SHUT_WR)
            keeps = await one_request(host, listener, Conn(ours))
            ours.close()
            theirs.settimeout(5)
            return keeps, b"".join(iter(lambda: theirs.recv(65536), b""))
        finally:
            ours.close()
            theirs.close()
            listener.sock.close()

    return asyncio.run(run())


def test_a_slow_head_is_refused_once_its_time_is_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "HEAD_TIMEOUT_S", 0.2)
    host = FakeHost(tmp_path)
    keeps, answer = served(host, b"GET http://a.example/ HTTP/1.1\r\nHost: a.exa", close=False)
    assert (keeps, answer) == (False, refusal_response("head-timeout"))
    assert host.decider.asked == 0


def test_a_bad_head_is_refused_with_its_method_and_target_logged(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    keeps, answer = served(host, b"GET http://a.example/ HTTP/1.1\r\n\r\n")  # no Host
    assert not keeps
    method, target, refusal = host.refused[0]
    assert (method, target) == ("GET", "http://a.example/")
    assert answer == refusal_response(refusal.rule)
    assert host.decider.asked == 0


def test_a_connect_past_the_tunnel_cap_is_refused_before_any_decision(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, max_tunnels_per_sandbox=1)

    async def run() -> list[Refusal]:
        ours, theirs = socket.socketpair()
        listener = listener_at(tmp_path)
        listener.tunnels = 1  # the one slot taken
        theirs.sendall(b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n")
        try:
            assert not await one_request(host, listener, Conn(ours))
            assert listener.tunnels == 1
        finally:
            ours.close()
            theirs.close()
            listener.sock.close()
        return [r for _, _, r in host.refused]

    refusals = asyncio.run(run())
    assert [r.rule for r in refusals] == ["too-many-tunnels"]
    assert host.decider.asked == 0


def test_a_refused_connect_gives_back_its_tunnel_slot(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, verdict=Refusal("paused", "the sandbox's pause flag is set"))

    async def run() -> tuple[int, int]:
        ours, theirs = socket.socketpair()
        listener = listener_at(tmp_path)
        theirs.sendall(b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n")
        try:
            assert not await one_request(host, listener, Conn(ours))
        finally:
            ours.close()
            theirs.close()
            listener.sock.close()
        return listener.tunnels, listener.buffers

    assert asyncio.run(run()) == (0, 0)
    assert [r.rule for _, _, r in host.refused] == ["paused"]
