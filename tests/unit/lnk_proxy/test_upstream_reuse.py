"""Origin connections kept alive between requests, in-process: a `[localhost]` port grant lets
the proxy reach an origin on this machine's loopback (the only place a unit test may dial). The
origin here is scripted per connection, to show reuse, a closed idle connection never used,
and a reused connection that fails before answering retried once, only for a repeatable
request without a body."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_proxy.config import ProxyConfig
from lnk_proxy.policy import ProxyGrants
from lnk_proxy.server import ProxyServer

SECRET = "x" * 40
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
