"""Closing handed sockets (`lnk_proxy.handed_close`): a sender that kept its copy sets
SO_LINGER on it, stops reading at the client's end, and closes its copy, so the proxy's close
is the last and would wait for unsent bytes: the loop must not wait with it. When the race
against `HandedSocket.close`'s lingering off is won (simulated: its "off" made "on"), the
close waits in that sandbox's thread only, its task held, another sandbox's closes unaffected."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from collections.abc import Iterator

import pytest
from loop_stall import MAX_GAP_S, longest_stall

from lnk_proxy.conn import Conn
from lnk_proxy.handed_close import HandedCloser, close_conn
from lnk_shared import handed_socket, handed_sockets
from lnk_shared.handed_sockets import HEADER, Received, take

LINGER_S = 2  # the attacker's SO_LINGER: a close that lingers waits this long
RECEIVE_BUFFER = 4096


@pytest.fixture(autouse=True)
def another_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handed_sockets, "own_netns_cookie", lambda: -1)


@contextlib.contextmanager
def lingering(unsent: bool = True) -> Iterator[tuple[Conn, socket.socket]]:
    """(the proxy's connection on a handed socket with unsent bytes (unless not `unsent`) and
    SO_LINGER set by the kept copy, which is closed; the client end, which never reads)."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    client.connect(listener.getsockname())
    kept, _ = listener.accept()
    listener.close()
    taken = take(Received(HEADER, (os.dup(kept.fileno()),), False))
    assert isinstance(taken, socket.socket), taken
    conn = Conn(taken)
    with contextlib.suppress(BlockingIOError):
        while unsent:  # bytes the client will never take: they stay unsent
            taken.send(b"a" * 65536)
    kept.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, LINGER_S))
    kept.close()  # the proxy's close is the last now
    try:
        yield conn, client
    finally:
        client.close()
        if taken.fileno() >= 0:
            taken.close()


def test_a_kept_copy_that_set_so_linger_cannot_make_the_proxys_close_wait() -> None:
    async def run() -> None:
        with lingering() as (conn, _):
            closer = HandedCloser("a")
            stall = await longest_stall(close_conn(conn, closer), 2 * LINGER_S)
            assert stall < MAX_GAP_S, f"the loop stalled {stall:.2f} s in a close"
            assert conn.sock.fileno() == -1

    asyncio.run(run())


def test_a_close_that_lingers_anyway_waits_in_its_sandboxs_thread_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The race won: the other holder set SO_LINGER again after the proxy turned it off. The
    # other sandbox's socket has nothing unsent: its close, lingering or not, ends at once.
    monkeypatch.setattr(handed_socket, "_NO_LINGER", struct.pack("ii", 1, LINGER_S))

    async def run() -> None:
        loop = asyncio.get_running_loop()
        with lingering() as (conn, _), lingering(unsent=False) as (other, _):
            mine, theirs = HandedCloser("mine"), HandedCloser("theirs")
            started = loop.time()
            closing = asyncio.ensure_future(close_conn(conn, mine))
            await asyncio.sleep(0.1)
            stall = await longest_stall(close_conn(other, theirs), LINGER_S)
            assert stall < MAX_GAP_S, f"the loop stalled {stall:.2f} s"
            assert other.sock.fileno() == -1, "another sandbox's close waited behind it"
            assert not closing.done(), "the lingering close's task did not wait for it"
            await asyncio.wait_for(closing, 3 * LINGER_S)
            assert loop.time() - started >= LINGER_S - 0.5  # it did linger, in its thread

    asyncio.run(run())


def test_abandoning_ends_the_wait_and_the_socket_is_still_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handed_socket, "_NO_LINGER", struct.pack("ii", 1, LINGER_S))

    async def run() -> None:
        with lingering() as (conn, _):
            closer = HandedCloser("gone")
            closing = asyncio.ensure_future(close_conn(conn, closer))
            await asyncio.sleep(0.1)
            closer.abandon()
            await asyncio.wait_for(closing, 0.5)  # at once, not after the linger
            for _ in range(int(3 * LINGER_S / 0.05)):
                if conn.sock.fileno() == -1:
                    break
                await asyncio.sleep(0.05)
            assert conn.sock.fileno() == -1

    asyncio.run(run())


def test_one_thread_serves_a_sandboxs_closes_in_a_row() -> None:
    async def run() -> None:
        closer = HandedCloser("row")
        for _ in range(5):
            with lingering() as (conn, _):
                await asyncio.wait_for(close_conn(conn, closer), 1.0)
        assert closer.threads_started == 1

    asyncio.run(run())


def test_an_ordinary_connection_is_closed_at_once_in_the_loop() -> None:
    async def run() -> None:
        near, far = socket.socketpair()
        with far:
            conn = Conn(near)
            closer = HandedCloser("unix")
            await close_conn(conn, closer)
            assert near.fileno() == -1 and closer.threads_started == 0

    asyncio.run(run())
