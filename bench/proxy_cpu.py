"""The proxy's CPU per small request, counted over a fixed number of requests, this checkout
against another source tree, in turn in one run (the A/B that bench/proxy.py's rows are too
noisy for on a shared machine: each figure there is a rate over 10 s of whatever CPU the
load leaves).

    sudo /opt/lnk/venv/bin/python bench/proxy_cpu.py --baseline OLD_SOURCES [--requests 20000]
        [--rounds 7] [--concurrency 1,16]

OLD_SOURCES is an earlier commit's `git archive` (for example `git archive 75a2f3d shared
services/proxy | tar -x -C /tmp/old`). Both proxies run as nobody with the same grant
(`proxy_procs.start_lnk`), in front of the same origin in the test internet's namespace. Per
round and per proxy: `--requests` keep-alive `GET`s on each of `--concurrency` connections to
its unix listener (one thread each, blocking sockets, so the client adds no event loop), and
the proxy's own CPU (utime + stime from /proc) across them. Prints per proxy the lowest and
the median µs of CPU per request over the rounds and the ratio new / old of each: the lowest
is the figure least moved by other load (preemption and steal only ever add to it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import threading
from contextlib import ExitStack
from pathlib import Path

from proxy_client import get_request, read_head
from proxy_procs import IO_TIMEOUT_S, WWW, TestInternet, cpu_s, resolver_files, start_lnk


def _run_connection(listener: Path, count: int, errors: list[str]) -> None:
    request = get_request(WWW)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(IO_TIMEOUT_S)
            sock.connect(str(listener))
            pending = b""
            for _ in range(count):
                sock.sendall(request)
                head, pending = read_head_after(sock, pending)
                length = _content_length(head)
                while len(pending) < length:
                    chunk = sock.recv(65536)
                    if not chunk:
                        raise EOFError("closed mid-body")
                    pending += chunk
                pending = pending[length:]
    except (OSError, EOFError, ValueError) as exc:
        errors.append(repr(exc))


def read_head_after(sock: socket.socket, pending: bytes) -> tuple[bytes, bytes]:
    if b"\r\n\r\n" in pending:
        head, _, rest = pending.partition(b"\r\n\r\n")
        return head, rest
    head, rest = read_head(sock)
    return pending + head, rest


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise ValueError(f"no Content-Length in {head[:200]!r}")


def cpu_per_request(pid: int, listener: Path, requests: int, concurrency: int) -> float:
    """µs of the proxy's CPU per request over `requests` on each of `concurrency`."""
    errors: list[str] = []
    threads = [
        threading.Thread(target=_run_connection, args=(listener, requests, errors))
        for _ in range(concurrency)
    ]
    before = cpu_s(pid)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    used = cpu_s(pid) - before
    if errors:
        raise RuntimeError(f"{len(errors)} connections failed: {errors[0]}")
    return 1e6 * used / (requests * concurrency)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the other source tree")
    parser.add_argument("--requests", type=int, default=20000, help="per connection, per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--concurrency", default="1,16", help="comma-separated")
    arguments = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root: sudo /opt/lnk/venv/bin/python bench/proxy_cpu.py", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    levels = [int(level) for level in arguments.concurrency.split(",")]
    with ExitStack() as stack:
        net = stack.enter_context(TestInternet())
        base = Path(tempfile.mkdtemp(prefix="lnkc", dir="/tmp"))
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        base.chmod(0o755)
        binds = resolver_files(base, net)
        new = start_lnk(stack, base / "n", binds)
        old = start_lnk(stack, base / "o", binds, sources=arguments.baseline.resolve())
        proxies = {"new": new, "old": old}
        print(
            f"load average {os.getloadavg()[0]:.2f}; {arguments.requests} requests per "
            f"connection per round, {arguments.rounds} rounds, old = {arguments.baseline}"
        )
        for level in levels:
            figures: dict[str, list[float]] = {name: [] for name in proxies}
            for _ in range(arguments.rounds):
                for name, lnk in proxies.items():  # in turn: the same load falls on both
                    pid = lnk.process.pid
                    us = cpu_per_request(pid, lnk.listener, arguments.requests, level)
                    figures[name].append(us)
            low = {name: min(values) for name, values in figures.items()}
            mid = {name: statistics.median(values) for name, values in figures.items()}
            for name in proxies:
                print(
                    f"  c={level:<3} {name}: lowest {low[name]:6.1f} µs/req, median "
                    f"{mid[name]:6.1f}  ({', '.join(f'{v:.0f}' for v in figures[name])})"
                )
            print(
                f"  c={level:<3} new / old: lowest {low['new'] / low['old']:.2f} x, median "
                f"{mid['new'] / mid['old']:.2f} x"
            )
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
