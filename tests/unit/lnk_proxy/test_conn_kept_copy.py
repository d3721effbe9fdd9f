"""A handed socket whose sender kept a copy (`lnk_proxy.handoff`, `lnk_shared.handed_socket`):
the open file description is shared, so the other holder clears O_NONBLOCK after the hand-off
and then does not read while the proxy writes, or takes the bytes the selector announced. The
proxy's reads, writes and tunnels on that socket must never wait in the kernel: a heartbeat on
the same event loop must keep beating. The socket is taken as the proxy takes it (`take`,
its namespace judgement told the socket is another namespace's).

Each kept copy gets SO_RCVTIMEO/SO_SNDTIMEO of `BLOCKED_S`, so a call that does block (the
proxy's before this) returns after that instead of hanging the test: its heartbeat gap is
what fails."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
from kept_copy import BLOCKED_S, kept_copy, make_blocking
from loop_stall import MAX_GAP_S, longest_stall

from lnk_proxy.conn import Conn, tunnel
from lnk_shared import handed_sockets

ANSWER = 16 * 1024 * 1024  # far more than every buffer between the proxy and the reader


@pytest.fixture(autouse=True)
def another_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loopback pair is the test's own namespace: judged as another's, as a sandbox's is."""
    monkeypatch.setattr(handed_sockets, "own_netns_cookie", lambda: -1)


def test_a_kept_copy_made_blocking_cannot_block_a_read_that_finds_nothing() -> None:
    """The selector fired and the other holder took the bytes first: the read finds none."""

    async def run() -> None:
        with kept_copy() as (taken, kept, client):
            conn = Conn(taken)
            make_blocking(kept, taken)
            stall = await longest_stall(conn.recv_some(), 3 * BLOCKED_S)
            assert stall < MAX_GAP_S, f"the loop stalled {stall:.2f} s in a read"
            client.sendall(b"GET / HTTP/1.1\r\n")
            assert await asyncio.wait_for(conn.recv_some(), 5) and conn.buffer.startswith(b"GET")

    asyncio.run(run())


def test_a_kept_copy_made_blocking_cannot_block_a_write_no_one_reads() -> None:
    async def run() -> None:
        with kept_copy() as (taken, kept, _):
            conn = Conn(taken, timeout=BLOCKED_S)
            make_blocking(kept, taken)
            stall = await longest_stall(conn.send(b"a" * ANSWER), 3 * BLOCKED_S)
            assert stall < MAX_GAP_S, f"the loop stalled {stall:.2f} s in a write"
            assert 0 < conn.sent < ANSWER  # the buffers filled, then it waited, unblocked

    asyncio.run(run())


def test_a_tunnel_to_a_kept_copy_made_blocking_never_holds_the_loop() -> None:
    """The origin sends far more than the buffers hold; the sandbox's side never reads."""

    async def run() -> None:
        with kept_copy() as (taken, kept, client):
            client_side = Conn(taken)
            make_blocking(kept, taken)
            origin_near, origin_far = socket.socketpair()
            origin_far.setblocking(False)
            with origin_near, origin_far:
                with contextlib.suppress(BlockingIOError):
                    while True:
                        origin_far.send(b"d" * 65536)
                # and the sandbox's side writes too: the other direction, read by the origin
                client.sendall(b"u" * 65536)
                work = tunnel(client_side, Conn(origin_near))
                stall = await longest_stall(work, 3 * BLOCKED_S)
                assert stall < MAX_GAP_S, f"the loop stalled {stall:.2f} s in a tunnel"

    asyncio.run(run())
