"""The fairness e2e test's measurement on proxies from two or more source trees, interleaved:
the measuring sandbox's p99 in five quiet and five flooded 1 s windows, and their medians'
ratio, for each tree in turn, `RUNS` times (A B A B ...: the machine's load falls on all).

    sudo /opt/lnk/venv/bin/python bench/proxy_fair_ab.py KINDS RUNS SOURCES [SOURCES...]

KINDS: the flood's kinds (bench/proxy_fairness.py: lookup, tunnel, refusal, comma-separated;
or `cpu` alone: the flood's client only burns CPU, the kernel's share with the proxy idle;
several floods separated by `/`, such as `cpu/lookup`, are measured in turn in each run);
SOURCES: a source tree (this checkout, or an earlier commit's `git archive ... shared
services/proxy`). Each client runs in a CPU group of its own as the box gives each sandbox
(bench/sandbox_cpu.py), the proxy as the box runs it (`proxy_fairness.sandboxes_measure`).
Prints one line per run and, per tree, the median of its runs' ratios.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from proxy_fairness import Fairness, sandboxes_measure
from proxy_procs import TestInternet, resolver_files, start_lnk

WINDOWS = 5  # quiet and flooded windows in turn, as the e2e test
WINDOW_S = 1.0


def one_run(sources: Path, kinds: str) -> Fairness:
    with ExitStack() as stack:
        net = stack.enter_context(TestInternet())
        base = Path(tempfile.mkdtemp(prefix="lnkf", dir="/tmp"))
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        base.chmod(0o755)
        lnk = start_lnk(stack, base, resolver_files(base, net), sources=sources)
        return sandboxes_measure(stack, lnk, kinds, WINDOWS, WINDOW_S)


def main(floods: str, runs: int, trees: list[Path]) -> int:
    cases = [(tree, kinds) for tree in trees for kinds in floods.split("/")]
    ratios: dict[tuple[Path, str], list[float]] = {case: [] for case in cases}
    for run in range(runs):
        for tree, kinds in cases:
            seen = one_run(tree, kinds)
            ratios[tree, kinds].append(seen.p99_ratio)
            print(
                f"run {run} {tree} {kinds}: p50 quiet {seen.median(False, 'p50_ms'):.3f} "
                f"flooded {seen.median(True, 'p50_ms'):.3f} ms; p99 quiet "
                f"{seen.median(False, 'p99_ms'):.2f} flooded {seen.median(True, 'p99_ms'):.2f} "
                f"ms ({seen.p99_ratio:.2f}x); flood {seen.counts}",
                flush=True,
            )
    for (tree, kinds), found in ratios.items():
        shown = " ".join(f"{r:.2f}" for r in found)
        print(f"{tree} {kinds}: p99 ratio median {statistics.median(found):.2f}x ({shown})")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 4 or not sys.argv[2].isdigit():
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], int(sys.argv[2]), [Path(a).resolve() for a in sys.argv[3:]]))
