"""A stop event a `select` can wait on: readable once set, whoever sets it (a thread, or a
signal handler while the main thread sleeps in `select` with no timeout)."""

from __future__ import annotations

import os
import select
import signal
import threading
import time

from lnk_shared.waking_event import WakingEvent

BOUND_S = 5.0  # how long a wait may take before the test calls it hung: the wake is at once


def test_it_is_readable_only_once_set() -> None:
    stop = WakingEvent()
    try:
        assert select.select([stop.fileno()], [], [], 0)[0] == []
        assert not stop.is_set()
        stop.set()
        stop.set()  # twice is as once
        assert stop.is_set()
        assert select.select([stop.fileno()], [], [], 0)[0] == [stop.fileno()]
    finally:
        stop.close()


def test_a_set_from_another_thread_wakes_a_wait() -> None:
    stop = WakingEvent()
    try:
        threading.Timer(0.1, stop.set).start()
        t0 = time.monotonic()
        ready = select.select([stop.fileno()], [], [], BOUND_S)[0]
        assert ready and time.monotonic() - t0 < BOUND_S
    finally:
        stop.close()


def test_a_set_from_a_signal_handler_wakes_the_main_threads_wait() -> None:
    """Python retries a `select` a signal interrupted, after running the handler: the handler's
    `set` must leave it something to find."""
    stop = WakingEvent()
    old = signal.signal(signal.SIGUSR1, lambda *_: stop.set())
    try:
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        t0 = time.monotonic()
        ready = select.select([stop.fileno()], [], [], BOUND_S)[0]
        assert ready and time.monotonic() - t0 < BOUND_S
    finally:
        signal.signal(signal.SIGUSR1, old)
        stop.close()


def test_a_set_after_close_does_not_raise() -> None:
    stop = WakingEvent()
    stop.close()
    stop.set()
    assert stop.is_set()
