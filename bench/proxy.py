"""The filtering proxy against a direct path, tinyproxy, proxy.py and sandbox-runtime's proxy,
side by side in one run with the same client, and a fairness row.

    sudo /opt/lnk/venv/bin/python bench/proxy.py [--rounds 3] [--only-small | --only-transfers]
        [--no-peers] [--baseline OLD_SOURCES] [--rows "direct,lnk relay,old relay"]
    sudo /opt/lnk/venv/bin/python bench/proxy.py --only-fairness [--rounds 2]
        [--baseline OLD_SOURCES]

`--only-fairness` measures (d) alone, `--rounds` times, on a fresh lnk_proxy from this
checkout and, with `--baseline`, on one from that tree in turn (this tree's row, then the
baseline's, each round), then prints each one's p99 ratios: before and after in one run.

The modules, one job each: `proxy_procs` starts the processes (the proxies, the relay, the
source) and reads their CPU and memory; `proxy_peers` installs and starts the peers;
`proxy_client` is the one client; `proxy_rows` measures and judges (a) and (b);
`proxy_fairness` is (d). This file only puts them together.

Builds a test internet (`tests/e2e/net.py`: hosts in network namespaces on 198.18.x) and
starts, each as nobody in a private mount namespace whose /etc/hosts names the test hosts
(resolv.conf there points at 127.0.0.1 and nsswitch says `hosts: files`, so no lookup ever
leaves this machine and both proxies resolve the same way, through getaddrinfo):
- `lnk_proxy` from this checkout, with a temp config (`unsafe_public_networks` for 198.18/15,
  the system resolver), one listener whose grant is `[internet] hosts = [www]`;
- tinyproxy (Debian's `tinyproxy-bin`, installed with apt-get when missing: the binary without
  the system service) on a loopback port, with the equivalent allowlist (`Filter` holding www,
  `FilterDefaultDeny Yes`), logging errors only: at `LogLevel Connect` it fsyncs each of its
  lines, about three per request, which would more than halve its rate.
- the peers a user would pick instead (`proxy_peers`): proxy.py (PyPI, in the bench's own
  virtual environment) and Anthropic's sandbox-runtime's HTTP proxy (npm; skipped with the
  reason printed where Node or npm is missing), with the same allowlist;
- a second lnk_proxy on asyncio's own event loop (`LNK_PROXY_EVENT_LOOP=asyncio`), behind its
  own relay: the `lnk asyncio` row shows what uvloop (the default where installed) gives.
Each must allow www and refuse `other.test-public.example` before anything is measured.

(a) one CONNECT tunnel moving 1 GiB from a sendfile source started in the test internet's
    namespace, against the same transfer direct from the root namespace: through the relay (the
    path a sandbox's program has, which the target is judged on), through the proxy alone from
    its unix socket, and through tinyproxy's tunnel, for reference;
(b) `GET http://www.test-public.example/` at concurrency 1 and 64 (one connection each) for
    10 s each, after a 1 s warm-up, by the same client, which always offers keep-alive:
    - direct: keep-alive to the origin; direct new: a new connection per request;
    - lnk_proxy: its unix listener, kept alive (lnk_proxy keeps its origin connections too);
    - lnk close: the same, but the client asks `Connection: close`, so it dials lnk_proxy for
      each request as tinyproxy makes it do;
    - lnk relay: through the in-sandbox relay (`lnk-sandbox --relay`, built from the checkout's
      native/ into the temp folder, on a loopback port as in a sandbox) to the unix listener:
      the whole path a sandbox's client takes;
    - lnk asyncio: the relay row's path on the asyncio-loop lnk_proxy;
    - tinyproxy: on a loopback port; it closes the client's connection after each answer;
    - proxy.py, srt proxy: on loopback ports, kept alive where they keep alive;
    requests/s, p50, p99, the CPU each process used (100% = one core) and the proxy's CPU per
    request (its process, plus the relay's on that row: the figure least moved by other load
    on the machine). Added p50 is judged against the direct row with the same connection
    behaviour: kept alive against direct, a connection per request against direct new.
    `--rounds N` repeats (a) and (b) N times and prints the medians (a shared machine: take 3);
(c) the proxy's RSS before and after opening 500 idle tunnels (first, on the fresh proxy);
(d) fairness (`proxy_fairness`): one sandbox's c=1 latency alone and while another sandbox
    floods the same proxy with lookups, tunnels and refusals;
(e) a hosted model rule's body filter (`proxy_hosted`): its cost over the bytes as they came,
    at 1 KiB to 1 MiB (also alone: `python bench/proxy_hosted.py`);
(f) a hosted model request through its rule against the same request through a plain
    `[internet]` CONNECT to the same test upstream, and a streamed answer's first event
    (`proxy_hosted_path`, also alone).

The client is asyncio protocols over raw sockets.
Prints figures and the issue's targets; everything started is stopped and removed at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from proxy_client import IDLE_TUNNELS, check_allowlist, idle_tunnel_memory
from proxy_fairness import bench_fairness, fairness_ab
from proxy_hosted import bench_filter
from proxy_hosted_path import bench_path
from proxy_peers import Peer, start_peers
from proxy_procs import (
    TestInternet,
    resolver_files,
    start_lnk,
    start_relay,
    start_source,
    start_tinyproxy,
    tinyproxy_binary,
)
from proxy_rows import Bench, bench_small, bench_transfers, verdict

TUNNEL_KIB_TARGET = 64
HOSTED_RUNS = 200  # samples of each row of (e) and (f): a minute or two in all


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="repeat (a), (b); print medians")
    parser.add_argument("--only-small", action="store_true", help="skip (a), (c) and (d)")
    parser.add_argument("--no-peers", action="store_true", help="no proxy.py, no srt rows")
    parser.add_argument("--only-transfers", action="store_true", help="(a) only")
    parser.add_argument(
        "--only-fairness", action="store_true", help="(d) only (with --baseline: both, in turn)"
    )
    parser.add_argument("--profile", type=Path, help="write lnk_proxy's CPU profile (pstats)")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another source tree (an earlier commit's `git archive`): its lnk_proxy behind "
        "its own relay is the `old relay` row of (b), measured in turn with the others",
    )
    parser.add_argument(
        "--baseline-handoff",
        action="store_true",
        help="the baseline's relay hands each connection over (`--relay-handoff`: a tree "
        "since session 12), so `old relay` is that tree's hand-off path, not its byte relay",
    )
    parser.add_argument("--rows", help="(b)'s rows to measure, comma-separated (default: all)")
    arguments = parser.parse_args()
    rounds, only_small = max(1, arguments.rounds), arguments.only_small
    if os.geteuid() != 0:
        print("run as root: sudo /opt/lnk/venv/bin/python bench/proxy.py", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # cleanup runs on kill too
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tiny_bin = tinyproxy_binary()
    tiny_version = subprocess.run([tiny_bin, "-v"], capture_output=True, text=True, check=False)
    with ExitStack() as stack:
        net = stack.enter_context(TestInternet())
        base = Path(tempfile.mkdtemp(prefix="lnkb", dir="/tmp"))  # short: unix socket paths
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        base.chmod(0o755)
        binds = resolver_files(base, net)
        if arguments.only_fairness:
            fairness_ab(net, base, binds, rounds, arguments.baseline)
            return 0
        source = start_source(stack, net)
        lnk = start_lnk(stack, base, binds, profile=arguments.profile)
        slow = start_lnk(stack, base / "a", binds, event_loop="asyncio")
        tiny_process, tiny_port = start_tinyproxy(stack, base, binds)
        relay, relay_port = start_relay(stack, lnk.listener, base)
        slow_relay, slow_port = start_relay(stack, slow.listener, base)
        tiny = Peer("tinyproxy", tiny_version.stdout.strip(), tiny_process.pid, tiny_port)
        print("peers:", flush=True)
        peers = [] if arguments.no_peers else start_peers(stack, base, binds)
        slow_loop = (slow_port, slow.process.pid, slow_relay.pid)
        bench = Bench(net, lnk, source, relay_port, relay.pid, tiny, peers, slow_loop)
        if arguments.baseline is not None:
            old = start_lnk(stack, base / "o", binds, sources=arguments.baseline.resolve())
            # Its own relay too, when the tree has the sandbox's C (`git archive ... sandbox
            # pyproject.toml`): the `old relay` row is then the whole earlier path.
            old_sources = arguments.baseline.resolve()
            has_c = (old_sources / "sandbox").is_dir() and (
                old_sources / "pyproject.toml"
            ).is_file()
            old_folder = base / "o"
            old_relay, old_port = start_relay(
                stack,
                old.listener,
                old_folder,
                old_sources if has_c else None,
                handoff=True if arguments.baseline_handoff else None,
            )
            bench.baseline = (old_port, old.process.pid, old_relay.pid)
        if arguments.rows:
            bench.only = frozenset(name.strip() for name in arguments.rows.split(","))
        check_allowlist("lnk_proxy", bench.dial_lnk, net)
        for endpoint in (bench.relay(), *bench.others()):
            check_allowlist(endpoint.name, endpoint.dial, net)
        print(
            f"lnk_proxy benchmark: {os.cpu_count()} CPUs, Linux {platform.release()}, "
            f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.2f}, "
            + ", ".join(f"{p.name} {p.version}" for p in (tiny, *peers))
        )
        print("cpu: % of one core used by each process while measuring")
        if only_small:
            bench_small(bench, rounds)
            return 0
        if arguments.only_transfers:
            bench_transfers(bench, rounds)
            return 0
        before, after = idle_tunnel_memory(bench.dial_lnk, lnk.process.pid)  # on a fresh proxy
        bench_transfers(bench, rounds)
        bench_small(bench, rounds)
        per_tunnel = (after - before) / IDLE_TUNNELS
        print(f"\n(c) lnk_proxy RSS with {IDLE_TUNNELS} idle tunnels open (measured first)")
        print(
            f"  before {before / 1024:.1f} MiB, after {after / 1024:.1f} MiB: "
            f"{per_tunnel:.1f} KiB per tunnel   target <= {TUNNEL_KIB_TARGET} KiB"
            f"  {verdict(per_tunnel <= TUNNEL_KIB_TARGET)}"
        )
        bench_fairness(stack, bench, base)
        bench_filter(HOSTED_RUNS)
        bench_path(HOSTED_RUNS)
        print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
