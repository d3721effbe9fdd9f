"""`lnk_proxy.handed_splice`: a handed tunnel spliced in a thread of its own: every byte both
ways with the half-closes passed on; a kept copy made blocking while the client never reads
holds no part of the loop, and cancelling ends the thread at once; the slots are bounded per
sandbox and box."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from kept_copy import kept_copy, make_blocking
from loop_stall import MAX_GAP_S, longest_stall

from lnk_proxy.conn import Conn, tunnel
from lnk_proxy.handed_splice import SpliceSlots, run
from lnk_shared import handed_sockets

PIPE = 1024 * 1024


@pytest.fixture(autouse=True)
def another_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handed_sockets, "own_netns_cookie", lambda: -1)


def test_every_byte_goes_both_ways_and_half_closes_pass() -> None:
    async def run_it() -> None:
        with kept_copy() as (taken, kept, client):
            kept.close()
            origin_near, origin_far = socket.socketpair()
            with origin_near, origin_far:
                for sock in (client, origin_far):
                    sock.settimeout(10)
                work = asyncio.ensure_future(tunnel(Conn(taken), Conn(origin_near), spliced_by=run))

                def send(sock: socket.socket, payload: bytes) -> None:
                    sock.sendall(payload)
                    sock.shutdown(socket.SHUT_WR)

                def receive(sock: socket.socket) -> bytes:
                    data = b""
                    while chunk := sock.recv(1 << 20):
                        data += chunk
                    return data

                _, _, down, up = await asyncio.gather(
                    asyncio.to_thread(send, client, b"u" * 1_000_000),
                    asyncio.to_thread(send, origin_far, b"d" * 3_000_000),
                    asyncio.to_thread(receive, client),
                    asyncio.to_thread(receive, origin_far),
                )
                await asyncio.wait_for(work, 5)
                assert down == b"d" * 3_000_000 and up == b"u" * 1_000_000

    asyncio.run(run_it())


def test_a_download_the_client_never_reads_leaves_its_upload_moving() -> None:
    """One thread moves both ways: the way down waiting for room in the client's socket must
    not hold the way up."""

    async def run_it() -> None:
        with kept_copy() as (taken, kept, client):
            kept.close()
            origin_near, origin_far = socket.socketpair()
            with origin_near, origin_far:
                origin_far.setblocking(False)
                work = asyncio.ensure_future(run(Conn(taken), Conn(origin_near), PIPE))
                flood = b"d" * 65536
                for _ in range(50):  # until every buffer on the way down is full
                    try:
                        while True:
                            origin_far.send(flood)
                    except BlockingIOError:
                        await asyncio.sleep(0.01)
                client.settimeout(5)
                upload = b"u" * 2_000_000
                sending = asyncio.ensure_future(asyncio.to_thread(client.sendall, upload))
                got = b""
                deadline = asyncio.get_running_loop().time() + 5
                while len(got) < len(upload) and asyncio.get_running_loop().time() < deadline:
                    try:
                        got += origin_far.recv(1 << 20)
                    except BlockingIOError:
                        await asyncio.sleep(0.01)
                await asyncio.wait_for(sending, 5)
                assert got == upload, f"the way up moved {len(got)} of {len(upload)} bytes"
                work.cancel()
                await asyncio.wait([work], timeout=2.0)
                assert work.done()

    asyncio.run(run_it())


def test_a_kept_copy_made_blocking_holds_only_the_thread_and_cancelling_ends_it() -> None:
    async def run_it() -> None:
        with kept_copy() as (taken, kept, _client):
            client_side = Conn(taken)
            make_blocking(kept, taken)
            origin_near, origin_far = socket.socketpair()
            origin_far.setblocking(False)
            with origin_near, origin_far:
                try:
                    while True:
                        origin_far.send(b"d" * 65536)
                except BlockingIOError:
                    pass
                work = asyncio.ensure_future(run(client_side, Conn(origin_near), PIPE))
                stall = await longest_stall(asyncio.shield(work), 1.0)
                assert stall < MAX_GAP_S, f"the loop stalled {stall:.2f} s"
                assert not work.done()
                splicing = [t for t in threading.enumerate() if t.name == "lnk-splice"]
                assert len(splicing) == 1, "a tunnel's threads are what BOX_WIDE bounds: one"
                work.cancel()
                await asyncio.wait([work], timeout=2.0)
                assert work.done(), "cancelling did not end the thread"

    asyncio.run(run_it())


def test_the_slots_are_bounded_per_sandbox_and_box_wide() -> None:
    slots = SpliceSlots(box_wide=3, per_sandbox=2)
    assert slots.take("a") and slots.take("a") and not slots.take("a")
    assert slots.take("b") and not slots.take("c")  # the box's three are out
    slots.give("a")
    assert slots.take("c") and not slots.take("b")
    for sandbox in ("a", "b", "c"):
        slots.give(sandbox)
    assert slots.used == 0
