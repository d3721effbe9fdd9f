"""The lease reaper's wait between passes: asleep until the next lease ends (by the wall clock the
leases are written in), a retry's back-off is over (by the monotonic clock), or something that
changes the plan rings the bell: a lease written (`ring_by`, with its end) or a row handed to the
reaper (`ring`).

The lease's end is a timerfd on CLOCK_REALTIME armed at that absolute time with
TFD_TIMER_CANCEL_ON_SET: it fires at the end itself, and at once when the wall clock is set
(an NTP step forward would otherwise leave a lease that is over asleep until the old time). The
bell is an eventfd: a ring while the reaper is in a pass stays counted, so the wait after that
pass returns at once, and nothing rung between a pass's read of the records and its wait is lost.
`ring_by` rings only when the new end is earlier than the one the reaper sleeps towards (a lease
granted later than the next end needs no pass now: the pass at that end reads it).

Does NOT: notice a lease written to the database by anything but this process's store (the
controller is its one writer; `lnk box prune` deletes only ended records); wake the reaper for a
lease made longer (its next pass finds it not over and sleeps on).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import threading
from datetime import UTC, datetime

__all__ = ["ReapWait"]

_CLOCK_REALTIME = 0
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_TIMER_ABSTIME = 1
_TFD_TIMER_CANCEL_ON_SET = 2
_NS = 1_000_000_000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.timerfd_create.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.timerfd_settime.argtypes = (
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(_Itimerspec),
        ctypes.POINTER(_Itimerspec),
    )
    return libc


def _checked(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def _epoch_ns(when: datetime) -> int:
    delta = when.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * _NS + delta.microseconds * 1000


class ReapWait:
    """One reaper's wait. `ring` and `ring_by` from any thread; `wait` from the reaper's."""

    def __init__(self) -> None:
        self._libc = _libc()
        self._timer = _checked(
            self._libc.timerfd_create(_CLOCK_REALTIME, _TFD_CLOEXEC | _TFD_NONBLOCK),
            "timerfd_create",
        )
        self._bell = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._guard = threading.Lock()
        self._towards: datetime | None = None  # the lease end slept towards; None: awake
        self._poll = select.poll()
        self._poll.register(self._timer, select.POLLIN)
        self._poll.register(self._bell, select.POLLIN)

    def ring(self) -> None:
        """Wake the reaper for a pass now (or after the pass it is in)."""
        os.eventfd_write(self._bell, 1)

    def ring_by(self, lease_end: datetime) -> None:
        """A lease ending at `lease_end` was written: wake the reaper if it sleeps past it."""
        with self._guard:
            towards = self._towards
        if towards is None or lease_end < towards:
            self.ring()

    def awake(self) -> None:
        """The reaper starts a pass: every ring from here on counts, and the rings before (whose
        writes this pass reads) are drained."""
        with self._guard:
            self._towards = None
        with contextlib.suppress(BlockingIOError):  # nothing rang
            os.eventfd_read(self._bell)

    def wait(self, lease_end: datetime | None, timeout_s: float | None) -> str:
        """Sleep until `lease_end` (wall clock), `timeout_s` (monotonic), a ring, or the wall
        clock is set; which of "lease", "timeout", "ring" or "clock set" it was."""
        self._arm(lease_end)
        with self._guard:
            self._towards = lease_end if lease_end is not None else datetime.max.replace(tzinfo=UTC)
        timeout_ms = None if timeout_s is None else max(0, int(timeout_s * 1000) + 1)
        ready = {fd for fd, _ in self._poll.poll(timeout_ms)}
        if self._bell in ready:
            return "ring"
        if self._timer in ready:
            try:
                os.read(self._timer, 8)
            except BlockingIOError:  # disarmed by a later settime meanwhile
                return "lease"
            except OSError as exc:
                if exc.errno == errno.ECANCELED:
                    return "clock set"
                raise
            return "lease"
        return "timeout"

    def _arm(self, lease_end: datetime | None) -> None:
        spec = _Itimerspec()  # all zero: disarmed
        if lease_end is not None:
            ns = max(_epoch_ns(lease_end), 1)  # 0 would disarm: a past end fires at once
            spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(ns, _NS)
        flags = _TFD_TIMER_ABSTIME | _TFD_TIMER_CANCEL_ON_SET
        _checked(
            self._libc.timerfd_settime(self._timer, flags, ctypes.byref(spec), None),
            "timerfd_settime",
        )

    def close(self) -> None:
        os.close(self._timer)
        os.close(self._bell)
