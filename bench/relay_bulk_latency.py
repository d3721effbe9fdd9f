"""Small round trips through the in-sandbox relay while another connection of the same relay
moves bulk: what a download costs the sandbox's other requests, relay against relay.

    python bench/relay_bulk_latency.py --relay NAME=LNK_SANDBOX [--relay ...] [--rounds 4]
        [--seconds 3] [--bulk 0|1|2]

Each relay binary (`lnk-sandbox --relay`) serves a unix-socket server of this script: a
connection whose first byte is `B` is sent zeros forever from a memfd by sendfile (the bulk),
any other is echoed. Per row: `--bulk` connections read as fast as this process can while one
connection makes 100-byte round trips for `--seconds`; the round trips' p50 and p99 and rate,
and the bulk's MiB/s. Rows interleave, the order rotated each round; medians at the end.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, suppress
from pathlib import Path

MESSAGE = 100
CHUNK = 8 << 20


def serve(path: Path) -> None:
    zeros = os.memfd_create("zeros")
    os.write(zeros, bytes(CHUNK))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(64)

    def run(conn: socket.socket) -> None:
        with conn, suppress(OSError):
            first = conn.recv(1)
            if first == b"B":
                while os.sendfile(conn.fileno(), zeros, 0, CHUNK) > 0:
                    pass
                return
            conn.sendall(first)
            while data := conn.recv(65536):
                conn.sendall(data)

    while True:
        conn, _ = server.accept()
        threading.Thread(target=run, args=(conn,), daemon=True).start()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def measure(port: int, seconds: float, bulk: int) -> tuple[float, float, float, float]:
    stop = threading.Event()
    moved = [0] * bulk

    def read_bulk(index: int) -> None:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"B")
            buffer = bytearray(1 << 20)
            while not stop.is_set():
                count = sock.recv_into(buffer)
                if count == 0:
                    return
                moved[index] += count

    readers = [threading.Thread(target=read_bulk, args=(i,)) for i in range(bulk)]
    for reader in readers:
        reader.start()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        message = b"x" * MESSAGE
        sock.sendall(message)  # warm: connected through to the server
        sock.recv(MESSAGE, socket.MSG_WAITALL)
        times = []
        start = time.perf_counter()
        begin = moved[:]
        while (now := time.perf_counter()) - start < seconds:
            sock.sendall(message)
            got = sock.recv(MESSAGE, socket.MSG_WAITALL)
            assert len(got) == MESSAGE
            times.append(time.perf_counter() - now)
        elapsed = time.perf_counter() - start
        bulk_mib = (sum(moved) - sum(begin)) / (1 << 20) / elapsed
    stop.set()
    for reader in readers:
        reader.join()
    times.sort()
    p50 = times[len(times) // 2] * 1000
    p99 = times[int(len(times) * 0.99)] * 1000
    return p50, p99, len(times) / elapsed, bulk_mib


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--relay", action="append", required=True, help="NAME=PATH")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--bulk", type=int, default=1, help="bulk connections beside")
    arguments = parser.parse_args()
    with ExitStack() as stack:
        folder = Path(tempfile.mkdtemp(prefix="lnkl"))
        path = folder / "server.sock"
        server = threading.Thread(target=serve, args=(path,), daemon=True)
        server.start()
        while not path.exists():
            time.sleep(0.01)
        relays = []
        for spec in arguments.relay:
            name, _, binary = spec.partition("=")
            port = free_port()
            process = subprocess.Popen([binary, "--relay", str(path), str(port)])
            stack.callback(process.kill)
            while (
                subprocess.run(
                    ["ss", "-Hltn", f"sport = {port}"], capture_output=True, text=True, check=False
                ).stdout.strip()
                == ""
            ):
                time.sleep(0.01)
            relays.append((name, port))
        print(
            f"load {Path('/proc/loadavg').read_text().strip()}; bulk connections {arguments.bulk}"
        )
        results: dict[str, list[tuple[float, float, float, float]]] = {n: [] for n, _ in relays}
        for number in range(arguments.rounds):
            shift = number % len(relays)
            for name, port in relays[shift:] + relays[:shift]:
                result = measure(port, arguments.seconds, arguments.bulk)
                results[name].append(result)
                p50, p99, rate, bulk = result
                print(
                    f"  round {number + 1} {name:10} p50 {p50:.3f} ms  p99 {p99:.3f} ms  "
                    f"{rate:8.0f}/s  bulk {bulk:6.0f} MiB/s",
                    flush=True,
                )
        print(f"medians (load {Path('/proc/loadavg').read_text().strip()})")
        for name, rows in results.items():
            p50, p99, rate, bulk = (statistics.median(r[i] for r in rows) for i in range(4))
            print(
                f"  {name:10} p50 {p50:.3f} ms  p99 {p99:.3f} ms  {rate:8.0f}/s  "
                f"bulk {bulk:6.0f} MiB/s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
