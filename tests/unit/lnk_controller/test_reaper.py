"""The lease reaper: its plan as a table, back-off, and passes where one row's clean-up always
fails, a kill fails, or the database cannot be read: every other row is still enforced."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lnk_controller.models import SandboxRow
from lnk_controller.reap_wait import ReapWait
from lnk_controller.reaper import (
    RETRY_FIRST_S,
    RETRY_MAX_S,
    RETRY_PASS_S,
    Reaper,
    Retry,
    Wake,
    next_wake,
    plan,
    retry_delay,
)
from lnk_shared.errors import StateError

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
WAIT_S = 10.0  # generous: only a hang takes this long
HOUR = timedelta(hours=1)


class _Inline(futures.Executor):
    """Runs each clean-up as it is submitted, so a pass is over when run_pass returns."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future[Any]:
        done: futures.Future[Any] = futures.Future()
        done.set_result(fn(*args, **kwargs))
        return done


def _row(
    sandbox_id: str, *, expired: bool, state: str = "running", ends: datetime | None = None
) -> SandboxRow:
    return SandboxRow(
        id=sandbox_id,
        owner_uid=1000,
        host_uid=2_000_000_000,
        host_name="lnk-x",
        state=state,
        paused=False,
        stop_requested=False,
        pid=None,
        pid_start=None,
        staging_dir="/nowhere",
        mounts_json="[]",
        command_json="[]",
        spec_hash="0" * 64,
        created_at=NOW - timedelta(hours=1),
        lease_expires_at=ends or (NOW - timedelta(seconds=1) if expired else NOW + HOUR),
        ended_at=None,
        exit_status=None,
    )


@pytest.mark.parametrize(
    ("attempts", "delay"),
    [
        (0, 0.0),
        (1, RETRY_FIRST_S),
        (2, 2 * RETRY_FIRST_S),
        (3, 4 * RETRY_FIRST_S),
        (50, RETRY_MAX_S),
        (10**9, RETRY_MAX_S),
    ],
)
def test_retry_delay_doubles_up_to_its_cap(attempts: int, delay: float) -> None:
    assert retry_delay(attempts) == delay


# (row, retries, killed, in_flight) -> (killed now, cleaned now)
PLAN_TABLE = [
    ("a lease not over: nothing", _row("a", expired=False), {}, set(), set(), False, False),
    ("a lease over: killed and cleaned", _row("a", expired=True), {}, set(), set(), True, True),
    ("killed before: not again", _row("a", expired=True), {}, {"a"}, set(), False, True),
    ("a clean-up running: not twice", _row("a", expired=True), {}, {"a"}, {"a"}, False, False),
    (
        "failed, back-off not over: waits",
        _row("a", expired=True),
        {"a": Retry(1, "x", 11.0)},
        {"a"},
        set(),
        False,
        False,
    ),
    (
        "failed, back-off over: retried",
        _row("a", expired=True),
        {"a": Retry(1, "x", 9.0)},
        {"a"},
        set(),
        False,
        True,
    ),
    (
        "stopping (a launch's clean-up failed), lease not over: retried, not killed",
        _row("a", expired=False, state="stopping"),
        {},
        set(),
        set(),
        False,
        True,
    ),
]


@pytest.mark.parametrize(
    ("row", "retries", "killed", "in_flight", "kill", "clean"),
    [pytest.param(*case[1:], id=case[0]) for case in PLAN_TABLE],
)
def test_plan(
    row: SandboxRow,
    retries: dict[str, Retry],
    killed: set[str],
    in_flight: set[str],
    kill: bool,
    clean: bool,
) -> None:
    planned = plan(
        [row],
        now=NOW,
        clock=10.0,
        retries=retries,
        killed=killed,
        in_flight=in_flight,
        active={"a"},
    )
    assert [r.id for r in planned.kill] == (["a"] if kill else [])
    assert [r.id for r in planned.clean] == (["a"] if clean else [])


