"""The fairness e2e test's measurement on a proxy from SOURCES, for an A/B of two trees: the
measuring sandbox's p99 in five quiet and five flooded 1 s windows, and their medians' ratio.

    sudo /opt/lnk/venv/bin/python bench/proxy_fair_ab.py SOURCES NICE KINDS

SOURCES: a source tree (this checkout, or an earlier commit's `git archive ... shared
services/proxy`); NICE: the flood's nice level (run under SCHED_OTHER), or `rt` to leave the
flood at the caller's policy (run the whole under `chrt -r 1` to take the machine's other
load away: the kernel's real-time throttling then stops everything 50 ms per second, which
sets the p99; read the p50); KINDS: the flood's kinds (bench/proxy_fairness.py).
"""

from __future__ import annotations

import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from proxy_client import Via, get_request, measure, unix
from proxy_fairness import FLOOD_GRANTS, FLOOD_SANDBOX
from proxy_procs import WWW, TestInternet, open_listener, resolver_files, start_lnk, stop

BENCH = Path(__file__).resolve().parent
WINDOWS = 5  # quiet and flooded windows in turn, as the e2e test
WINDOW_S = 1.0


def main(sources: Path, nice: str, kinds: str) -> int:
    with ExitStack() as stack:
        net = stack.enter_context(TestInternet())
        base = Path(tempfile.mkdtemp(prefix="lnkf", dir="/tmp"))
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        base.chmod(0o755)
        lnk = start_lnk(stack, base, resolver_files(base, net), sources=sources)
        flood_socket = base / "run" / "proxy" / "flood.sock"
        open_listener(lnk, FLOOD_SANDBOX, flood_socket, FLOOD_GRANTS)
        via = Via("measured", unix(str(lnk.listener)), get_request(WWW), {})
        policy = [] if nice == "rt" else ["chrt", "-o", "0", "nice", "-n", nice]
        argv = [sys.executable, str(BENCH / "proxy_fairness.py"), "--flood", str(flood_socket)]
        flood = subprocess.Popen(
            [*policy, *argv, WWW, "600", kinds], stdout=subprocess.PIPE, text=True
        )
        stack.callback(stop, flood)
        assert flood.stdout is not None
        if flood.stdout.readline().strip() != "flooding":
            raise RuntimeError("the flooding process did not start")
        quiet, flooded = [], []
        for _ in range(WINDOWS):
            flood.send_signal(signal.SIGSTOP)
            quiet.append(measure(via, 1, WINDOW_S))
            flood.send_signal(signal.SIGCONT)
            flooded.append(measure(via, 1, WINDOW_S))
        flood.terminate()
        out, _ = flood.communicate(timeout=30)
        q99 = statistics.median(r.p99_ms for r in quiet)
        f99 = statistics.median(r.p99_ms for r in flooded)
        q50 = statistics.median(r.p50_ms for r in quiet)
        f50 = statistics.median(r.p50_ms for r in flooded)
        print(
            f"{sources}: p50 quiet {q50:.3f} flooded {f50:.3f} ms; p99 quiet {q99:.2f} "
            f"flooded {f99:.2f} ms ({f99 / q99:.2f}x); flood {out.strip().splitlines()[-1]}"
        )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1]).resolve(), sys.argv[2], sys.argv[3]))
