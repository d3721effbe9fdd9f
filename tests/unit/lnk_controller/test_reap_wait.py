"""The reaper's wait, on a real timerfd and eventfd: a lease's end wakes it (never before the
end by the wall clock), a ring wakes it, a ring during a pass is not lost, and a lease written
to end after the one it sleeps towards does not wake it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from lnk_controller.reap_wait import ReapWait

WAIT_S = 10.0  # generous: only a hang takes this long
FAR = timedelta(hours=1)


@pytest.fixture
def wait() -> Iterator[ReapWait]:
    waiting = ReapWait()
    yield waiting
    waiting.close()


def test_a_lease_end_passed_already_wakes_at_once(wait: ReapWait) -> None:
    assert wait.wait(datetime.now(UTC) - timedelta(seconds=1), WAIT_S) == "lease"


def test_a_lease_end_wakes_it_not_before_that_end(wait: ReapWait) -> None:
    end = datetime.now(UTC) + timedelta(milliseconds=50)
    assert wait.wait(end, WAIT_S) == "lease"
    assert datetime.now(UTC) >= end  # the timer is on the wall clock the leases are in


def test_nothing_due_and_no_ring_is_a_timeout(wait: ReapWait) -> None:
    assert wait.wait(datetime.now(UTC) + FAR, 0.0) == "timeout"
    assert wait.wait(None, 0.0) == "timeout"


def test_a_ring_wakes_a_reaper_asleep_with_nothing_due(wait: ReapWait) -> None:
    woke: list[str] = []
    sleeping = threading.Thread(target=lambda: woke.append(wait.wait(None, None)))
    sleeping.start()
    wait.ring()
    sleeping.join(WAIT_S)
    assert woke == ["ring"]


def test_a_ring_during_a_pass_makes_the_wait_after_it_return_at_once(wait: ReapWait) -> None:
    wait.awake()
    wait.ring()  # a lease written after the pass read the records
    assert wait.wait(datetime.now(UTC) + FAR, WAIT_S) == "ring"


def test_a_ring_before_the_pass_is_drained_by_it(wait: ReapWait) -> None:
    wait.ring()  # written before the pass reads: that pass sees it
    wait.awake()
    assert wait.wait(None, 0.0) == "timeout"


def test_a_lease_written_while_awake_always_rings(wait: ReapWait) -> None:
    wait.awake()
    wait.ring_by(datetime.now(UTC) + FAR)  # the pass may have read the records before it
    assert wait.wait(datetime.now(UTC) + FAR, WAIT_S) == "ring"


def test_only_a_lease_ending_before_the_one_slept_towards_rings(wait: ReapWait) -> None:
    towards = datetime.now(UTC) + FAR
    assert wait.wait(towards, 0.0) == "timeout"  # now asleep towards `towards`
    wait.ring_by(towards + FAR)  # the pass at `towards` reads it: no pass now
    assert wait.wait(towards, 0.0) == "timeout"
    wait.ring_by(towards - timedelta(minutes=59))  # a shorter lease: a pass now
    assert wait.wait(towards, 0.0) == "ring"


def test_with_nothing_due_any_lease_written_rings(wait: ReapWait) -> None:
    assert wait.wait(None, 0.0) == "timeout"
    wait.ring_by(datetime.now(UTC) + FAR * 1000)
    assert wait.wait(None, 0.0) == "ring"
