"""A running sandbox's limits, from its launch to its clean-up: the owner's admission (a ledger
of what each owner runs, under one lock, so two launches at once cannot both pass the last
place), the cgroup limits written before its first process, the launcher's arguments that join
its v1 groups and set its rlimits, what the limits did, and their removal.

The ledger lives in the controller's memory: a controller that starts again has none running
(reconcile cleans every recorded sandbox first), so it starts empty and true.

Does NOT stop: what limits.py and cgroup_limits.py say they do not.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from lnk_controller import cgroup_limits, cgroups
from lnk_controller.limits import MIB, BoxLimits, Limits, admit, describe, outcome_message
from lnk_shared.errors import LaunchRefused, StateError
from lnk_shared.oom_scores import SANDBOX_OOM_SCORE_ADJ

__all__ = ["Applied", "Ledger", "apply", "outcome", "release", "remove_leftovers"]

log = logging.getLogger(__name__)


@dataclass
class Applied:
    """The limits of one sandbox as enforced: None when the box has them off (test only)."""

    sandbox_id: str
    limits: Limits | None
    v2: tuple[str, ...] = ()
    v1: dict[str, Path] = field(default_factory=dict)
    oom: cgroup_limits.OomWatch | None = None

    @property
    def missing(self) -> tuple[str, ...]:
        """The controllers neither v2 nor v1 holds for this sandbox."""
        return tuple(c for c in cgroup_limits.CONTROLLERS if c not in self.v2 and c not in self.v1)

    def launcher_args(self) -> list[str]:
        """lnk-spawn's options: join the v1 groups, set the rlimit floor and the OOM score
        adjustment that puts the sandbox before the box's services (lnk_shared.oom_scores)."""
        if self.limits is None:
            return []
        args: list[str] = []
        for group in self.v1.values():
            args += ["--join", str(group)]
        args += ["--rlimit", f"nproc={self.limits.processes}"]
        args += ["--rlimit", f"nofile={self.limits.open_files}"]
        args += ["--oom-score-adj", str(SANDBOX_OOM_SCORE_ADJ)]
        return args


class Ledger:
    """What each owner runs now: place -> (owner, memory limit). A place is taken before the
    sandbox's record exists and given back once it is cleaned away."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._places = itertools.count(1)
        self._running: dict[int, tuple[int, int]] = {}

    def admit(self, box: BoxLimits, owner_uid: int, wanted: Limits) -> int:
        """Take a place for a sandbox of `owner_uid`, or refuse naming the owner's limit."""
        with self._lock:
            mine = [mem for owner, mem in self._running.values() if owner == owner_uid]
            admit(box, mine, wanted)
            place = next(self._places)
            self._running[place] = (owner_uid, wanted.memory_bytes)
            return place

    def release(self, place: int) -> None:
        with self._lock:
            self._running.pop(place, None)

    def count(self, owner_uid: int) -> int:
        with self._lock:
            return sum(1 for owner, _ in self._running.values() if owner == owner_uid)


def apply(box: BoxLimits, sandbox_id: str, group: Path, limits: Limits | None) -> Applied:
    """Write the limits for the sandbox whose (empty) v2 group is `group`; refuse when the
    kernel offers no controller for them and the box's admin has not allowed that."""
    applied = Applied(sandbox_id, limits)
    if limits is None:
        log.warning("sandbox %s runs with NO limits (unsafe_no_limits: a test setting)", sandbox_id)
        return applied
    applied.v2 = cgroup_limits.v2_available(group.parent)
    cgroup_limits.apply_v2(group, applied.v2, limits)
    v1_parents = {c: p for c, p in cgroup_limits.v1_hierarchies().items() if c not in applied.v2}
    # All sandboxes together leave the host its reserve, whatever each one's own limit.
    shared = cgroup_limits.host_memory() - box.reserve_memory_mb * MIB
    cgroup_limits.cap_all(
        group.parent if "memory" in applied.v2 else None, v1_parents.get("memory"), shared
    )
    # All sandboxes together below the box's services, the proxy first, when CPU is short.
    cgroup_limits.weigh_all(group.parent if "cpu" in applied.v2 else None, v1_parents.get("cpu"))
    applied.v1 = cgroup_limits.apply_v1(sandbox_id, v1_parents, limits)
    try:
        missing = applied.missing
        if missing and len(missing) == len(cgroup_limits.CONTROLLERS):
            if not box.unsafe_allow_unlimited:
                raise LaunchRefused(
                    "limits",
                    "this host offers no cgroup controller (pids, memory, cpu) for the "
                    "sandbox's limits: delegate them to the controller (Delegate= in its unit) "
                    "or mount the v1 hierarchies",
                )
            log.warning(
                "sandbox %s runs with rlimits only: no cgroup controller is available "
                "(unsafe_allow_unlimited)",
                sandbox_id,
            )
        elif missing:
            log.warning("sandbox %s has no %s limit here", sandbox_id, ", ".join(missing))
        if "memory" in applied.v1:
            applied.oom = cgroup_limits.watch_v1_oom(
                applied.v1["memory"], lambda: _stop_at_limit(sandbox_id)
            )
    except BaseException:
        release(applied)
        raise
    log.info("sandbox %s limits: %s", sandbox_id, describe(limits))
    return applied


def _stop_at_limit(sandbox_id: str) -> None:
    """The v1 memory group met its limit: stop the whole sandbox at once (its v2 group)."""
    log.info("sandbox %s reached its memory limit: stopping it", sandbox_id)
    try:
        cgroups.kill(sandbox_id)
    except StateError as exc:
        log.error("%s", exc)


def outcome(applied: Applied) -> str | None:
    """What the client is told about the limits the sandbox met, read before its clean-up."""
    if applied.limits is None:
        return None
    kills, refused = cgroup_limits.outcome(cgroups.group_of(applied.sandbox_id), applied.v1)
    if applied.oom is not None and applied.oom.fired:
        kills += 1
    return outcome_message(applied.limits, oom_kills=kills, fork_refusals=refused)


def release(applied: Applied) -> None:
    """Stop the memory watch; remove the v1 groups (after the v2 group was emptied)."""
    if applied.oom is not None:
        applied.oom.stop()
        applied.oom = None
    cgroup_limits.remove_v1(applied.v1)
    applied.v1 = {}


def remove_leftovers(sandbox_id: str) -> None:
    """A clean-up from the record alone (after a crash): the sandbox's v1 groups, if any."""
    parents = dict(_leftover_parents())
    cgroup_limits.remove_v1(cgroup_limits.v1_groups_of(sandbox_id, parents))


@functools.cache
def _leftover_parents() -> tuple[tuple[str, Path], ...]:
    """The v1 hierarchies as this process first saw them. Reading /proc/self/mountinfo at every
    clean-up was 0.3-0.5 ms of each (the kernel writes out every mount), for groups that are
    only ever a crashed controller's: this process removes its own sandboxes' groups through
    `release`, which knows them, and a crashed one's groups are in hierarchies mounted before
    this process started, so its first look sees them."""
    return tuple(cgroup_limits.v1_hierarchies().items())
