"""The callback path (`fast_exchange`) against the coroutine path, in-process: the same
conversations on a proxy with it and on one without it give the same bytes back and the same
wire-log lines (time aside), and the callback path refuses what the coroutine path refuses,
on the same connection as allowed requests: a port not granted, a name not listed, this
machine in odd forms, a flag set between two requests, a bad head after a good one. An origin
on 127.0.0.1 is reached through a `[localhost]` port grant (the only place a unit test may
dial)."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk_proxy.config import ProxyConfig
from lnk_proxy.fast_exchange import MAX_ANSWER_BYTES
from lnk_proxy.policy import ProxyGrants
from lnk_proxy.server import ProxyServer

SECRET = "x" * 40
SANDBOX = "sbx-fast"
WAIT_S = 10.0  # an answer arrives within this even on a loaded machine
BIG = b"b" * (MAX_ANSWER_BYTES + 1000)  # past the callback path's whole-answer bound
NEAR = b"n" * (MAX_ANSWER_BYTES - 100)  # within it, with its head
ANSWERS = {
    b"/": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-Origin: yes\r\n\r\nok\n",
    b"/empty": b"HTTP/1.1 204 No Content\r\n\r\n",
    b"/big": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BIG), BIG),
    b"/near": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(NEAR), NEAR),
    b"/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"/early": b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
    b"/bad": b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n",
    b"/nolength": b"HTTP/1.1 200 OK\r\n\r\nuntil the end",  # framed by the close
}


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lnkfast", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Origin:
    """On 127.0.0.1, keep-alive: each request's path picks its answer (`ANSWERS`, its head
    only for a HEAD); a body is read by its Content-Length; `/nolength` closes after
    answering. Keeps every request it got."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self.port = 0

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.requests.append(head + await reader.readexactly(length))
                path = head.split(b" ")[1]
                whole = ANSWERS[path]
                if head.startswith(b"HEAD "):
                    whole = whole.partition(b"\r\n\r\n")[0] + b"\r\n\r\n"
                writer.write(whole)
                await writer.drain()
                if path == b"/nolength":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def get(path: str = "/", *, port: str = "PORT", close: bool = False, method: str = "GET") -> bytes:
    extra = "Connection: close\r\n" if close else ""
    head = f"{method} http://localhost:{port}{path} HTTP/1.1\r\nHost: localhost:{port}\r\n"
    return f"{head}{extra}\r\n".encode()


def other(host: str) -> bytes:
    return f"GET http://{host}/ HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


POST = (
    b"POST http://localhost:PORT/ HTTP/1.1\r\nHost: localhost:PORT\r\n"
    b"Content-Length: 5\r\n\r\nhello"
)
BAD_FIELD = b"GET http://localhost:PORT/ HTTP/1.1\r\nHost: localhost:PORT\r\nBad Name: x\r\n\r\n"
MISMATCH = b"GET http://localhost:PORT/ HTTP/1.1\r\nHost: other:PORT\r\n\r\n"
SPLIT = (
    (b"GET http://local",),
    (b"host:PORT/ HTTP/1.1\r\nHo",),
    (b"st: localhost:PORT\r\nConnection: close\r\n\r\n",),
)

# Each conversation: what one sandbox connection sends, piece by piece (each piece sent once
# the answer to the one before came back, unless it is a tuple: sent at once, pipelined, no
# answer awaited); then the connection is read to its end.
Conversation = list[bytes | tuple[bytes, ...]]
CONVERSATIONS: dict[str, Conversation] = {
    "keep-alive": [get(), get(), get(close=True)],
    "pipelined": [get(), (get(), get("/empty"), get(close=True))],
    "head-split-across-reads": [get(), *SPLIT],
    "a-body-then-no-body": [get(), POST, get(close=True)],
    "head": [get(), (get(method="HEAD"), get(close=True))],
    "not-granted-port-after-allowed": [get(), get(port="1")],
    "not-listed-name-after-allowed": [get(), other("example.com")],
    "loopback-odd-form-after-allowed": [get(), other("127.1:PORT")],
    "loopback-mapped-after-allowed": [get(), other("[::ffff:127.0.0.1]:PORT")],
    "metadata-after-allowed": [get(), other("169.254.169.254")],
    "malformed-head-after-allowed": [get(), BAD_FIELD],
    "origin-form-after-allowed": [get(), b"GET / HTTP/1.1\r\nHost: localhost:PORT\r\n\r\n"],
    "host-mismatch-after-allowed": [get(), MISMATCH],
    "connect-after-allowed": [get(), b"CONNECT localhost:1 HTTP/1.1\r\n\r\n"],
    "big-answer": [get(), get("/big"), get(close=True)],
    "chunked-answer": [get(), get("/chunked"), get(close=True)],
    "interim-answer": [get(), get("/early"), get(close=True)],
    "bad-answer": [get(), get("/bad")],
    "close-framed-answer": [get(), get("/nolength")],
    "pipelined-refusal": [get(), (get(), get(port="1"), get())],
}