@pytest.mark.parametrize("state", ["starting", "running"])
def test_a_live_record_no_launch_has_is_a_ghost_cleaned_not_killed(state: str) -> None:
    ghost = _row("ghost", expired=False, state=state)
    launching = _row("launching", expired=False, state=state)
    planned = plan(
        [ghost, launching],
        now=NOW,
        clock=0.0,
        retries={},
        killed=set(),
        in_flight=set(),
        active={"launching"},
    )
    assert planned.kill == ()
    assert [r.id for r in planned.clean] == ["ghost"]


def test_a_row_in_back_off_does_not_hold_up_the_rows_after_it() -> None:
    rows = [_row("stuck", expired=True), _row("next", expired=True)]
    retries = {"stuck": Retry(3, "mounted", 99.0)}
    planned = plan(
        rows,
        now=NOW,
        clock=10.0,
        retries=retries,
        killed={"stuck"},
        in_flight=set(),
        active={"stuck", "next"},
    )
    assert [r.id for r in planned.kill] == ["next"]
    assert [r.id for r in planned.clean] == ["next"]


class _Box:
    """What a reaper acts on, in memory: live rows, clean-ups that fail for named ids."""

    def __init__(self, rows: list[SandboxRow], failing: set[str]) -> None:
        self.rows = {r.id: r for r in rows}
        self.failing = failing
        self.killed: list[str] = []
        self.kill_fails: set[str] = set()
        self.clock = 0.0
        self.attempts: list[str] = []

    def live(self) -> list[SandboxRow]:
        return list(self.rows.values())

    def kill(self, row: SandboxRow) -> None:
        if row.id in self.kill_fails:
            raise StateError(f"cannot kill {row.id}")
        self.killed.append(row.id)

    def clean(self, sandbox_id: str) -> None:
        self.attempts.append(sandbox_id)
        if sandbox_id in self.failing:
            raise StateError(f"something is mounted under the home of {sandbox_id}")
        del self.rows[sandbox_id]

    def reaper(self, **kw: Any) -> Reaper:
        return Reaper(
            live_rows=self.live,
            clean=self.clean,
            now=lambda: NOW,
            clock=lambda: self.clock,
            kill=self.kill,
            active=kw.pop("active", lambda: set(self.rows)),
            workers=kw.pop("workers", _Inline()),
            **kw,
        )


def test_a_clean_up_that_always_fails_does_not_stop_the_next_lease() -> None:
    box = _Box([_row("stuck", expired=True), _row("next", expired=True)], failing={"stuck"})
    reaper = box.reaper()
    reaper.run_pass()
    assert sorted(box.killed) == ["next", "stuck"]
    assert "next" not in box.rows  # cleaned away, though the older row failed first
    assert reaper.retrying("stuck") == "something is mounted under the home of stuck"
    assert reaper.retrying("next") is None


def test_a_clean_up_that_hangs_does_not_hold_up_another_rows_kill_or_clean_up() -> None:
    hung, release = threading.Event(), threading.Event()
    box = _Box([_row("hung", expired=True), _row("next", expired=True)], failing=set())
    cleaned_next = threading.Event()
    plain_clean = box.clean

    def clean(sandbox_id: str) -> None:
        if sandbox_id == "hung":
            hung.set()
            assert release.wait(WAIT_S)
        plain_clean(sandbox_id)
        if sandbox_id == "next":
            cleaned_next.set()

    box.clean = clean  # type: ignore[method-assign]
    reaper = box.reaper(workers=futures.ThreadPoolExecutor(2))
    try:
        reaper.run_pass()
        assert hung.wait(WAIT_S)
        assert cleaned_next.wait(WAIT_S), "one hung clean-up held up another"
        assert sorted(box.killed) == ["hung", "next"]
    finally:
        release.set()
        reaper.shutdown()


def test_a_failed_clean_up_is_retried_after_its_back_off_then_forgotten() -> None:
    box = _Box([_row("stuck", expired=True)], failing={"stuck"})
    reaper = box.reaper()
    reaper.run_pass()
    assert reaper.retrying("stuck") is not None
    box.clock = RETRY_FIRST_S / 2
    reaper.run_pass()  # within the back-off: not tried again
    assert box.attempts == ["stuck"]
    box.clock = RETRY_FIRST_S
    reaper.run_pass()  # the second failure doubles the back-off
    box.clock = 2 * RETRY_FIRST_S
    reaper.run_pass()
    assert box.attempts == ["stuck", "stuck"]
    box.failing.clear()  # the admin unmounted what was stuck
    box.clock = 3 * RETRY_FIRST_S
    reaper.run_pass()
    assert box.attempts == ["stuck", "stuck", "stuck"]
    assert box.killed == ["stuck"]  # killed once, not on every pass
    assert reaper.retrying("stuck") is None
    assert box.rows == {}


