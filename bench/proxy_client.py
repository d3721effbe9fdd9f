"""The bench's clients, the same for every proxy: plain sockets for the allowlist check, the
1 GiB transfer and the idle tunnels; asyncio protocols over raw sockets for the small
requests (`measure`: requests/s, p50, p99 and the CPU of the named processes)."""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import relay_netns
from proxy_procs import IDLE_TUNNELS, OTHER, TUNNEL_BYTES, WWW, Cpu, TestInternet, rss_kib

RECV_BUFFER = 1024 * 1024  # the transfer client's reads: large, so it is not the bottleneck
TRANSFER_TIMEOUT_S = 120.0  # 1 GiB at a slow 10 MiB/s still fits
SMALL_S = 10.0
WARMUP_S = 1.0
MAX_REQUESTS = 5_000_000  # per run: a bound far above what 10 s can carry
GRACE_S = 15.0  # past its end, a run's connections are aborted
IDLE_TIMEOUT_S = 60.0  # opening 500 tunnels takes well under a second each way
SETTLE_S = 0.5  # before reading RSS: let the proxy finish its bookkeeping
PROXY_PROCESSES = ("proxy", "relay")

Dial = Callable[[], socket.socket]


def read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """A response head and the bytes read past it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError(f"closed after {data[:200]!r}")
        data += chunk
        if len(data) > 65536:
            raise ValueError("head too large")
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def ask(dial: Dial, request: bytes) -> tuple[bytes, bytes]:
    with dial() as sock:
        sock.sendall(request)
        head, body = read_head(sock)
        while chunk := sock.recv(65536):  # `Connection: close` asked: the proxy ends it
            body += chunk
            if len(body) > 65536:
                break
        return head, body


def get_request(host: str, *, absolute: bool = True) -> bytes:
    target = f"http://{host}/" if absolute else "/"
    return f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def connect_request(authority: str) -> bytes:
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()


def check_allowlist(name: str, dial: Dial, net: TestInternet) -> None:
    """The proxy answers www and refuses OTHER without reaching it."""
    close = b"Connection: close\r\n\r\n"
    head, body = ask(dial, get_request(WWW).replace(b"\r\n\r\n", b"\r\n" + close))
    if b" 200 " not in head.split(b"\r\n")[0] or body != f"{WWW}\n".encode():
        raise RuntimeError(f"{name} did not answer {WWW}: {head[:200]!r}")
    before = net.accepted(net.other)
    head, _ = ask(dial, get_request(OTHER).replace(b"\r\n\r\n", b"\r\n" + close))
    if b" 403 " not in head.split(b"\r\n")[0] or net.accepted(net.other) != before:
        raise RuntimeError(f"{name} did not refuse {OTHER}: {head[:200]!r}")


def transfer(dial: Dial, tunnel_to: str | None) -> float:
    """MiB/s for TUNNEL_BYTES from the source (through a CONNECT tunnel when `tunnel_to`)."""
    deadline = time.perf_counter() + TRANSFER_TIMEOUT_S
    start = time.perf_counter()
    with dial() as sock:
        got = 0
        if tunnel_to is not None:
            sock.sendall(connect_request(tunnel_to))
            head, rest = read_head(sock)
            if b" 200 " not in head.split(b"\r\n")[0] + b" ":
                raise RuntimeError(f"CONNECT refused: {head[:200]!r}")
            got = len(rest)
        sock.sendall(b"%d\n" % TUNNEL_BYTES)
        buffer = bytearray(RECV_BUFFER)
        while got < TUNNEL_BYTES:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{got} of {TUNNEL_BYTES} bytes in {TRANSFER_TIMEOUT_S} s")
            count = sock.recv_into(buffer)
            if count == 0:
                raise EOFError(f"closed after {got} of {TUNNEL_BYTES} bytes")
            got += count
    return TUNNEL_BYTES / (1 << 20) / (time.perf_counter() - start)


def idle_tunnel_memory(dial: Dial, pid: int) -> tuple[int, int]:
    """The proxy's RSS (KiB) before and with IDLE_TUNNELS idle tunnels to www:80 open."""

    def open_tunnel() -> socket.socket:
        sock = dial()
        try:
            sock.sendall(connect_request(f"{WWW}:80"))
            head, _ = read_head(sock)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"CONNECT refused: {head[:200]!r}")
        except BaseException:
            sock.close()
            raise
        return sock

    for _ in range(8):  # warm the paths a tunnel takes
        open_tunnel().close()
    time.sleep(SETTLE_S)
    before = rss_kib(pid)
    tunnels: list[socket.socket] = []
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    try:
        while len(tunnels) < IDLE_TUNNELS and time.monotonic() < deadline:
            tunnels.append(open_tunnel())
        if len(tunnels) < IDLE_TUNNELS:
            raise TimeoutError(f"{len(tunnels)} of {IDLE_TUNNELS} tunnels opened in time")
        time.sleep(SETTLE_S)
        return before, rss_kib(pid)
    finally:
        for sock in tunnels:
            sock.close()