async def converse(path: Path, port: int, conversation: Conversation) -> bytes:
    """What the proxy sent back over the whole connection."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    received = b""
    try:
        for piece in conversation:
            for part in piece if isinstance(piece, tuple) else (piece,):
                writer.write(part.replace(b"PORT", str(port).encode()))
                await writer.drain()
            if isinstance(piece, tuple):
                await asyncio.sleep(0.02)  # the proxy likely reads each part alone (not needed)
                continue
            received += await answer(reader)
        received += await asyncio.wait_for(reader.read(), WAIT_S)
    finally:
        writer.close()
    return received


async def answer(reader: asyncio.StreamReader) -> bytes:
    """One whole answer (by its Content-Length or chunks), or all until the close."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    while head[head.rfind(b"HTTP/1.1 ") :].startswith(b"HTTP/1.1 1"):  # an interim answer
        head += await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    last = head[head.rfind(b"HTTP/1.1 ") :].lower()
    if b"transfer-encoding: chunked" in last:
        return head + await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), WAIT_S)
    if b"content-length:" in last:
        length = int(last.split(b"content-length:")[1].split(b"\r\n")[0])
        return head + await asyncio.wait_for(reader.readexactly(length), WAIT_S)
    if last.startswith((b"http/1.1 204", b"http/1.1 304")):
        return head
    return head + await asyncio.wait_for(reader.read(), WAIT_S)


def wire_lines(config: ProxyConfig, port: int) -> list[dict[str, Any]]:
    """The sandbox's wire lines, without their time and with the origin's port as PORT."""
    path = config.wire_log_dir / f"{SANDBOX}.log"
    if not path.exists():
        return []
    lines = [json.loads(line.replace(str(port), "PORT")) for line in path.read_text().splitlines()]
    for line in lines:
        line.pop("time")
    return lines


class Proxy:
    """A fresh proxy (with or without the callback path) serving SANDBOX, an origin granted."""

    def __init__(self, base: Path, *, fast: bool = True) -> None:
        self.config = ProxyConfig(run_dir=base / "run", state_dir=base / "state")
        (base / "run" / "flags").mkdir(parents=True)
        self.server = ProxyServer(self.config, fast_path=fast)
        self.path = self.config.run_dir / "sbx" / f"{SANDBOX}.sock"
        self.origin = Origin()

    async def __aenter__(self) -> Proxy:
        self.origin_server = await self.origin.start()
        await self.server.start()
        grants = ProxyGrants(localhost_ports=frozenset({self.origin.port}))
        await self.server.open_listener(SANDBOX, self.path, grants, SECRET)
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.server.close()
        self.origin_server.close()

    def decided(self) -> int:
        fast = self.server._fast
        return 0 if fast is None else fast.decided

    def requests(self) -> list[bytes]:
        return [r.replace(str(self.origin.port).encode(), b"PORT") for r in self.origin.requests]


async def run(
    base: Path, conversations: list[Conversation], *, fast: bool
) -> tuple[list[bytes], list[dict[str, Any]], int, list[bytes]]:
    """Each conversation on its own connection, one after the other, on a fresh proxy: the
    bytes back, the wire lines, the requests the callback path decided, what the origin got."""
    async with Proxy(base, fast=fast) as proxy:
        answers = [await converse(proxy.path, proxy.origin.port, talk) for talk in conversations]
        await proxy.server.close_listener(SANDBOX)  # every line written
        lines = wire_lines(proxy.config, proxy.origin.port)
        return answers, lines, proxy.decided(), proxy.requests()


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_both_paths_answer_and_log_the_same(base: Path, name: str) -> None:
    conversation = CONVERSATIONS[name]
    slow = asyncio.run(run(base / "slow", [conversation], fast=False))
    fast = asyncio.run(run(base / "fast", [conversation], fast=True))
    assert fast[0] == slow[0], "the bytes back differ"
    assert fast[1] == slow[1], "the wire lines differ"
    assert fast[3] == slow[3], "the origin got different requests"
    assert fast[2] >= 1 and slow[2] == 0  # the callback path decided (after the first's dial)


def test_a_whole_session_is_the_same_on_both_paths(base: Path) -> None:
    talks = [CONVERSATIONS[name] for name in sorted(CONVERSATIONS)]
    slow = asyncio.run(run(base / "slow", talks, fast=False))
    fast = asyncio.run(run(base / "fast", talks, fast=True))
    assert fast[0] == slow[0] and fast[1] == slow[1] and fast[3] == slow[3]
    assert fast[2] >= len(talks)


