"""`favordynmods` on the host's cgroup2 mount, so a hybrid host's v1 joins stop waiting.

On a hybrid host `lnk-spawn` joins the sandbox's v1 groups (pids, memory, cpu) by writing to
their `cgroup.procs`: each is a migration, and a migration takes the kernel's global
`cgroup_threadgroup_rwsem` for writing, which waits for an RCU grace period and for every
fork and exit in flight on the machine. On a loaded 2-core host that was ~14 ms a join (three a
launch). The cgroup2 mount option `favordynmods` (Documentation/admin-guide/cgroup-v2.rst:
"reduce the latencies of dynamic cgroup modifications such as task migrations ... at the cost
of making hot path operations such as forks and exits more expensive") turns that global
write lock into a per-thread-group one from 6.18 on, and keeps the RCU sync entered before:
the same join measured ~0.5 ms. The option is the whole kernel's (one rwsem for all
hierarchies), so setting it on the v2 mount speeds the v1 joins too.

What this does: at the controller's start, when the box's limits are on and the host has a
v1 hierarchy the sandboxes join (`limits.favordynmods`, default on), remount the cgroup2 mount
with its own options plus `favordynmods` (the options are kept: a cgroup2 remount resets every
root flag it is not given, nsdelegate and memory_recursiveprot included). A failure is logged,
never fatal: launches work without it, only slower.

What it does NOT do: undo itself. From 6.18 the per-thread-group half of the option cannot be
turned off until a reboot (the kernel says "per threadgroup rwsem mechanism can't be
disabled"); a box's admin who does not want it sets `limits.favordynmods = false`. It does
nothing on a pure v2 host (CLONE_INTO_CGROUP seeds the group without a migration) or where
the v2 mount already has it.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from lnk_controller import cgroup_limits

__all__ = ["FAVOR", "apply", "remount_options", "wanted"]

FAVOR = "favordynmods"
MOUNT = "/usr/bin/mount"
MOUNT_TIMEOUT_S = 10  # a remount is one syscall; this bounds a hung mount(8), never hit
# Options of a cgroup2 superblock that are not root flags (rw/ro is the mount's own).
_NOT_FLAGS = frozenset({"rw", "ro"})

log = logging.getLogger(__name__)


def remount_options(mountinfo: str) -> tuple[str, str] | None:
    """(cgroup2 mount point, the options to remount it with) when its root lacks favordynmods;
    None when there is no cgroup2 mount or it has the option already. Pure: from
    /proc/self/mountinfo's text."""
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, extra = before.split(" "), after.split(" ")
        if len(fields) < 5 or len(extra) < 3 or extra[0] != "cgroup2" or fields[3] != "/":
            continue
        options = [o for o in extra[2].split(",") if o and o not in _NOT_FLAGS]
        if FAVOR in options:
            return None
        return fields[4].replace("\\040", " "), ",".join(["remount", *options, FAVOR])
    return None


def wanted(enabled: bool, limits_on: bool, v1_joins: bool) -> bool:
    """Whether to ask for favordynmods: only when the sandboxes' launches migrate (v1 joins)."""
    return enabled and limits_on and v1_joins


def apply(*, enabled: bool, limits_on: bool) -> None:
    """Remount the host's cgroup2 mount with favordynmods when `wanted`; log what was done."""
    if not wanted(enabled, limits_on, bool(cgroup_limits.v1_hierarchies())):
        return
    target = remount_options(Path("/proc/self/mountinfo").read_text(errors="replace"))
    if target is None:
        return
    point, options = target
    try:
        done = subprocess.run(
            [MOUNT, "-o", options, point],
            capture_output=True,
            text=True,
            timeout=MOUNT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("cannot remount %s with %s (launches are slower): %s", point, FAVOR, exc)
        return
    if done.returncode != 0:
        log.warning(
            "cannot remount %s with %s (launches are slower): %s",
            point,
            FAVOR,
            done.stderr.strip() or f"mount exited {done.returncode}",
        )
        return
    log.info(
        "remounted %s with %s: the sandboxes' v1 cgroup joins no longer wait on the kernel's "
        "global lock (limits.favordynmods; the kernel keeps it until a reboot)",
        point,
        FAVOR,
    )
