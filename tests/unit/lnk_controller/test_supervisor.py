"""The supervisor: a body killed by an exception (or returning early) is started again, with a
back-off, and nothing is started after stop."""

from __future__ import annotations

import threading

import pytest

from lnk_controller.supervisor import RESTART_FIRST_S, RESTART_MAX_S, restart_delay, supervise

WAIT_S = 10.0  # generous: only a hang would take this long


@pytest.mark.parametrize(
    ("deaths", "delay"),
    [(0, 0.0), (1, RESTART_FIRST_S), (2, 2 * RESTART_FIRST_S), (40, RESTART_MAX_S)],
)
def test_restart_delay(deaths: int, delay: float) -> None:
    assert restart_delay(deaths) == delay


def test_a_body_killed_by_exceptions_is_started_again(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    runs: list[int] = []
    third = threading.Event()

    def body(_stop: threading.Event) -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError("injected")
        third.set()
        _stop.wait()

    thread = supervise("body", body, stop)
    try:
        assert third.wait(WAIT_S), "the body was not started a third time"
    finally:
        stop.set()
        thread.join(WAIT_S)
    assert not thread.is_alive()
    assert len(runs) == 3
    assert caplog.text.count("body thread ended by an exception") == 2
    assert "RuntimeError: injected" in caplog.text
    assert "restarted in" in caplog.text


def test_a_body_that_returns_early_is_started_again() -> None:
    stop = threading.Event()
    runs: list[int] = []
    again = threading.Event()

    def body(_stop: threading.Event) -> None:
        runs.append(1)
        if len(runs) == 2:
            again.set()
            _stop.wait()

    thread = supervise("body", body, stop)
    try:
        assert again.wait(WAIT_S)
    finally:
        stop.set()
        thread.join(WAIT_S)
    assert len(runs) == 2


def test_nothing_is_started_once_stopped() -> None:
    stop = threading.Event()
    stop.set()
    runs: list[int] = []
    thread = supervise("body", lambda _s: runs.append(1), stop)
    thread.join(WAIT_S)
    assert runs == []
