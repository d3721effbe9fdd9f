"""One sandbox's flood of uncached lookups leaves another sandbox's request latency alone.

The proxy from this checkout (bench/proxy_procs.start_lnk: as nobody, in a private mount
namespace whose /etc/hosts names the test internet's hosts, real netns hosts, the system
resolver) serves two sandboxes: `measured` (granted `www`) sends `GET http://www/` at
concurrency 1; `flood` (granted the whole internet) runs bench/proxy_fairness.py's flood,
48 connections at once, each looking up a new name every time (no /etc/hosts line names it:
answered on the proxy's loop by `hosts_file` under `hosts: files`, then the refusal). Each
client runs in a CPU group of its own under the sandboxes' common parent, written by the
controller's `cgroup_limits` as for a real sandbox (the parent weighed below the services,
each sandbox its own default weight and a core's quota:
bench/sandbox_cpu.py), so the kernel shares the CPU between the two clients and the proxy as
it does between two sandboxes and the proxy; the proxy runs at the services' place (the root
group, nice 0). The flood is stopped (SIGSTOP) and resumed in turn, `ROUNDS` times, with a
window of measurement in each state, so the machine's other load falls on both: the median of
the flooded windows' p99 must stay within `P99_RATIO` (issue 16's 2x) of the median of the
quiet ones' (a ratio, not a time, so it holds on a loaded machine).

The attack: before the lookup threads were kept (`lnk_proxy.lookup_workers`), the proxy's
event loop waited in `Thread.start` once per uncached lookup, and every sandbox's requests
with it: 5.6x here at load 6 (5.3 ms -> 30 ms; 36x, 1.0 -> 36 ms, on a quieter machine).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from proxy_fairness import sandboxes_measure  # noqa: E402
from proxy_procs import TestInternet, resolver_files, start_lnk  # noqa: E402

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

PHASE_S = 1.0  # one quiet or flooded window of c=1 requests (~1,000): a p99 of ~10 of them
ROUNDS = 5  # quiet and flooded windows taken in turn: the machine's other load hits both
P99_RATIO = 2.0  # issue 16's target for the median p99s (not met yet: the xfail below)
FLOOD_KINDS = "lookup"  # every worker looks a new name up each time


# Not met yet (issue 16 stays open on it): with both clients in their sandboxes' CPU groups,
# 2.9-9.7x at load 5 (session 11, bench/README.md), since the flood's lookups take no thread
# (`hosts_file`: its names are not in /etc/hosts and nsswitch says `hosts: files`; the flooded
# p99 went from ~30 ms to 5-12 ms). What is left: the proxy's work for the flood, served
# faster now and so sent more (its loop's turns are shared per sandbox by steps, not bounded
# in time), and the kernel's: the flood's client takes a core of two, and the two sandboxes
# share their parent group's CPU weight, which the kernel splits among the cores by load (the
# same client only burning CPU gives 0.5-2.6x on a quiet machine, up to 7x on a loaded one).
# Session 13 (bench/README.md): with the proxy's time shared per sandbox (`time_share`) and
# each turn's slice bounded, 2.19-4.34x at load 5 (1 of 5 within 2x before the slice, 0 of 5
# after): the measuring c=1 sandbox is itself a heavy user (~0.25 of a core) and the tail is
# mostly waiting to run on two cores.
# Session 16, on a new machine at load 0-1.2: 3.2-4.3x, the quiet p99 0.3 ms and the flooded
# 1.0-1.4 ms whether the share is on, off or tuned, and with the GIL's interval or the
# scheduler's slices shortened (bench/README.md): not the proxy's knobs.
# It runs and reports each time; it is to pass, not strictly, once that is fixed.
@pytest.mark.xfail(
    reason="issue 16: one sandbox's flood still stretches another's p99 past 2x (the proxy's "
    "time for the flood and the sandboxes' shared CPU parent, bench/README.md, session 11)",
    strict=False,
)
def test_a_flood_of_uncached_lookups_leaves_another_sandboxs_p99() -> None:
    with ExitStack() as stack:
        net = stack.enter_context(TestInternet())
        base = Path(tempfile.mkdtemp(prefix="lnkf", dir="/tmp"))  # short: unix socket paths
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        base.chmod(0o755)
        lnk = start_lnk(stack, base, resolver_files(base, net))
        seen = sandboxes_measure(stack, lnk, FLOOD_KINDS, ROUNDS, PHASE_S)
        counts = seen.counts
        # the flood happened, and the proxy answered each of its lookups (refused: no address)
        assert counts["lookup"] > 100 * ROUNDS, counts
        assert counts["errors"] == 0, counts
        quiet = [round(r.p99_ms, 2) for r in seen.quiet]
        flooded = [round(r.p99_ms, 2) for r in seen.flooded]
        ratio = seen.p99_ratio
        print(f"p99 quiet {quiet} flooded {flooded} ms: {ratio:.2f}x; flood {counts}")
        assert ratio <= P99_RATIO, (
            f"median p99 {seen.median(False, 'p99_ms'):.2f} ms quiet, "
            f"{seen.median(True, 'p99_ms'):.2f} ms under the flood ({ratio:.1f}x); {counts}"
        )