def test_each_refusal_after_an_allowed_request_is_refused_and_reaches_nothing(base: Path) -> None:
    names = [name for name in CONVERSATIONS if name.endswith("-after-allowed")]
    answers, lines, decided, requests = asyncio.run(
        run(base, [CONVERSATIONS[name] for name in names], fast=True)
    )
    for name, back in zip(names, answers, strict=True):
        assert back.count(b"HTTP/1.1 200 OK") == 1, name
        assert b"HTTP/1.1 403 Forbidden" in back, name
    assert len(requests) == len(names)  # only the allowed ones reached the origin
    assert len([line for line in lines if line["decision"] == "refused"]) == len(names)
    assert decided >= len(names)


def test_a_pause_set_between_two_requests_refuses_the_second(base: Path) -> None:
    async def main() -> tuple[bytes, bytes, int, list[dict[str, Any]]]:
        async with Proxy(base) as proxy:
            reader, writer = await asyncio.open_unix_connection(str(proxy.path))
            request = get().replace(b"PORT", str(proxy.origin.port).encode())
            for _ in range(2):  # the second on a pooled origin connection: the callback path
                writer.write(request)
                first = await answer(reader)
            (proxy.config.flags_dir / f"{SANDBOX}.pause").touch()
            writer.write(request)
            second = await asyncio.wait_for(reader.read(), WAIT_S)
            writer.close()
            await proxy.server.close_listener(SANDBOX)
            assert proxy.decided() >= 2
            lines = wire_lines(proxy.config, proxy.origin.port)
            return first, second, len(proxy.origin.requests), lines

    first, second, reached, lines = asyncio.run(main())
    assert first.startswith(b"HTTP/1.1 200 OK")
    assert second.startswith(b"HTTP/1.1 403 Forbidden") and b"(paused)" in second
    assert reached == 2  # the paused request never left
    assert lines[-1]["rule"] == "paused"


def test_a_sandbox_that_reads_slowly_gets_every_byte_in_order(base: Path) -> None:
    """Pipelined answers past the socket's buffer: the callback path holds the rest of one
    answer until the sandbox reads, and reads nothing more meanwhile."""
    count = 12  # answers of ~64 KiB each: far past a unix socket's send buffer
    talk: Conversation = [get(), tuple([get("/near")] * count + [get(close=True)])]
    slow = asyncio.run(run(base / "slow", [talk], fast=False))
    fast = asyncio.run(run(base / "fast", [talk], fast=True))
    assert fast[0] == slow[0]
    assert fast[0][0].count(NEAR) == count
    assert fast[1] == slow[1] and fast[2] >= count


def test_a_listener_closed_mid_exchange_logs_the_exchange_as_the_coroutine_path_does(
    base: Path,
) -> None:
    async def main(where: Path, fast: bool) -> list[dict[str, Any]]:
        hung = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(ANSWERS[b"/"])
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")  # the second: never answered
            hung.set()
            with pytest.raises(asyncio.IncompleteReadError):
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
            writer.close()

        async with Proxy(where, fast=fast) as proxy:
            hanging = await asyncio.start_server(serve, "127.0.0.1", 0)
            port = hanging.sockets[0].getsockname()[1]
            await proxy.server.close_listener(SANDBOX)
            grants = ProxyGrants(localhost_ports=frozenset({port}))
            await proxy.server.open_listener(SANDBOX, proxy.path, grants, SECRET)
            try:
                reader, writer = await asyncio.open_unix_connection(str(proxy.path))
                request = get().replace(b"PORT", str(port).encode())
                writer.write(request)
                await answer(reader)
                writer.write(request)
                await asyncio.wait_for(hung.wait(), WAIT_S)
                await proxy.server.close_listener(SANDBOX)
                assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
                writer.close()
                return wire_lines(proxy.config, port)
            finally:
                hanging.close()

    slow, fast = asyncio.run(main(base / "slow", False)), asyncio.run(main(base / "fast", True))
    assert fast == slow
    assert fast[-1]["error"] == "closed: the sandbox was stopped or its listener closed"


def test_the_callback_path_leaves_no_reservation_behind(base: Path) -> None:
    async def main() -> tuple[int, int]:
        async with Proxy(base) as proxy:
            for name in sorted(CONVERSATIONS):
                await converse(proxy.path, proxy.origin.port, CONVERSATIONS[name])
            listener = proxy.server._listeners[SANDBOX]
            for _ in range(int(WAIT_S / 0.01)):  # the last connection's task ends after its close
                if not listener.connections:
                    break
                await asyncio.sleep(0.01)
            return listener.buffers, len(listener.connections)

    assert asyncio.run(main()) == (0, 0)
