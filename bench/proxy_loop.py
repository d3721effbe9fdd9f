"""The event loop alone, on the proxy's own socket code: uvloop against asyncio's loop.

    /opt/lnk/venv/bin/python bench/proxy_loop.py [--exchanges 30000]

A client, the proxy's relaying step and an origin, in one process over two socket pairs, all
through `lnk_proxy.conn.Conn` (its readiness waits, sends and reads, as a plain http request
uses them): the CPU and wall time per round trip on each loop, in the same run. No policy, no
parsing, no log: what the loop itself costs, which bench/proxy.py's rows cannot separate from
the rest of a request on a loaded machine.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import socket
import sys
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(CHECKOUT / "shared"), str(CHECKOUT / "services" / "proxy")]
from lnk_proxy.conn import Conn  # noqa: E402

REQUEST = b"x" * 100  # a small request's size; the answer is the same bytes back
IO_TIMEOUT_S = 300.0  # as the proxy's plain-http waits: each arms a timer


async def exchanges(count: int) -> tuple[float, float]:
    """CPU and wall seconds for `count` round trips client -> relay -> origin and back."""
    client, relay_in = socket.socketpair()
    relay_out, origin = socket.socketpair()
    conns = [Conn(s) for s in (client, relay_in, relay_out, origin)]
    c, r_in, r_out, o = conns
    r_in.timeout = r_out.timeout = o.timeout = IO_TIMEOUT_S

    async def take(conn: Conn) -> bytes:
        while not conn.buffer:
            if not await conn.recv_some():
                raise EOFError
        data = bytes(conn.buffer)
        conn.buffer.clear()
        return data

    async def relay() -> None:
        for _ in range(count):
            await r_out.send(await take(r_in))
            await r_in.send(await take(r_out))

    async def echo() -> None:
        for _ in range(count):
            await o.send(await take(o))

    async def ask() -> None:
        for _ in range(count):
            await c.send(REQUEST)
            await take(c)

    cpu, wall = time.process_time(), time.perf_counter()
    try:
        await asyncio.gather(relay(), echo(), ask())
    finally:
        for conn in conns:
            conn.close()
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exchanges", type=int, default=30_000)
    count = max(1, parser.parse_args().exchanges)
    runners: list[tuple[str, object]] = [("asyncio", None)]
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        runners.append(("uvloop", uvloop.new_event_loop))
    else:
        print("uvloop: not installed in this Python: its row is skipped")
    for name, factory in runners:
        with asyncio.Runner(loop_factory=factory) as runner:  # type: ignore[arg-type]
            cpu, wall = runner.run(exchanges(count))
        print(
            f"{name:8} {1e6 * cpu / count:7.1f} us CPU, {1e6 * wall / count:7.1f} us wall "
            f"per round trip ({count} round trips)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
