"""The in-sandbox relay alone, this checkout's against another tree's, interleaved: what the
relay's two hops (TCP from the client, unix to the proxy) add per small round trip.

    python bench/relay_ab.py --baseline OLD_SOURCES [--rounds 6] [--seconds 3]

`OLD_SOURCES` is an earlier commit's `git archive HEAD shared sandbox | tar -x -C /tmp/old`:
both `lnk-sandbox` binaries are built by each tree's own `native_build.py`. One answerer (an
asyncio protocol on uvloop where installed, on a unix socket, as the proxy's listener) gives a
fixed 160-byte answer to each request head; the client (the same process's loop) sends a
90-byte GET on each connection and waits for its answer, at concurrency 1 and 64, through one
relay and then the other, alternating which goes first each round, so the machine's other load
falls on both. Printed per round and as medians: round trips per second, the p50 and p99 of a
round trip at c=1, and the relay's own CPU per round trip (its utime + stime across the
window: the figure least moved by other load). No root needed; nothing leaves loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

CHECKOUT = Path(__file__).resolve().parents[1]
REQUEST = b"GET http://www.test-public.example/ HTTP/1.1\r\nHost: www.test-public.example\r\n\r\n"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nContent-Type: text/plain\r\n\r\n" + b"x" * 100
TICKS = os.sysconf("SC_CLK_TCK")


def build(tree: Path, folder: Path) -> Path:
    script = tree / "shared" / "lnk_shared" / "native_build.py"
    spec = importlib.util.spec_from_file_location(f"nb{abs(hash(tree))}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder.mkdir(parents=True, exist_ok=True)
    return Path(module.build(folder / "lnk-sandbox"))


class Answerer(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.buffer = cast(asyncio.Transport, transport), b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            _, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            self.transport.write(ANSWER)


class Asker(asyncio.Protocol):
    """One connection's round trips until `until` (the loop's time); each one's seconds."""

    def __init__(self, until: float, times: list[float], done: asyncio.Future[None]) -> None:
        self.until, self.times, self.done = until, times, done
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.got = cast(asyncio.Transport, transport), 0
        self._ask()

    def _ask(self) -> None:
        self.started = time.perf_counter()
        self.transport.write(REQUEST)

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got < len(ANSWER):
            return
        self.got -= len(ANSWER)
        self.times.append(time.perf_counter() - self.started)
        if self.loop.time() < self.until:
            self._ask()
        else:
            self.transport.close()
            if not self.done.done():
                self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("closed early"))


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def measure(port: int, pid: int, concurrency: int, seconds: float) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    times: list[float] = []
    until = loop.time() + seconds
    before = cpu_s(pid)
    done = [loop.create_future() for _ in range(concurrency)]
    transports = []
    for future in done:
        transport, _ = await loop.create_connection(
            lambda f=future: Asker(until, times, f), "127.0.0.1", port
        )
        transports.append(transport)
    await asyncio.gather(*done)
    used = cpu_s(pid) - before
    times.sort()
    return {
        "rps": len(times) / seconds,
        "p50_ms": 1000 * times[len(times) // 2],
        "p99_ms": 1000 * times[int(len(times) * 0.99)],
        "cpu_us": 1e6 * used / max(1, len(times)),
    }


def start_relay(binary: Path, listener: Path) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([str(binary), "--relay", str(listener), str(port)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return process, port
        time.sleep(0.02)  # a bench waiting for its own child's listen: no event to wait on
    process.kill()
    raise RuntimeError(f"{binary} did not listen on {port}")


async def run(arguments: argparse.Namespace, folder: Path) -> None:
    listener = folder / "answerer.sock"
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(Answerer, str(listener), backlog=512)
    binaries = {
        "old": build(arguments.baseline.resolve(), folder / "old"),
        "new": build(CHECKOUT, folder / "new"),
    }
    relays = {name: start_relay(binary, listener) for name, binary in binaries.items()}
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        print(f"relay A/B: load average {os.getloadavg()[0]:.2f}", flush=True)
        for number in range(arguments.rounds):
            order = ["old", "new"] if number % 2 == 0 else ["new", "old"]
            for concurrency in (1, 64):
                for name in order:
                    process, port = relays[name]
                    got = await measure(port, process.pid, concurrency, arguments.seconds)
                    results.setdefault((name, concurrency), []).append(got)
                    print(
                        f"  round {number + 1} c={concurrency:<2} {name}: {got['rps']:8.0f}/s "
                        f"p50 {got['p50_ms']:.3f} ms p99 {got['p99_ms']:.3f} ms "
                        f"relay {got['cpu_us']:.1f} us/rt",
                        flush=True,
                    )
        print(f"medians of {arguments.rounds} rounds, load average {os.getloadavg()[0]:.2f}")
        for concurrency in (1, 64):
            medians = {
                name: {
                    key: statistics.median(r[key] for r in results[name, concurrency])
                    for key in ("rps", "p50_ms", "p99_ms", "cpu_us")
                }
                for name in ("old", "new")
            }
            old, new = medians["old"], medians["new"]
            for name, row in medians.items():
                print(
                    f"  c={concurrency:<2} {name}: {row['rps']:8.0f}/s p50 {row['p50_ms']:.3f} ms "
                    f"p99 {row['p99_ms']:.3f} ms relay {row['cpu_us']:.1f} us/rt"
                )
            rate, p50 = new["rps"] / old["rps"], new["p50_ms"] / old["p50_ms"]
            cpu = new["cpu_us"] / old["cpu_us"]
            print(f"  c={concurrency:<2} new/old: rate {rate:.2f}x, p50 {p50:.2f}x, CPU {cpu:.2f}x")
    finally:
        for process, _ in relays.values():
            process.kill()
            process.wait()
        server.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the other source tree")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    arguments = parser.parse_args()
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    with tempfile.TemporaryDirectory(prefix="lnkra") as folder:
        asyncio.run(run(arguments, Path(folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
