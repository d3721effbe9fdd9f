"""A flood of each kind from one sandbox (tunnels, refusals, uncached lookups) holds another
sandbox's c=1 requests within a bound, and the flooding sandbox is still served: slower, held
by its share of the proxy's time (`lnk_proxy.time_share`), nothing of it refused for fairness.

The same harness as tests/e2e/test_proxy_fair_latency.py (bench/proxy_fairness.py's
`sandboxes_measure`: the proxy from this checkout as nobody, the test internet's hosts in
network namespaces, each client in a sandbox's CPU group), its flood one kind at a time.
Lookups that never answer are tests/e2e/test_proxy_fairness.py's (a resolver that drops them).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from proxy_fairness import FLOOD_SANDBOX, sandboxes_measure  # noqa: E402
from proxy_procs import SANDBOX, TestInternet, resolver_files, start_lnk  # noqa: E402

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

PHASE_S = 1.0  # one quiet or flooded window of c=1 requests
ROUNDS = 3
# The measured sandbox's median flooded p99: a tenth of what a hold of the flood's own kind
# can last (`time_share.MAX_DEBT_S` / its rate, 0.2 s for two sandboxes), so a measured
# sandbox held like the flood shows; far above the 5-40 ms seen at load 2-8 (bench/README.md).
P99_BOUND_MS = 100.0
SERVED = 50  # the flood's exchanges answered per flooded window at the least: still served


@pytest.mark.parametrize("kind", ["tunnel", "refusal", "lookup"])
def test_a_flood_of_one_kind_holds_the_flooder_not_the_other_sandbox(kind: str) -> None:
    with ExitStack() as stack:
        net = stack.enter_context(TestInternet())
        base = Path(tempfile.mkdtemp(prefix="lnkk", dir="/tmp"))  # short: unix socket paths
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        base.chmod(0o755)
        lnk = start_lnk(stack, base, resolver_files(base, net))
        seen = sandboxes_measure(stack, lnk, kind, ROUNDS, PHASE_S)
        measured = lnk.admin({"op": "stats", "sandbox": SANDBOX})
        flood = lnk.admin({"op": "stats", "sandbox": FLOOD_SANDBOX})
    counts = seen.counts
    p99s = [r.p99_ms for r in seen.flooded]
    print(f"{kind}: flooded p99 {p99s} ms; flood {counts}; measured {measured}; flood {flood}")
    # the flood was served, every exchange answered as it asked (a tunnel's 200, a refusal's
    # or an unknown name's 403), none refused or dropped for its share
    assert counts[kind] > SERVED * ROUNDS and counts["errors"] == 0, counts
    assert all(r.errors == 0 for r in seen.quiet + seen.flooded)
    # held by its share, the other sandbox less: a c=1 client through the fast path at
    # ~3,500 requests/s uses about its even share itself (~0.25 of a core), so it is held a
    # little too (0.13-0.32 s against the flood's 1.97-5.4 s in 3 s flooded, 3 Dec 12:54)
    assert flood["holds"] > 0, flood
    assert measured["held_s"] < flood["held_s"] / 3, (measured, flood)
    assert statistics.median(p99s) <= P99_BOUND_MS, p99s
