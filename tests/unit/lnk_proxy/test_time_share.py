"""The share arithmetic: each sandbox's rate while others have work, its bucket's fill and
charge, and who is held for how long (`held_for`)."""

from __future__ import annotations

import pytest

from lnk_proxy.time_share import (
    BURST_S,
    LOOP_SHARE,
    MAX_DEBT_S,
    STEP_WEIGHT,
    TURN_SLICE_S,
    averaged,
    charged,
    held_for,
    rate_of,
    refilled,
    wakes,
)


@pytest.mark.parametrize(
    ("busy", "loop_share", "rate"),
    [
        (1, 0.5, 0.5),
        (2, 0.5, 0.25),
        (4, 0.5, 0.125),
        (10, 1.0, 0.1),
        (0, 0.5, 0.5),  # no one counted yet: as one
    ],
)
def test_rate_of(busy: int, loop_share: float, rate: float) -> None:
    assert rate_of(busy, loop_share) == pytest.approx(rate)


@pytest.mark.parametrize(
    ("balance", "elapsed_s", "rate", "burst_s", "after"),
    [
        (0.0, 0.004, 0.25, 0.002, 0.001),
        (-0.002, 0.004, 0.25, 0.002, -0.001),
        (0.001, 1.0, 0.25, 0.002, 0.002),  # never above the burst
        (0.002, 0.0, 0.25, 0.002, 0.002),
        (0.005, 0.0, 0.25, 0.002, 0.002),  # a larger balance (a changed burst) is cut
        (-0.01, -1.0, 0.25, 0.002, -0.01),  # a clock that went back fills nothing
        (-0.05, 0.2, 0.25, 0.002, 0.0),  # the longest hold of two sandboxes ends at zero
    ],
)
def test_refilled(
    balance: float, elapsed_s: float, rate: float, burst_s: float, after: float
) -> None:
    assert refilled(balance, elapsed_s, rate, burst_s) == pytest.approx(after)


@pytest.mark.parametrize(
    ("balance", "cost_s", "max_debt_s", "after"),
    [
        (0.002, 0.0005, 0.05, 0.0015),
        (0.0, 0.001, 0.05, -0.001),
        (-0.049, 0.01, 0.05, -0.05),  # the debt is bounded
        (0.001, -0.5, 0.05, 0.001),  # a negative cost (a clock's error) credits nothing
    ],
)
def test_charged(balance: float, cost_s: float, max_debt_s: float, after: float) -> None:
    assert charged(balance, cost_s, max_debt_s) == pytest.approx(after)


@pytest.mark.parametrize(
    ("balance", "rate", "busy", "hold_s"),
    [
        (-0.001, 0.25, 2, 0.004),  # held until the rate fills the bucket back to zero
        (-0.05, 0.25, 2, 0.2),  # the longest hold of two sandboxes with work
        (-0.001, 0.05, 10, 0.02),
        (0.0, 0.25, 2, 0.0),  # an empty bucket, not below zero: runs
        (0.001, 0.25, 2, 0.0),
        (-0.05, 0.5, 1, 0.0),  # alone: never held, whatever it used
        (-0.001, 0.0, 2, 0.0),  # no rate (a share of zero): never a hold without end
    ],
)
def test_held_for(balance: float, rate: float, busy: int, hold_s: float) -> None:
    assert held_for(balance, rate, busy) == pytest.approx(hold_s)


def test_the_longest_hold_is_far_below_the_proxys_timeouts() -> None:
    """Two sandboxes with work: at most MAX_DEBT_S / rate, a fraction of a second (the head
    timeout is 60 s, a lookup's 5 s)."""
    longest = held_for(-MAX_DEBT_S, rate_of(2), 2)
    assert 0.0 < longest <= 0.5
    assert 0.0 < LOOP_SHARE <= 1.0
    assert 0.0 < BURST_S < MAX_DEBT_S


@pytest.mark.parametrize(
    ("estimate_s", "spent_s", "steps", "after"),
    [
        (0.0, 0.0004, 4, 0.0001),  # the first turn's cost as it is
        (0.0001, 0.0005, 1, 0.0001 + STEP_WEIGHT * 0.0004),  # moved a part of the way
        (0.0002, 0.0002, 1, 0.0002),
        (0.0001, 0.001, 0, 0.0001),  # no step counted (a lookup thread's CPU only): unchanged
        (0.0001, -0.001, 2, 0.0001),  # a clock's error changes nothing
    ],
)
def test_averaged(estimate_s: float, spent_s: float, steps: int, after: float) -> None:
    assert averaged(estimate_s, spent_s, steps) == pytest.approx(after)


@pytest.mark.parametrize(
    ("step_s", "slice_s", "most", "woken"),
    [
        (0.0, 0.0003, 8, 8),  # cost not known yet: as many as the step count allows
        (0.00005, 0.0003, 8, 6),
        (0.00001, 0.0003, 8, 8),  # cheap steps: the step count bounds them
        (0.0001, 0.0003, 8, 3),
        (0.0005, 0.0003, 8, 1),  # one step past the slice: still one a turn, never none
        (0.1, 0.0003, 8, 1),
        (0.0, 0.0003, 0, 1),
    ],
)
def test_wakes(step_s: float, slice_s: float, most: int, woken: int) -> None:
    assert wakes(step_s, slice_s, most) == woken


def test_a_turns_slice_is_below_a_quiet_requests_tail() -> None:
    # the measured sandbox's quiet p99 is ~1 ms through the proxy: a slice well below it
    assert 0.0 < TURN_SLICE_S <= 0.0005
