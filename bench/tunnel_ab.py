"""The 1 GiB tunnel alone, relay against relay: where a sandbox's bulk download spends its CPU.

    sudo /opt/lnk/venv/bin/python bench/tunnel_ab.py [--baseline OLD_SOURCES] [--rounds 3]
        [--relay NAME=LNK_SANDBOX_BINARY ...] [--gib 1]

One lnk_proxy from this checkout (as bench/proxy.py starts it: nobody, its own mount namespace,
a grant of `www`) and the same sendfile source in the test internet's namespace; the rows are
interleaved, each round in a rotated order, so every row sees the same moments of a shared
machine's load:
- `direct`: the client reads the source over TCP (two processes);
- `proxy alone`: the client reads a CONNECT tunnel from the proxy's unix socket;
- `relay NAME`: the client reads the tunnel over TCP from an in-sandbox relay (`lnk-sandbox
  --relay`) in front of that proxy: `new` is built from this checkout and hands each
  connection to the proxy (`--relay-handoff`, in a network namespace of its own with the
  client's socket, as in a sandbox: `relay_netns`), `bytes` is the same binary relaying the
  bytes (`--relay`), `old` is built from `--baseline`'s tree (its own `native_build.py`), and
  each `--relay NAME=PATH` is a binary of your own (a variant being tried, relaying bytes);
- `old path` (with `--baseline`): the baseline's proxy behind the baseline's relay;
- `path NAME` (each `--path NAME=TREE`): that tree's proxy behind that tree's relay handing
  each connection over (`--relay-handoff`, in a namespace of its own): two hand-off proxies
  (say one splicing on its loop, one copying) paired with this checkout's `relay new`.

For each row: MiB/s, and CPU seconds per GiB moved of each process (utime + stime of all its
threads) and of the whole machine (`/proc/stat`: everything not idle, softirq included: the
kernel's TCP receive work is softirq time, which no process's utime or stime holds) and of
it softirq alone, plus the proxy's context switches per GiB (voluntary: its loop waited;
involuntary: it was preempted). The medians over rounds, then each relay row's rate and CPU
against `relay old`'s in the same run.

`--perf DIR` runs `perf record -g -p` on a relay row's proxy and relay during its transfer
(TUNNEL_AB_STRACE=1: `strace -c` instead). Either sees only the threads there when it starts:
a relay's bulk thread (`lnk-relay-bulk`, started after 8 MiB) is not in it; for that thread,
`perf record -a` beside the run and `perf report --comm lnk-relay-bulk`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import relay_netns
from proxy_client import Dial, transfer
from proxy_procs import (
    IO_TIMEOUT_S,
    SOURCE_PORT,
    TUNNEL_BYTES,
    WWW,
    TestInternet,
    cpu_s,
    free_port,
    listening,
    resolver_files,
    start_lnk,
    start_relay,
    start_source,
    stop,
    wait_until,
)

TICKS = os.sysconf("SC_CLK_TCK")


def load() -> str:
    return Path("/proc/loadavg").read_text().strip()


def dial_tcp(host: str, port: int) -> socket.socket:
    return relay_netns.tcp_socket(host, port, IO_TIMEOUT_S)  # a hand-off relay's: its netns


def dial_unix(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(IO_TIMEOUT_S)
    sock.connect(str(path))
    return sock


def relay_dial(port: int) -> Dial:
    return lambda: dial_tcp("127.0.0.1", port)


def machine_busy_s() -> tuple[float, float]:
    """CPU seconds of every core not idle nor waiting for I/O since boot, and of them in
    softirq (the kernel's TCP receive work, whoever it interrupted)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICKS, fields[6] / TICKS


def switches(pid: int) -> tuple[int, int]:
    """Voluntary and involuntary context switches of the live threads of `pid` (a thread that
    ended took its counts with it: the relay's are not shown, its threads come and go)."""
    voluntary = involuntary = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:  # it ended since the listing (a tunnel's splice thread)
            continue
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                voluntary += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                involuntary += int(line.split()[1])
    return voluntary, involuntary


@dataclass
class Row:
    name: str
    dial: Dial
    tunnel: bool
    pids: dict[str, int]
    relay: int | None = None
    rates: list[float] = field(default_factory=list)
    cpu: dict[str, list[float]] = field(default_factory=dict)

    def measure(self, gib: float, source: int, perf: Path | None = None) -> str:
        pids = {"source": source} | self.pids
        recorder = None
        if perf is not None and self.relay:  # the relay's and the proxy's own samples
            out = perf / f"{self.name.replace(' ', '-')}-{len(self.rates)}.data"
            watched = ",".join(str(pid) for pid in self.pids.values())
            command = ["perf", "record", "-g", "-F", "999", "-p", watched, "-o", str(out)]
            if os.environ.get("TUNNEL_AB_STRACE"):  # syscall counts instead (slows the row)
                command = ["strace", "-c", "-f", "-o", str(out) + ".strace"]
                command += [f"-p{pid}" for pid in self.pids.values()]
            recorder = subprocess.Popen(
                command,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        before = {name: cpu_s(pid) for name, pid in pids.items()}
        times = os.times()
        client = times.user + times.system
        busy = machine_busy_s()
        proxy = self.pids.get("proxy")
        moved_switches = switches(proxy) if proxy else (0, 0)
        target = f"{WWW}:{SOURCE_PORT}" if self.tunnel else None
        rate = transfer(self.dial, target)
        if recorder is not None:
            recorder.send_signal(signal.SIGINT)
            recorder.wait()
        per_gib = 1.0 / gib
        times = os.times()
        used = {"client": times.user + times.system - client}
        used |= {name: cpu_s(pid) - before[name] for name, pid in pids.items()}
        now = machine_busy_s()
        used["machine"], used["softirq"] = now[0] - busy[0], now[1] - busy[1]
        if proxy:
            after = switches(proxy)
            used["proxy vcsw"] = after[0] - moved_switches[0]
            used["proxy ivcsw"] = after[1] - moved_switches[1]
        self.rates.append(rate)
        for name, value in used.items():
            self.cpu.setdefault(name, []).append(value * per_gib)
        shown = " ".join(f"{n} {v * per_gib:.2f}" for n, v in used.items() if "csw" not in n)
        shown += "".join(f" {n} {v * per_gib:.0f}" for n, v in used.items() if "csw" in n)
        return f"  {self.name:14} {rate:7.0f} MiB/s   per GiB: {shown}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="an earlier tree with sandbox/ and C")
    parser.add_argument("--relay", action="append", default=[], help="NAME=PATH of a relay")
    parser.add_argument("--perf", type=Path, help="a folder for perf records of relay rows")
    parser.add_argument(
        "--path", action="append", default=[], help="NAME=TREE: that tree's hand-off path"
    )
    parser.add_argument("--no-direct", action="store_true", help="skip direct and proxy alone")
    arguments = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    gib = TUNNEL_BYTES / (1 << 30)
    with ExitStack() as stack:
        net = stack.enter_context(TestInternet())
        base = Path(tempfile.mkdtemp(prefix="lnkt", dir="/tmp"))
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        base.chmod(0o755)
        binds = resolver_files(base, net)
        source = start_source(stack, net)
        lnk = start_lnk(stack, base, binds)
        proxy = {"proxy": lnk.process.pid}
        rows = (
            []
            if arguments.no_direct
            else [
                Row("direct", lambda: dial_tcp(net.www.address, SOURCE_PORT), False, {}),
                Row("proxy alone", lambda: dial_unix(lnk.listener), True, proxy),
            ]
        )
        relays: list[tuple[str, Path | None, Path | None, bool]] = [
            ("new", None, None, True),
            ("bytes", None, None, False),
        ]
        if arguments.baseline is not None:
            relays.append(("old", None, arguments.baseline.resolve(), False))
        for spec in arguments.relay:
            name, _, path = spec.partition("=")
            relays.append((name, Path(path), None, False))
        for name, binary, sources, handoff in relays:
            folder = base / f"r-{name}"
            folder.mkdir()
            if binary is not None:
                shutil.copy(binary, folder / "lnk-sandbox")
                process, port = _start_binary(stack, folder / "lnk-sandbox", lnk.listener)
            else:
                process, port = start_relay(stack, lnk.listener, folder, sources, handoff=handoff)
            pids = proxy | {"relay": process.pid}
            rows.append(Row(f"relay {name}", relay_dial(port), True, pids, relay=process.pid))
        if arguments.baseline is not None:
            old = start_lnk(stack, base / "o", binds, sources=arguments.baseline.resolve())
            process, port = start_relay(
                stack, old.listener, base / "o", arguments.baseline.resolve()
            )
            pids = {"proxy": old.process.pid, "relay": process.pid}
            rows.append(Row("old path", relay_dial(port), True, pids, relay=process.pid))
        for spec in arguments.path:
            name, _, tree = spec.partition("=")
            sources = Path(tree).resolve()
            folder = base / f"p-{name}"
            folder.mkdir()
            other = start_lnk(stack, folder, binds, sources=sources)
            process, port = start_relay(stack, other.listener, folder, sources, handoff=True)
            pids = {"proxy": other.process.pid, "relay": process.pid}
            rows.append(Row(f"path {name}", relay_dial(port), True, pids, relay=process.pid))
        print(f"tunnel A/B: {os.cpu_count()} CPUs, load {load()}")
        for row in rows:  # to read a `perf record -a` beside the run by pid (`perf script`)
            if row.pids:
                print(f"  {row.name}: " + " ".join(f"{n} {p}" for n, p in row.pids.items()))
        for number in range(arguments.rounds):
            print(f"round {number + 1}", flush=True)
            shift = number % len(rows)
            for row in rows[shift:] + rows[:shift]:
                print(row.measure(gib, source.pid, arguments.perf), flush=True)
        print(f"medians of {arguments.rounds} rounds (load {load()})")
        for row in rows:
            cpu = " ".join(f"{n} {statistics.median(v):.2f}" for n, v in row.cpu.items())
            print(f"  {row.name:14} {statistics.median(row.rates):7.0f} MiB/s   per GiB: {cpu}")
        by_name = {row.name: row for row in rows}
        old_row = by_name.get("relay old")
        if old_row is not None:
            for row in rows:
                if row.name.startswith("relay ") and row is not old_row:
                    ratios = [a / b for a, b in zip(row.rates, old_row.rates, strict=True)]
                    relay = [
                        a / b for a, b in zip(row.cpu["relay"], old_row.cpu["relay"], strict=True)
                    ]
                    print(
                        f"  {row.name} / relay old: rate by round "
                        + " ".join(f"{r:.2f}" for r in ratios)
                        + "; relay CPU per GiB by round "
                        + " ".join(f"{r:.2f}" for r in relay)
                    )
        direct = by_name.get("direct")
        if direct is not None:
            for row in rows[1:]:
                share = [a / b for a, b in zip(row.rates, direct.rates, strict=True)]
                print(f"  {row.name} / direct by round: " + " ".join(f"{s:.0%}" for s in share))
    return 0


def _start_binary(
    stack: ExitStack, binary: Path, listener: Path
) -> tuple[subprocess.Popen[bytes], int]:
    """A relay binary of your own (`--relay NAME=PATH`) on a free loopback port."""
    port = free_port()
    process = subprocess.Popen([str(binary), "--relay", str(listener), str(port)])
    stack.callback(stop, process)
    wait_until(lambda: listening(port), process, "the relay")
    return process, port


if __name__ == "__main__":
    sys.exit(main())
