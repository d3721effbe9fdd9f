"""The lease reaper: ends every sandbox whose lease has run out and retries every clean-up that
failed, row by row, so that no sandbox's fault holds up another's lease.

Each pass reads the live rows and plans (`plan`, a pure function); a live row that no launch
under way has (a ghost: its launch's last write failed on a full disk, or its launch thread
died) is reconciled by the same clean-up, which works from the record and what is really there
(processes, cgroup, mounts, user):
1. kill: each sandbox whose lease is over and that was not yet killed has its processes killed
   at once, in the reaper's own thread: the recorded first process (a pidfd signal) and its
   cgroup (`cgroup.kill`, not waited on). A kill is a few writes and never waits on a clean-up,
   its own or another sandbox's; a kill that fails is logged and tried again RETRY_PASS_S on.
2. clean: each row due for a clean-up (its lease over, or a clean-up that failed before and
   whose back-off has passed) is handed to a pool of CLEAN_WORKERS threads, one job per row at
   a time. A failure is logged and the row retried after `retry_delay(attempts)`; meanwhile the
   API shows it as `cleaning (retrying: <why>)`.
A supervisor (lnk_controller.supervisor) starts the reaper's thread again whenever it ends.

Between passes the reaper sleeps (lnk_controller.reap_wait) until the next thing it has to do
(`next_wake`, pure): the earliest lease's end, a back-off's end, or a ring: a lease written
(the store's `create` and `extend_lease`, which may shorten one), a clean-up that failed,
whoever ran it (the store's `mark_stopping`: a launch's, the API's stop, its own), or a row a
launch left to it without that write (a full disk). At rest it makes no pass but one
every IDLE_PASS_S (it ticked every 0.25 s before: most of the idle controller's CPU).

The bound: a sandbox's processes are sent SIGKILL when its lease ends (a timer at that very
time, then one pass: a query and the kill), or at once when a shorter lease is written, plus
the supervisor's RESTART_MAX_S if the reaper's thread died meanwhile (0.5 s in all, against
0.75 s with the old tick), whatever other rows do; its clean-up follows as soon as a worker is
free.

Does NOT: enforce a lease written to the database by hand sooner than IDLE_PASS_S; enforce
leases while the controller is down (the next start's reconcile cleans every live record); stop
a clean-up that hangs in the kernel (an unmount on a dead network file system): that job holds
its worker, and with all CLEAN_WORKERS stuck other clean-ups wait, their processes already
killed; keep its back-off across restarts (a restart tries every row again).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass, field
from datetime import datetime

from lnk_controller import cgroups, host_users
from lnk_controller.models import SandboxRow
from lnk_controller.reap_wait import ReapWait
from lnk_shared.errors import StateError

__all__ = [
    "CLEAN_WORKERS",
    "IDLE_PASS_S",
    "RETRY_PASS_S",
    "Plan",
    "Reaper",
    "Retry",
    "Wake",
    "next_wake",
    "plan",
    "retry_delay",
]

log = logging.getLogger(__name__)

RETRY_PASS_S = 0.25  # a kill that failed, or an unreadable database, is tried again this soon
IDLE_PASS_S = 60.0  # a pass at least this often, whatever rang: a lease written by hand counts
CLEAN_WORKERS = 4  # clean-ups at once: a hung one (a stuck unmount) holds only its own
RETRY_FIRST_S = 1.0  # a failed clean-up is tried again after this, doubling each time ...
RETRY_MAX_S = 30.0  # ... up to this: a fault fixed by hand is noticed within half a minute
WHY_MAX = 300  # characters of a failure shown to the owner: its first, most telling part


def retry_delay(attempts: int) -> float:
    """Seconds to wait before trying a clean-up that has failed `attempts` times (>= 1)."""
    if attempts < 1:
        return 0.0
    return min(RETRY_FIRST_S * float(2 ** min(attempts - 1, 32)), RETRY_MAX_S)


@dataclass(frozen=True)
class Retry:
    """A clean-up that failed: how often, why (last), and when (monotonic) to try it again."""

    attempts: int
    why: str
    next_at: float


@dataclass(frozen=True)
class Plan:
    kill: tuple[SandboxRow, ...] = ()
    clean: tuple[SandboxRow, ...] = ()


def plan(
    rows: Iterable[SandboxRow],
    *,
    now: datetime,
    clock: float,
    retries: dict[str, Retry],
    killed: set[str],
    in_flight: set[str],
    active: set[str],
) -> Plan:
    """What one pass does. `rows` are the live records; `active` the ids of the launches under
    way (read after the rows). A row is killed once its lease is over (once: `killed` are those
    already killed); it is cleaned when its lease is over, when it is `stopping` (a clean-up
    failed) or when no launch has it (a ghost: its launch's clean-up failed, or the launch died),
    unless a clean-up of it is running (`in_flight`) or its back-off (`retries`) has not passed
    at `clock`."""
    kill: list[SandboxRow] = []
    clean: list[SandboxRow] = []
    for row in rows:
        expired = row.lease_expires_at <= now
        if expired and row.id not in killed and row.state != "stopping":
            kill.append(row)
        due = expired or row.state == "stopping" or row.id not in active
        if not due or row.id in in_flight:
            continue
        retry = retries.get(row.id)
        if retry is None or retry.next_at <= clock:
            clean.append(row)
    return Plan(tuple(kill), tuple(clean))


@dataclass(frozen=True)
class Wake:
    """When the next pass is due: at `lease_end` (wall clock) or `after_s` from now, the
    earlier; None for either is never."""

    lease_end: datetime | None = None
    after_s: float | None = None


def next_wake(
    rows: Iterable[SandboxRow],
    *,
    now: datetime,
    clock: float,
    retries: dict[str, Retry],
    killed: set[str],
    in_flight: set[str],
    active: set[str],
) -> Wake:
    """When the pass after a pass at `now` (wall) and `clock` (monotonic) is due, from what that
    pass left (`plan`'s inputs, updated by its kills and its hand-overs): the earliest end of a
    lease not yet over, RETRY_PASS_S for a kill that failed, and for a row due for a clean-up
    with none running the end of its back-off (at once without one). A clean-up running says
    nothing here: it rings when it fails, and a success leaves nothing to do."""
    lease_end: datetime | None = None
    after: float | None = None
    for row in rows:
        expired = row.lease_expires_at <= now
        if row.id not in killed and row.state != "stopping":
            if expired:
                after = min(after, RETRY_PASS_S) if after is not None else RETRY_PASS_S
            elif lease_end is None or row.lease_expires_at < lease_end:
                lease_end = row.lease_expires_at
        due = expired or row.state == "stopping" or row.id not in active
        if due and row.id not in in_flight:
            retry = retries.get(row.id)
            left = 0.0 if retry is None else max(0.0, retry.next_at - clock)
            after = left if after is None else min(after, left)
    return Wake(lease_end, after)


def kill_processes(row: SandboxRow) -> None:
    """SIGKILL the sandbox's processes at once, without waiting for them to exit."""
    host_users.kill_recorded_process(row.pid, row.pid_start)
    cgroups.kill(row.id)


@dataclass
class _State:
    retries: dict[str, Retry] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)
    in_flight: set[str] = field(default_factory=set)


class Reaper:
    """One pass at a time (`run_pass`), from the thread `run` is the body of; `retrying`
    answers the API from any thread."""

    def __init__(
        self,
        *,
        live_rows: Callable[[], list[SandboxRow]],
        active: Callable[[], set[str]],
        clean: Callable[[str], None],
        now: Callable[[], datetime],
        clock: Callable[[], float],
        kill: Callable[[SandboxRow], None] = kill_processes,
        crash_every: int | None = None,
        workers: futures.Executor | None = None,
        wait: ReapWait | None = None,
    ) -> None:
        self._live_rows = live_rows
        self._active = active
        self._clean = clean
        self._now = now
        self._clock = clock
        self._kill = kill
        self._crash_every = crash_every
        self._passes = 0
        self._state = _State()
        self._guard = threading.Lock()
        self._pool = workers or futures.ThreadPoolExecutor(
            CLEAN_WORKERS, thread_name_prefix="clean"
        )
        self._wait = wait or ReapWait()

    def retrying(self, sandbox_id: str) -> str | None:
        """Why the sandbox's clean-up is being retried, or None when it is not."""
        with self._guard:
            retry = self._state.retries.get(sandbox_id)
        return None if retry is None else retry.why

    def run(self, stop: threading.Event) -> None:
        """A pass, then each next one when it is due (`next_wake`), until `stop` is set and
        `shutdown` (or any ring) wakes it. Ends only so or by an exception (the supervisor
        starts it again, and the first pass of the new run catches up)."""
        while not stop.is_set():
            self._wait.awake()  # before the pass reads: a write after that read rings
            wake = self.run_pass()
            after = IDLE_PASS_S if wake.after_s is None else min(wake.after_s, IDLE_PASS_S)
            self._wait.wait(wake.lease_end, after)

    def run_pass(self) -> Wake:
        """One pass; when the next is due."""
        self._passes += 1
        if self._crash_every and self._passes % self._crash_every == 0:
            raise RuntimeError(
                f"unsafe_test_reaper_crash_every={self._crash_every}: an injected exception "
                f"ends the reaper thread on pass {self._passes}"
            )
        try:
            rows = self._live_rows()
        except StateError as exc:  # the database unreadable: logged, tried again soon
            log.error("lease reaper: %s", exc)
            return Wake(after_s=RETRY_PASS_S)
        active = self._active()  # after the rows: a launch's record is never taken for a ghost
        now, clock = self._now(), self._clock()
        with self._guard:
            live = {row.id for row in rows}
            state = self._state
            state.killed &= live  # forget rows that are over
            state.retries = {k: v for k, v in state.retries.items() if k in live}
            todo = plan(
                rows,
                now=now,
                clock=clock,
                retries=dict(state.retries),
                killed=set(state.killed),
                in_flight=set(state.in_flight),
                active=active,
            )
            state.in_flight.update(row.id for row in todo.clean)
        for row in todo.kill:
            log.info("lease of %s expired: killing its processes", row.id)
            try:
                self._kill(row)
            except Exception:  # each row on its own: logged, tried again next pass
                log.exception("lease reaper: cannot kill the processes of %s", row.id)
            else:
                with self._guard:
                    state.killed.add(row.id)
        for row in todo.clean:
            self._pool.submit(self._clean_one, row.id)
        with self._guard:
            return next_wake(
                rows,
                now=now,
                clock=clock,
                retries=dict(state.retries),
                killed=set(state.killed),
                in_flight=set(state.in_flight),
                active=active,
            )

    def _clean_one(self, sandbox_id: str) -> None:
        why = None
        try:
            self._clean(sandbox_id)
        except Exception as exc:  # any failure: this row is retried, the others go on
            why = str(exc) if isinstance(exc, StateError) else f"{type(exc).__name__}: {exc}"
        with self._guard:
            state = self._state
            state.in_flight.discard(sandbox_id)
            if why is None:
                state.retries.pop(sandbox_id, None)
                return
            before = state.retries.get(sandbox_id)
            attempts = 1 if before is None else before.attempts + 1
            delay = retry_delay(attempts)
            state.retries[sandbox_id] = Retry(attempts, why[:WHY_MAX], self._clock() + delay)
        self._wait.ring()  # the reaper sleeps until this back-off's end from its next pass
        log.error(
            "clean-up of %s failed (attempt %d, next in %.0f s): %s",
            sandbox_id,
            attempts,
            delay,
            why,
        )

    def shutdown(self) -> None:
        """Wait for the clean-ups under way; start no more; wake `run` to see its `stop`."""
        self._wait.ring()
        self._pool.shutdown(wait=True, cancel_futures=True)
