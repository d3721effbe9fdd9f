"""Origin connections kept alive between requests, in-process: a `[localhost]` port grant lets
the proxy reach an origin on this machine's loopback (the only place a unit test may dial). The
origin here is scripted per connection, to show reuse, a closed idle connection never used,
and a reused connection that fails before answering retried once, only for a repeatable
request without a body."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_proxy.config import ProxyConfig
from lnk_proxy.policy import ProxyGrants
from lnk_proxy.server import ProxyServer
from lnk_proxy.tunnel_buffers import PLAIN

SECRET = "x" * 40
WAIT_S = 10.0  # the proxy's reservations change within this even on a loaded machine
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n"


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lnkreuse", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Origin:
    """On 127.0.0.1: connection n answers `answers[n]` requests with OK, then, if `hang_up`,
    reads one more request and closes without answering. Counts connections and requests."""

    def __init__(self, answers: list[int], hang_up: bool = False) -> None:
        self.answers = answers
        self.hang_up = hang_up
        self.connections = 0
        self.requests: list[bytes] = []
        self.port = 0

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = self.connections
        self.connections += 1
        answers = self.answers[number] if number < len(self.answers) else 1
        try:
            for _ in range(answers):
                await self.read_request(reader)
                writer.write(OK)
                await writer.drain()
            if self.hang_up and number == 0:
                await self.read_request(reader)
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        self.requests.append(head + await reader.readexactly(length))


async def ask(path: Path, request: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(request)
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    writer.close()
    return answer


async def through_proxy(base: Path, origin: Origin, requests: list[bytes]) -> list[bytes]:
    """Each request on its own client connection, one after the other."""
    origin_server = await origin.start()
    config = ProxyConfig(run_dir=base / "run", state_dir=base / "state")
    proxy = ProxyServer(config)
    await proxy.start()
    path = config.run_dir / "sbx" / "sbx-reuse.sock"
    grants = ProxyGrants(localhost_ports=frozenset({origin.port}))
    await proxy.open_listener("sbx-reuse", path, grants, SECRET)
    try:
        answers = []
        for raw in requests:
            answers.append(await ask(path, raw.replace(b"PORT", str(origin.port).encode())))
            await asyncio.sleep(0.05)  # the origin's close, if any, arrives
        return answers
    finally:
        await proxy.close()
        origin_server.close()


def test_one_origin_connection_carries_the_next_requests(base: Path) -> None:
    origin = Origin(answers=[3])
    get = b"GET http://localhost:PORT/ HTTP/1.1\r\nHost: localhost:PORT\r\n\r\n"
    answers = asyncio.run(through_proxy(base, origin, [get] * 3))
    assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers)
    assert origin.connections == 1 and len(origin.requests) == 3


def test_an_idle_connection_the_origin_closed_is_not_used(base: Path) -> None:
    origin = Origin(answers=[1, 1])  # each connection answers once, then the origin closes it
    get = b"GET http://localhost:PORT/ HTTP/1.1\r\nHost: localhost:PORT\r\n\r\n"
    answers = asyncio.run(through_proxy(base, origin, [get] * 2))
    assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers)
    assert origin.connections == 2 and len(origin.requests) == 2


def test_a_get_the_reused_connection_dropped_is_sent_again_on_a_new_one(base: Path) -> None:
    origin = Origin(answers=[1, 1], hang_up=True)
    get = b"GET http://localhost:PORT/ HTTP/1.1\r\nHost: localhost:PORT\r\n\r\n"
    answers = asyncio.run(through_proxy(base, origin, [get] * 2))
    assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers)
    assert origin.connections == 2 and len(origin.requests) == 3  # the dropped one, again


@pytest.mark.parametrize(
    "second",
    [
        b"POST http://localhost:PORT/ HTTP/1.1\r\nHost: localhost:PORT\r\n\r\n",  # not repeatable
        b"PUT http://localhost:PORT/ HTTP/1.1\r\nHost: localhost:PORT\r\nContent-Length: 2\r\n"
        b"\r\nhi",  # a body: it was read from the sandbox, and is not read again
    ],
    ids=["post", "body"],
)
def test_a_request_that_may_not_be_repeated_is_never_sent_twice(base: Path, second: bytes) -> None:
    origin = Origin(answers=[1, 1], hang_up=True)
    get = b"GET http://localhost:PORT/ HTTP/1.1\r\nHost: localhost:PORT\r\n\r\n"
    answers = asyncio.run(through_proxy(base, origin, [get, second]))
    assert answers[0].startswith(b"HTTP/1.1 200")
    assert answers[1].startswith(b"HTTP/1.1 502")
    assert origin.connections == 1 and len(origin.requests) == 2


def test_plain_http_reserves_fixed_buffers_from_the_budget_and_is_refused_past_it(
    base: Path,
) -> None:
    """The attack: plain http exchanges whose sandbox never reads pinned autotuned origin
    buffers that no budget counted. Now an exchange reserves `PLAIN` while it runs: with a
    budget of two, two held exchanges take it, a third is refused (`too-much-buffer`) at once,
    and once they end it is free again; the origin socket kept for reuse has PLAIN's sizes."""
    release = asyncio.Event()
    get = b"GET http://localhost:PORT/ HTTP/1.1\r\nHost: localhost:PORT\r\n\r\n"

    writers: list[asyncio.StreamWriter] = []

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await release.wait()
                writer.write(OK)
                await writer.drain()
        writer.close()

    async def run() -> tuple[list[bytes], bytes, bytes, int, list[int]]:
        origin = await asyncio.start_server(held, "127.0.0.1", 0)
        port = str(origin.sockets[0].getsockname()[1]).encode()
        request = get.replace(b"PORT", port)
        budget = 2 * PLAIN.worst_case()
        config = ProxyConfig(
            run_dir=base / "run", state_dir=base / "state", tunnel_buffer_budget_bytes=budget
        )
        proxy = ProxyServer(config)
        await proxy.start()
        path = config.run_dir / "sbx" / "sbx-plain.sock"
        grants = ProxyGrants(localhost_ports=frozenset({int(port)}))
        await proxy.open_listener("sbx-plain", path, grants, SECRET)
        listener = proxy._listeners["sbx-plain"]
        try:
            waiting = [asyncio.create_task(ask(path, request)) for _ in range(2)]
            async with asyncio.timeout(WAIT_S):  # both reached the origin, holding the budget
                while listener.buffers < budget:
                    await asyncio.sleep(0.01)
            third = await ask(path, request)
            release.set()
            answers = [await task for task in waiting]
            async with asyncio.timeout(WAIT_S):  # their ends give their reservations back
                while listener.buffers:
                    await asyncio.sleep(0.01)
            again = await ask(path, request)
            sizes = [
                conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
                for entries in listener.pool._idle.values()
                for _, conn in entries
            ]
            return answers, third, again, listener.buffers, sizes
        finally:
            await proxy.close()
            origin.close()
            for writer in writers:
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()

    answers, third, again, reserved, sizes = asyncio.run(run())
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers)
    assert third.startswith(b"HTTP/1.1 403")
    assert again.startswith(b"HTTP/1.1 200")
    assert reserved == 0
    assert sizes and set(sizes) == {2 * PLAIN.tcp_receive}  # fixed: the kernel doubles it
    log = (base / "state" / "wire" / "sbx-plain.log").read_text()
    assert '"rule":"too-much-buffer"' in log
