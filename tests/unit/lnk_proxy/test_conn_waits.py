"""How `Conn` waits on the hot path: a read after this side spoke waits for readiness first (no
recv that fails with EAGAIN), an answer already queued is still read at once, `deadline`
bounds a head in total however the bytes trickle, and `seen_silent` (what lets a pooled
connection skip its peek for a request that may be sent again) turns false once the loop has
seen the origin's close, so the pool then drops it."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time

import pytest

from lnk_proxy.conn import Conn
from lnk_proxy.upstream_pool import UpstreamPool

WAIT_S = 5.0  # a bound for what must happen at once: far above any scheduling delay


class CountingSocket(socket.socket):
    """A socket that counts its `recv` calls that failed with EAGAIN."""

    failed = 0

    def recv(self, size: int, flags: int = 0) -> bytes:
        try:
            return super().recv(size, flags)
        except BlockingIOError:
            self.failed += 1
            raise


def pair() -> tuple[socket.socket, CountingSocket]:
    far, near = socket.socketpair()
    counting = CountingSocket(near.family, near.type, fileno=near.detach())
    return far, counting


def find(data: bytes | bytearray) -> int | None:
    end = data.find(b"\r\n\r\n")
    return None if end < 0 else end + 4


def test_a_read_after_a_send_waits_for_the_answer_without_a_failed_recv() -> None:
    async def run() -> tuple[bytes | None, int]:
        far, near = pair()
        conn = Conn(near)
        far.setblocking(False)
        loop = asyncio.get_running_loop()

        def answer() -> None:  # the peer answers once it has the question
            far.recv(100)
            far.send(b"HTTP/1.1 200 OK\r\n\r\n")

        loop.add_reader(far.fileno(), answer)
        try:
            await conn.send(b"GET / HTTP/1.1\r\n\r\n")
            head = await asyncio.wait_for(conn.read_head(find), WAIT_S)
        finally:
            loop.remove_reader(far.fileno())
            conn.close()
            far.close()
        return head, near.failed

    head, failed = asyncio.run(run())
    assert head == b"HTTP/1.1 200 OK\r\n\r\n"
    assert failed == 0  # before: one recv failed with EAGAIN (an exception) per answer


def test_an_answer_already_queued_is_read_at_once() -> None:
    async def run() -> bytes | None:
        far, near = pair()
        conn = Conn(near)
        far.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")  # before the question: already there
        try:
            await conn.send(b"GET / HTTP/1.1\r\n\r\n")
            return await asyncio.wait_for(conn.read_head(find), WAIT_S)
        finally:
            conn.close()
            far.close()

    assert asyncio.run(run()) == b"HTTP/1.1 204 No Content\r\n\r\n"


def test_a_deadline_bounds_a_head_in_total_however_the_bytes_trickle() -> None:
    bound_s = 0.3

    async def run() -> float:
        far, near = socket.socketpair()
        conn = Conn(near)
        conn.deadline = asyncio.get_running_loop().time() + bound_s

        async def trickle() -> None:  # one byte every 50 ms: never idle for long
            for byte in b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n":
                far.send(bytes([byte]))
                await asyncio.sleep(0.05)

        sender = asyncio.create_task(trickle())
        started = time.monotonic()
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(conn.read_head(find), WAIT_S)
            return time.monotonic() - started
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            conn.close()
            far.close()

    assert asyncio.run(run()) < WAIT_S  # the deadline ended it, not the test's bound


def test_a_pooled_connection_the_loop_saw_closed_is_dropped_even_for_a_retryable_take() -> None:
    key = ("a.example", 80, ipaddress.ip_address("192.0.2.1"))

    async def run() -> tuple[bool, bool, Conn | None, Conn | None]:
        far, near = socket.socketpair()
        conn = Conn(near)
        await conn.send(b"GET / HTTP/1.1\r\n\r\n")  # an exchange, as `forward_http` has it
        far.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
        await conn.read_head(find)  # it waited for the answer: read, and still watched
        pool = UpstreamPool()
        pool.give(key, conn)
        silent_before = conn.seen_silent
        far.close()  # the origin closes its idle connection
        deadline = time.monotonic() + WAIT_S
        while conn.seen_silent and time.monotonic() < deadline:
            await asyncio.sleep(0)  # let the loop look at it (its readiness callback)
        silent_after = conn.seen_silent
        taken = pool.take(key, retryable=True)
        other, other_far = socket.socketpair()
        other_conn = Conn(other)
        other_far.close()  # closed, and the loop has not looked: the peek still sees it
        pool.give(key, other_conn)
        peeked = pool.take(key)
        other_conn.close()
        return silent_before, silent_after, taken, peeked

    silent_before, silent_after, taken, peeked = asyncio.run(run())
    assert silent_before  # watched and silent after its exchange
    assert silent_after is False
    assert taken is None
    assert peeked is None