# -- asyncio: small requests -----------------------------------------------------------------


@dataclass
class Run:
    request: bytes
    stop_at: float
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    one_per_connection: bool = False  # learnt when the peer closes instead of keeping alive
    transports: set[asyncio.BaseTransport] = field(default_factory=set)

    def over(self) -> bool:
        return time.perf_counter() >= self.stop_at or len(self.latencies) >= MAX_REQUESTS


def content_length(head: bytes) -> int:
    """From a lowercased head; 0 when absent (the answers measured here all carry one)."""
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    end = head.find(b"\r\n", at + 2)
    return int(head[at + 17 : end if end >= 0 else len(head)])


class Exchanges(asyncio.Protocol):
    """One connection: a request, its answer, the next request, until the run is over or the
    answer says `Connection: close` (then the worker dials again). A peer that closes after an
    answer instead (tinyproxy) is remembered: from then on each connection carries one."""

    def __init__(self, run: Run, ended: asyncio.Future[None], started: float) -> None:
        self.run = run
        self.ended = ended
        self.started = started  # of the request in flight; a new connection's dial counts
        self.buffer = bytearray()
        self.need = -1  # bytes of the current answer, once its head is in
        self.close_after = False
        self.pending = False
        self.answers = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.run.transports.add(transport)
        self.pending = True
        transport.write(self.run.request)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        if self.need < 0:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).lower()
            if not head.startswith((b"http/1.1 200", b"http/1.0 200")):
                self.run.errors += 1
                self.transport.close()
                return
            self.need = end + 4 + content_length(head)
            close = b"\r\nconnection: close" in head or head.startswith(b"http/1.0")
            self.close_after = close or self.run.one_per_connection
        if len(self.buffer) < self.need:
            return
        now = time.perf_counter()
        self.run.latencies.append(now - self.started)
        self.pending = False
        self.answers += 1
        del self.buffer[: self.need]
        self.need = -1
        if self.close_after or self.run.over():
            self.transport.close()
            return
        self.started = now
        self.pending = True
        self.transport.write(self.run.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.pending and self.answers and not self.buffer:
            self.run.one_per_connection = True  # closed after an answer: no keep-alive
        elif self.pending:
            self.run.errors += 1
        if self.transport is not None:
            self.run.transports.discard(self.transport)
        if not self.ended.done():
            self.ended.set_result(None)


Connect = Callable[[Callable[[], asyncio.Protocol]], Awaitable[Any]]


async def worker(run: Run, connect: Connect) -> None:
    loop = asyncio.get_running_loop()
    while not run.over():
        started = time.perf_counter()
        ended: asyncio.Future[None] = loop.create_future()
        try:
            await connect(lambda: Exchanges(run, ended, started))  # noqa: B023
        except OSError:
            run.errors += 1
            await asyncio.sleep(0.01)
            continue
        await ended


@dataclass(frozen=True)
class Via:
    name: str
    connect: Connect
    request: bytes
    pids: dict[str, int]  # whose CPU to report


@dataclass(frozen=True)
class Result:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu: str
    proxy_us: float  # CPU of the proxy (and relay) per request; 0 on the direct rows


async def load(via: Via, concurrency: int, seconds: float, one_per_connection: bool) -> Run:
    run = Run(via.request, time.perf_counter() + seconds, one_per_connection=one_per_connection)
    workers = [asyncio.create_task(worker(run, via.connect)) for _ in range(concurrency)]
    try:
        await asyncio.wait_for(asyncio.gather(*workers), seconds + GRACE_S)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for transport in list(run.transports):
            if isinstance(transport, asyncio.Transport):
                transport.abort()
    return run


def measure(via: Via, concurrency: int, seconds: float = SMALL_S) -> Result:
    warm = asyncio.run(load(via, concurrency, WARMUP_S, one_per_connection=False))
    cpu = Cpu(via.pids)
    start = time.perf_counter()
    run = asyncio.run(load(via, concurrency, seconds, warm.one_per_connection))
    elapsed = time.perf_counter() - start
    used = cpu.used()
    if len(run.latencies) < 2:
        raise RuntimeError(f"{via.name}: {len(run.latencies)} answers, {run.errors} errors")
    ms = sorted(1000 * s for s in run.latencies)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    proxy_s = sum(seconds for name, seconds in used.items() if name in PROXY_PROCESSES)
    proxy_us = 1e6 * proxy_s / len(ms)
    return Result(
        len(ms) / elapsed, statistics.median(ms), p99, run.errors, cpu.report(used), proxy_us
    )


def tcp(host: str, port: int) -> Connect:
    """host:port (a hand-off relay's port: in its namespace, `relay_netns`)."""
    return relay_netns.tcp_connect(host, port)


def unix(path: str) -> Connect:
    return lambda factory: asyncio.get_running_loop().create_unix_connection(factory, path)


def closing(request: bytes) -> bytes:
    return request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
