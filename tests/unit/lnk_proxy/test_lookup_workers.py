"""`LookupWorkers`: a lookup is queued for a kept thread; a thread is started only when every
kept one is busy (the event loop waited in `Thread.start` once per lookup before), never past
the cap, and an idle thread leaves without losing a job queued as it goes."""

from __future__ import annotations

import threading

import pytest

from lnk_proxy.lookup_workers import LookupWorkers

WAIT_S = 10.0  # a bound for a wait that ends in microseconds; only a hang reaches it


def _run(workers: LookupWorkers, count: int) -> None:
    """`count` jobs one after another, each waited for (as sequential lookups are)."""
    for _ in range(count):
        done = threading.Event()
        workers.submit(done.set, in_flight=1)
        assert done.wait(WAIT_S)


def test_sequential_lookups_start_one_thread_not_one_each() -> None:
    workers = LookupWorkers(max_workers=16)
    ran_on: set[threading.Thread] = set()
    for _ in range(200):
        done = threading.Event()
        workers.submit(lambda d=done: (ran_on.add(threading.current_thread()), d.set()), 1)
        assert done.wait(WAIT_S)
    assert workers.alive == 1
    assert len(ran_on) == 1


def test_a_thread_is_started_only_when_every_kept_one_is_busy_and_never_past_the_cap() -> None:
    workers = LookupWorkers(max_workers=4)
    release = threading.Event()
    started = threading.Semaphore(0)

    def blocked() -> None:
        started.release()
        release.wait(WAIT_S)

    try:
        for in_flight in range(1, 5):
            workers.submit(blocked, in_flight)
            assert workers.alive == in_flight
        for _ in range(4):
            assert started.acquire(timeout=WAIT_S)
        workers.submit(blocked, 5)  # the resolver never does (its cap): queued, no 5th thread
        assert workers.alive == 4
    finally:
        release.set()
    assert started.acquire(timeout=WAIT_S)  # the queued job ran on a kept thread


def test_an_idle_thread_leaves_and_a_later_job_still_runs() -> None:
    workers = LookupWorkers(max_workers=2, idle_s=0.01)
    ran_on: list[threading.Thread] = []
    done = threading.Event()
    workers.submit(lambda: (ran_on.append(threading.current_thread()), done.set()), 1)
    assert done.wait(WAIT_S)
    ran_on[0].join(WAIT_S)
    assert not ran_on[0].is_alive()
    assert workers.alive == 0
    _run(workers, 1)  # a new thread is started for it
    assert workers.alive <= 1


def test_no_thread_may_be_started_raises_and_queues_nothing() -> None:
    workers = LookupWorkers(max_workers=0)
    with pytest.raises(RuntimeError, match="no lookup thread"):
        workers.submit(lambda: None, in_flight=1)