def test_a_kill_that_fails_is_logged_and_the_other_rows_still_killed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    box = _Box([_row("bad", expired=True), _row("next", expired=True)], failing=set())
    box.kill_fails = {"bad"}
    reaper = box.reaper()
    reaper.run_pass()
    assert box.killed == ["next"]
    assert "cannot kill the processes of bad" in caplog.text


def test_an_unreadable_database_is_logged_and_the_pass_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def unreadable() -> list[SandboxRow]:
        raise StateError("cannot read the controller database /x (disk I/O error)")

    reaper = Reaper(
        live_rows=unreadable,
        active=set,
        clean=lambda _id: None,
        now=lambda: NOW,
        clock=lambda: 0.0,
        workers=_Inline(),
    )
    reaper.run_pass()
    assert "disk I/O error" in caplog.text


def test_a_ghost_whose_write_fails_is_retried_until_it_lands() -> None:
    """A launch's last write failed (a full disk): its record says running, no launch has it;
    each pass retries its clean-up after the back-off, and once the disk has room it ends."""
    box = _Box([_row("ghost", expired=False)], failing={"ghost"})
    reaper = box.reaper(active=set)
    reaper.run_pass()
    assert box.killed == [] and box.attempts == ["ghost"]
    assert reaper.retrying("ghost") is not None
    box.failing.clear()
    box.clock = RETRY_FIRST_S
    reaper.run_pass()
    assert box.rows == {} and reaper.retrying("ghost") is None


def test_the_injected_crash_raises_on_every_nth_pass_only() -> None:
    reaper = _Box([], failing=set()).reaper(crash_every=2)
    reaper.run_pass()
    with pytest.raises(RuntimeError, match="unsafe_test_reaper_crash_every=2"):
        reaper.run_pass()
    reaper.run_pass()


# (rows, retries, killed, in_flight, active) -> the wake after the pass that left them
WAKE_TABLE = [
    ("nothing live: only the idle pass", [], {}, set(), set(), set(), Wake()),
    (
        "one lease running: its end",
        [_row("a", expired=False)],
        {},
        set(),
        set(),
        {"a"},
        Wake(lease_end=NOW + HOUR),
    ),
    (
        "two leases: the earlier end",
        [_row("a", expired=False), _row("b", expired=False, ends=NOW + timedelta(seconds=5))],
        {},
        set(),
        set(),
        {"a", "b"},
        Wake(lease_end=NOW + timedelta(seconds=5)),
    ),
    (
        "killed and its clean-up running: nothing until the clean-up rings",
        [_row("a", expired=True)],
        {},
        {"a"},
        {"a"},
        {"a"},
        Wake(),
    ),
    (
        "a kill that failed: tried again soon, as the old tick did",
        [_row("a", expired=True)],
        {},
        set(),
        {"a"},
        {"a"},
        Wake(after_s=RETRY_PASS_S),
    ),
    (
        "a clean-up in back-off: its end",
        [_row("a", expired=True)],
        {"a": Retry(2, "x", 13.0)},
        {"a"},
        set(),
        {"a"},
        Wake(after_s=3.0),
    ),
    (
        "a ghost in back-off: its end, and its lease's",
        [_row("a", expired=False)],
        {"a": Retry(1, "x", 11.0)},
        set(),
        set(),
        set(),
        Wake(lease_end=NOW + HOUR, after_s=1.0),
    ),
    (
        "stopping, not killed: no kill due, its back-off",
        [_row("a", expired=True, state="stopping")],
        {"a": Retry(1, "x", 10.5)},
        set(),
        set(),
        {"a"},
        Wake(after_s=0.5),
    ),
    (
        "due, no clean-up running nor back-off (one just ended): at once",
        [_row("a", expired=True)],
        {},
        {"a"},
        set(),
        {"a"},
        Wake(after_s=0.0),
    ),
]


