"""Waiting until a cgroup holds no task, so its removal cannot meet EBUSY.

An rmdir of a cgroup fails with EBUSY while any task is still in it, and a task SIGKILLed a
moment ago is still in its groups until the kernel runs its exit: on a loaded host that is
milliseconds to seconds after the signal. A sandbox's launcher (lnk-spawn) is in its v1 groups
but not in its v2 group (it joins the v1 ones, then starts the sandbox's first process into the
v2 one), so the v2 group can be empty while the launcher, killed by a stop, has not exited yet:
the v1 rmdir met EBUSY then, and the stop failed.

v2 (`wait_v2`): `cgroup.events` says `populated 0` once no task is left, and the kernel notifies
every change of that file to poll() (POLLPRI), so the wait is on the kernel's event.

v1 (`wait_v1`): no v1 hierarchy gives an event for "empty" (its release_agent runs a program of
the host's, for the whole hierarchy: not ours to take). The wait is tied to the tasks' own exit
instead: a pidfd of each task the group's `tasks` file lists, which poll() reports readable once
that task has exited, after the kernel took it out of its groups. Then `tasks` is read again
(a task that joined meanwhile is waited for the same way), until it is empty or the bound is
reached.

Trusts: the kernel's cgroup files and pidfds (Linux 5.3; a thread's own pidfd, PIDFD_THREAD,
6.9: before, a thread is waited for through its thread group's pidfd). Does NOT kill anything:
the callers kill first (cgroup.kill, the launcher's pidfd) and wait here.
"""

from __future__ import annotations

import errno
import math
import os
import select
import time
from pathlib import Path

from lnk_shared.errors import StateError

__all__ = ["EMPTY_TIMEOUT_S", "tasks_of", "wait_v1", "wait_v2"]

# SIGKILLed tasks' exit: milliseconds, seconds on a host at load 15; a task that outlives this
# is stuck in the kernel (or held by a v1 freezer), and the removal is reported, not forced.
EMPTY_TIMEOUT_S = 10.0
PIDFD_THREAD = getattr(os, "PIDFD_THREAD", os.O_EXCL)  # the kernel's value (Linux 6.9)
_READ_MAX = 4096  # cgroup.events is a few short lines


def _events(fd: int) -> dict[str, str]:
    os.lseek(fd, 0, os.SEEK_SET)  # a read from the start also re-arms the file's poll
    text = os.read(fd, _READ_MAX).decode("ascii")
    return dict(line.split(" ", 1) for line in text.split("\n") if " " in line)


def _poll_ms(deadline: float) -> int:
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))


def wait_v2(group: Path, key: str, value: str, timeout: float, what: str) -> None:
    """Return once the v2 group's `cgroup.events` says `key value` (`populated 0`, `frozen 1`);
    StateError saying `what` did not happen after `timeout` seconds. FileNotFoundError when
    the group is not there."""
    deadline = time.monotonic() + timeout
    fd = os.open(group / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI)
        while _events(fd).get(key) != value:
            if time.monotonic() >= deadline:
                raise StateError(f"the cgroup {group} did not {what} within {timeout:g} s")
            poller.poll(_poll_ms(deadline))  # woken by the file's next change, or the bound
    finally:
        os.close(fd)


def tasks_of(group: Path) -> list[int]:
    """The ids of the tasks (threads) in a v1 group; [] when the group is gone."""
    try:
        return [int(t) for t in (group / "tasks").read_text().split()]
    except FileNotFoundError:
        return []


def _thread_group(tid: int) -> int:
    with open(f"/proc/{tid}/status", encoding="ascii", errors="replace") as f:
        for line in f:
            if line.startswith("Tgid:"):
                return int(line.split()[1])
    raise ProcessLookupError(tid)


def _pidfd(tid: int) -> int | None:
    """A pidfd readable once `tid` has exited; None when it is gone already."""
    try:
        try:
            return os.pidfd_open(tid, PIDFD_THREAD)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return os.pidfd_open(_thread_group(tid))  # a kernel before PIDFD_THREAD
    except (ProcessLookupError, FileNotFoundError):
        return None


def _wait_exits(pidfds: list[int], deadline: float) -> None:
    """Until every pidfd is readable (its task exited) or the deadline."""
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    waiting = len(pidfds)
    while waiting:
        ready = poller.poll(_poll_ms(deadline))
        if not ready:
            return  # the bound
        for fd, _ in ready:
            poller.unregister(fd)
            waiting -= 1


def wait_v1(group: Path, timeout: float = EMPTY_TIMEOUT_S) -> None:
    """Return once the v1 group's `tasks` is empty (or the group is gone); StateError naming
    the tasks still in it after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while tasks := tasks_of(group):
        if time.monotonic() >= deadline:
            still = " ".join(str(t) for t in tasks[:8])
            raise StateError(
                f"the cgroup {group} still holds tasks that were killed and did not exit "
                f"within the wait (tid {still}): a task stuck in the kernel, or frozen by a v1 "
                "freezer; the next clean-up removes the group once they are gone"
            )
        pidfds: list[int] = []
        try:
            for tid in tasks:
                if (fd := _pidfd(tid)) is not None:
                    pidfds.append(fd)
            _wait_exits(pidfds, deadline)  # each is out of its groups once it has exited
        finally:
            for fd in pidfds:
                os.close(fd)
