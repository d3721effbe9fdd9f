"""The arithmetic of each sandbox's share of the proxy's time while sandboxes contend: how much
of the proxy's CPU a sandbox may use, what its work cost, who is held and for how long. Pure
functions on numbers, table-tested; `fair_share` measures and holds.

The share is a bucket of CPU seconds per sandbox (a token bucket): while another sandbox has
had work in the last `fair_share.RECENT_S`, a sandbox's bucket fills at `rate` (`rate_of`: the
`LOOP_SHARE` of a core split evenly among the sandboxes with work) up to `BURST_S`, and the
CPU of each of its steps and lookup threads is taken from it (`charged`). A bucket below zero
holds its sandbox's new work for as long as the rate takes to fill it back to zero
(`held_for`); the debt is bounded
(`MAX_DEBT_S`), so no hold lasts longer than `MAX_DEBT_S / rate`. A sandbox alone has no
bucket to empty (`held_for` gives 0 when `busy` is 1): it gets the whole proxy.

Why by time and not only by steps: `fair_share` already shares each loop turn by steps, but a
flooding sandbox whose steps fill every turn the measuring one leaves free takes most of the
proxy's core, and on a two-core machine that core is also what the other sandbox's own client
and its origin need: the proxy's work for the flood was most of the other sandbox's flooded
p99 (bench/README.md, session 11: holding each flood lookup 20 ms took the p99 ratio from
~4-5x to ~2.2x). Bounding the flood's proxy time leaves that CPU to the others, and a
flooding client that waits for its answers sends less.

Within the rate, a turn's part: a sandbox's steps in one loop turn take at most `TURN_SLICE_S`
of CPU (its further steps wait for a later turn, `fair_share.must_wait`), and a held sandbox's
steps are resumed a turn's slice at a time by their cost (`wakes`, on the estimate
`averaged`), so another sandbox's step waits behind at most about one slice and one step.

Limits: this does NOT
- know what a step will cost before it runs: a step runs to its end and is charged after, so
  a sandbox may overdraw by one interval's work (held longer for it after, up to the bound);
- weigh sandboxes differently: each sandbox with work has the same share;
- lend a quiet sandbox's unused share to a busy one (the share is not work-conserving while
  another sandbox has work: the headroom is what keeps that sandbox's latency).
"""

from __future__ import annotations

__all__ = [
    "BURST_S",
    "LOOP_SHARE",
    "MAX_DEBT_S",
    "STEP_WEIGHT",
    "TURN_SLICE_S",
    "averaged",
    "charged",
    "held_for",
    "rate_of",
    "refilled",
    "wakes",
]

# The part of one core's time the proxy's loop shares out among sandboxes with work, while
# more than one has: the rest is left to the machine (the sandboxes' own clients, their
# origins), which the measured p99 needs on two cores (bench/README.md, session 12).
LOOP_SHARE = 0.5
# A sandbox's most credit: the proxy time it may take in one go before it is held (a few
# requests' work, ~50-100 us each), so a burst of a page's requests is not held at all.
BURST_S = 0.002
# A sandbox's most debt (one interval's work can overdraw it): bounds the longest hold at
# MAX_DEBT_S / rate (0.2 s for two sandboxes with work), far below every timeout of the proxy.
MAX_DEBT_S = 0.05


def rate_of(busy: int, loop_share: float = LOOP_SHARE) -> float:
    """CPU seconds per second each of `busy` sandboxes with work may use (at least one)."""
    return loop_share / max(busy, 1)


def refilled(balance: float, elapsed_s: float, rate: float, burst_s: float = BURST_S) -> float:
    """The bucket `elapsed_s` later, filled at `rate`, never above `burst_s`."""
    if balance >= burst_s:
        return burst_s
    return min(burst_s, balance + max(elapsed_s, 0.0) * rate)


def charged(balance: float, cost_s: float, max_debt_s: float = MAX_DEBT_S) -> float:
    """The bucket after work of `cost_s` CPU seconds, never below `-max_debt_s`."""
    return max(balance - max(cost_s, 0.0), -max_debt_s)


def held_for(balance: float, rate: float, busy: int) -> float:
    """Seconds the sandbox's new work waits before it runs: until `rate` fills its bucket back
    to zero, while another of the `busy` sandboxes has work; 0 for a sandbox alone."""
    if busy <= 1 or balance >= 0.0 or rate <= 0.0:
        return 0.0
    return -balance / rate


# The most of the proxy's time one sandbox's steps take in one turn of the loop while another
# has work: a turn runs every step that was ready when it began, so another sandbox's step
# ready in the same turn waits behind them all; counted in steps alone (`PER_TURN` 8 fresh
# plus 8 woken), a flood of ~100-200 us steps made a turn 1.5-3 ms long, beyond the measured
# sandbox's whole quiet p99 (~1 ms). A few of its steps, or one long one (run to its end).
TURN_SLICE_S = 0.0003
# How much the latest turn's cost per step moves a sandbox's estimate (`averaged`): a few
# turns' memory, so one turn of odd steps does not decide how many are woken next.
STEP_WEIGHT = 0.25


def averaged(estimate_s: float, spent_s: float, steps: int, weight: float = STEP_WEIGHT) -> float:
    """A sandbox's cost per step after a turn in which `steps` of its steps spent `spent_s`
    (the first turn's cost as it is; a turn with no step counted leaves it as it was)."""
    if steps <= 0 or spent_s < 0.0:
        return estimate_s
    cost = spent_s / steps
    if estimate_s <= 0.0:
        return cost
    return estimate_s + weight * (cost - estimate_s)


def wakes(step_s: float, slice_s: float, most: int) -> int:
    """How many of a sandbox's waiting steps to resume for one turn: as many as its cost per
    step fits in `slice_s`, never fewer than one (it is still served), never more than `most`."""
    if step_s <= 0.0:
        return max(most, 1)
    return max(1, min(most, int(slice_s / step_s + 1e-9)))  # 0.0003 / 0.0001 is 2.999...
