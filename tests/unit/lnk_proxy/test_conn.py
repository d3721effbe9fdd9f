"""Moving bytes: tunnels both ways with half-closes, idle timeouts, pooled buffers, listener
sockets bound with their mode set and never over something that is not a socket."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_proxy import conn
from lnk_proxy.conn import BufferPool, Conn, bind_listener, dial, tunnel
from lnk_proxy.tunnel_buffers import LARGE, SMALL, TunnelBuffers


async def _tunnel_both_ways(up: int, down: int) -> tuple[bytes, bytes]:
    client_far, client_near = socket.socketpair()
    origin_near, origin_far = socket.socketpair()
    task = asyncio.create_task(tunnel(Conn(client_near), Conn(origin_near)))

    def send(sock: socket.socket, payload: bytes) -> None:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)

    def receive(sock: socket.socket) -> bytes:
        data = b""
        while chunk := sock.recv(1 << 20):
            data += chunk
        return data

    for sock in (client_far, origin_far):
        sock.settimeout(10)
    _, _, got_client, got_origin = await asyncio.gather(
        asyncio.to_thread(send, client_far, b"u" * up),
        asyncio.to_thread(send, origin_far, b"d" * down),
        asyncio.to_thread(receive, client_far),
        asyncio.to_thread(receive, origin_far),
    )
    client_far.close()
    origin_far.close()
    await task
    client_near.close()
    origin_near.close()
    return got_client, got_origin


def test_a_tunnel_moves_bytes_both_ways_and_passes_half_closes() -> None:
    got_client, got_origin = asyncio.run(_tunnel_both_ways(1_000_000, 3_000_000))
    assert got_client == b"d" * 3_000_000
    assert got_origin == b"u" * 1_000_000


def test_a_one_way_tunnel_ends_when_both_sides_close() -> None:
    got_client, got_origin = asyncio.run(_tunnel_both_ways(0, 10))
    assert (got_client, got_origin) == (b"d" * 10, b"")


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        near = socket.create_connection(server.getsockname())
        far, _ = server.accept()
    return near, far


def test_a_tunnel_between_unix_and_tcp_splices_every_byte_intact() -> None:
    """The proxy's own shape: a sandbox's unix socket on one side, TCP on the other; the bytes
    go through a pipe in the kernel, and must arrive unchanged and in order."""
    payload = os.urandom(5_000_000)

    async def run() -> bytes:
        client_far, client_near = socket.socketpair()
        origin_near, origin_far = _tcp_pair()
        task = asyncio.create_task(tunnel(Conn(client_near), Conn(origin_near)))

        def send() -> None:
            origin_far.sendall(payload)
            origin_far.shutdown(socket.SHUT_WR)

        def receive() -> bytes:
            data = bytearray()
            while chunk := client_far.recv(1 << 20):
                data += chunk
            return bytes(data)

        client_far.settimeout(10)
        _, got = await asyncio.gather(asyncio.to_thread(send), asyncio.to_thread(receive))
        client_far.shutdown(socket.SHUT_WR)
        await asyncio.wait_for(task, 10)
        for sock in (client_far, client_near, origin_near, origin_far):
            sock.close()
        return got

    got = asyncio.run(run())
    assert len(got) == len(payload)
    assert got == payload


def test_an_idle_tunnel_holds_no_pipe() -> None:
    async def run() -> tuple[int, int]:
        client_far, client_near = socket.socketpair()
        origin_near, origin_far = _tcp_pair()
        task = asyncio.create_task(tunnel(Conn(client_near), Conn(origin_near)))
        origin_far.sendall(b"x" * 300_000)
        client_far.settimeout(10)
        got = 0
        while got < 300_000:
            got += len(await asyncio.to_thread(client_far.recv, 1 << 20))
        await asyncio.sleep(0.05)  # both directions now wait on a dry socket
        idle_lent = conn.PIPES.lent
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for sock in (client_far, client_near, origin_near, origin_far):
            sock.close()
        return idle_lent, conn.PIPES.lent

    idle_lent, after = asyncio.run(run())
    assert idle_lent == 0
    assert after == 0


@pytest.mark.parametrize("sizes", [LARGE, SMALL], ids=["large", "small"])
def test_a_tunnel_fixes_the_sandbox_sides_send_buffer(sizes: TunnelBuffers) -> None:
    """The bytes in flight to the sandbox are its class's, whatever the default (the kernel
    caps the value at wmem_max)."""

    async def run() -> int:
        client_far, client_near = socket.socketpair()
        origin_near, origin_far = _tcp_pair()
        task = asyncio.create_task(tunnel(Conn(client_near), Conn(origin_near), sizes))
        await asyncio.sleep(0.01)
        after = client_near.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for sock in (client_far, client_near, origin_near, origin_far):
            sock.close()
        return after

    after = asyncio.run(run())
    with open("/proc/sys/net/core/wmem_max") as f:
        cap = int(f.read())
    assert after == 2 * min(sizes.unix_send, cap)  # the kernel doubles what it grants


@pytest.mark.parametrize("sizes", [LARGE, SMALL], ids=["large", "small"])
def test_a_tunnels_origin_socket_has_fixed_buffers_from_before_connect(
    sizes: TunnelBuffers,
) -> None:
    """Set before connect: the kernel never autotunes them (a receive buffer set by the
    program stays at its value, where one left alone grows to tcp_rmem's maximum)."""

    async def run() -> tuple[int, int]:
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        try:
            sock = await dial(ipaddress.ip_address("127.0.0.1"), port, 5.0, sizes)
        finally:
            listener.close()
        try:
            return (
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
            )
        finally:
            sock.close()

    receive, send = asyncio.run(run())
    with open("/proc/sys/net/core/rmem_max") as f:
        rmem_max = int(f.read())
    with open("/proc/sys/net/core/wmem_max") as f:
        wmem_max = int(f.read())
    assert receive == 2 * min(sizes.tcp_receive, rmem_max)
    assert send == 2 * min(sizes.tcp_send, wmem_max)


def test_cancelling_a_tunnel_ends_both_directions() -> None:
    async def run() -> None:
        client_far, client_near = socket.socketpair()
        origin_near, origin_far = socket.socketpair()
        task = asyncio.create_task(tunnel(Conn(client_near), Conn(origin_near)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for sock in (client_far, client_near, origin_near, origin_far):
            sock.close()

    asyncio.run(run())


def test_an_idle_peer_times_out() -> None:
    async def run() -> None:
        far, near = socket.socketpair()
        conn = Conn(near, timeout=0.05)
        with pytest.raises(TimeoutError):
            await conn.recv_some()
        far.close()
        near.close()

    asyncio.run(run())


def test_recv_into_writes_the_peers_bytes_where_it_is_told_then_reads_the_end() -> None:
    async def run() -> None:
        far, near = socket.socketpair()
        conn = Conn(near, timeout=10)
        target = bytearray(b"-" * 8)
        far.sendall(b"abcdef")
        with memoryview(target) as view:
            assert await conn.recv_into(view[2:6]) == 4
        assert (target, conn.received, conn.buffer) == (bytearray(b"--abcd--"), 4, bytearray())
        far.close()
        with memoryview(target) as view:
            assert await conn.recv_into(view) == 2
            assert await conn.recv_into(view) == 0
        near.close()

    asyncio.run(run())


def test_read_head_returns_none_on_a_clean_close_and_eof_mid_head() -> None:
    async def run() -> None:
        def find(data: bytes) -> int | None:
            end = data.find(b"\r\n\r\n")
            return None if end < 0 else end + 4

        far, near = socket.socketpair()
        far.close()
        assert await Conn(near).read_head(find) is None
        near.close()
        far, near = socket.socketpair()
        far.sendall(b"GET http://a/ HTTP/1.1\r\n")
        far.close()
        with pytest.raises(EOFError):
            await Conn(near).read_head(find)
        near.close()

    asyncio.run(run())


def test_the_pool_lends_and_keeps_a_bounded_number() -> None:
    pool = BufferPool(size=16, keep=2, large_limit=10, small_size=4)
    buffers = [pool.take() for _ in range(4)]
    assert all(len(b) == 16 for b in buffers)
    for buffer in buffers:
        pool.give(buffer)
    assert pool.lent == 0
    assert pool.take() is buffers[1]
    assert pool.take() is buffers[0]
    assert all(pool.take() is not b for b in buffers)


def test_past_the_large_limit_the_pool_lends_small_buffers() -> None:
    """Stalled peers pin their buffers: only `large_limit` of them may be large."""
    pool = BufferPool(size=16, keep=8, large_limit=2, small_size=4)
    large = [pool.take(), pool.take()]
    small = pool.take()
    assert [len(b) for b in (*large, small)] == [16, 16, 4]
    pool.give(small)
    assert pool.lent == 2
    pool.give(large[0])
    assert len(pool.take()) == 16


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lnkconn", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_listener_gets_its_mode_and_a_missing_folder_is_made(short_dir: Path) -> None:
    path = short_dir / "new" / "s.sock"
    sock = bind_listener(path, 0o666)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    finally:
        sock.close()


def test_a_stale_socket_is_replaced_but_a_file_is_not(short_dir: Path) -> None:
    path = short_dir / "s.sock"
    bind_listener(path, 0o600).close()
    bind_listener(path, 0o600).close()
    plain = short_dir / "file"
    plain.write_text("data")
    with pytest.raises(ValueError, match="not a socket"):
        bind_listener(plain, 0o666)
    assert plain.read_text() == "data"