@pytest.mark.parametrize(
    ("rows", "retries", "killed", "in_flight", "active", "wake"),
    [pytest.param(*case[1:], id=case[0]) for case in WAKE_TABLE],
)
def test_next_wake(
    rows: list[SandboxRow],
    retries: dict[str, Retry],
    killed: set[str],
    in_flight: set[str],
    active: set[str],
    wake: Wake,
) -> None:
    got = next_wake(
        rows,
        now=NOW,
        clock=10.0,
        retries=retries,
        killed=killed,
        in_flight=in_flight,
        active=active,
    )
    assert got == wake


class _Running:
    """A reaper's run loop in its thread, on the real clocks and a real ReapWait; `passes`
    counts its reads of the records."""

    def __init__(self, box: _Box) -> None:
        self.box = box
        self.wait = ReapWait()
        self.stop = threading.Event()
        self.passes = threading.Semaphore(0)
        self.killed = threading.Event()
        self.attempted = threading.Event()
        self.cleaned = threading.Event()
        plain_live, plain_kill, plain_clean = box.live, box.kill, box.clean

        def live() -> list[SandboxRow]:
            self.passes.release()
            return plain_live()

        def kill(row: SandboxRow) -> None:
            plain_kill(row)
            self.killed.set()

        def clean(sandbox_id: str) -> None:
            self.attempted.set()
            plain_clean(sandbox_id)
            self.cleaned.set()

        self.reaper = Reaper(
            live_rows=live,
            active=lambda: {i for i in box.rows if not i.startswith("ghost")},
            clean=clean,
            now=lambda: datetime.now(UTC),
            clock=time.monotonic,
            kill=kill,
            workers=_Inline(),
            wait=self.wait,
        )
        self.thread = threading.Thread(target=self.reaper.run, args=(self.stop,))

    def __enter__(self) -> _Running:
        self.thread.start()
        assert self.passes.acquire(timeout=WAIT_S)  # its first pass: asleep after it
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.reaper.shutdown()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive()
        self.wait.close()


def test_a_lease_written_while_the_reaper_sleeps_is_enforced_at_its_end() -> None:
    box = _Box([], failing=set())
    with _Running(box) as running:
        ends = datetime.now(UTC) + timedelta(milliseconds=200)
        box.rows["new"] = _row("new", expired=False, ends=ends)
        running.wait.ring_by(ends)  # the store's create
        assert running.killed.wait(WAIT_S), "a lease written while asleep was never enforced"
        assert box.killed == ["new"] and "new" not in box.rows


def test_a_lease_shortened_while_the_reaper_sleeps_towards_its_old_end_is_enforced() -> None:
    box = _Box([_row("a", expired=False, ends=datetime.now(UTC) + HOUR)], failing=set())
    with _Running(box) as running:  # asleep towards the hour's end
        shortened = datetime.now(UTC) - timedelta(seconds=1)
        box.rows["a"] = _row("a", expired=True, ends=shortened)
        running.wait.ring_by(shortened)  # the store's extend_lease
        assert running.killed.wait(WAIT_S)
        assert box.killed == ["a"]


def test_a_row_a_launch_left_is_cleaned_once_rung() -> None:
    box = _Box([], failing=set())
    with _Running(box) as running:
        ends = datetime.now(UTC) + HOUR
        box.rows["ghost"] = _row(
            "ghost", expired=False, ends=ends
        )  # no launch has it: `active` is empty
        running.wait.ring()  # the launch's clean_or_leave
        assert running.cleaned.wait(WAIT_S)
        assert box.rows == {} and box.killed == []


def test_a_failed_clean_up_is_retried_at_its_back_off_without_a_ring() -> None:
    box = _Box([_row("stuck", expired=True)], failing={"stuck"})
    with _Running(box) as running:
        assert running.attempted.wait(WAIT_S)
        assert not running.cleaned.is_set()  # the first pass tried it and it failed
        box.failing.clear()
        assert running.cleaned.wait(WAIT_S), "the back-off's end woke nothing"
        assert box.rows == {} and box.attempts == ["stuck", "stuck"]
