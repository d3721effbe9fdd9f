"""Each sandbox's processes in a cgroup (v2) of their own, so the controller acts on all of them
at once: `cgroup.freeze` pauses every process of the sandbox, and `cgroup.kill` kills every one.

Why not signals to the sandbox's uid: a scan of /proc followed by SIGSTOP misses a process forked
between the two, and that process can SIGCONT the rest (a test does exactly that); a fork racing
a kill loop costs rounds. A frozen or killed cgroup has no such window: the kernel acts on the
group, children included, as one.

The group is made before the sandbox's first process, and the launcher (native/lnk_spawn.c)
starts that process in it with clone3(CLONE_INTO_CGROUP): it is born in the group, so every
process of the sandbox is, and none is ever moved (a write to `cgroup.procs` would migrate a
running process, which waits for an RCU grace period under the kernel's cgroup lock). None can
leave it: the sandbox sees no cgroup file system (bwrap mounts none in) and its uid owns no
cgroup file.

Trusts: the kernel's cgroup v2 (`cgroup.kill` needs Linux 5.14). Does NOT limit resources
itself: cgroup_limits.py writes the limits, in this group when the host gives it controllers,
in v1 groups on a hybrid host.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from lnk_controller import cgroup_empty
from lnk_shared.errors import LaunchRefused, StateError

__all__ = ["PARENT", "create", "freeze", "group_of", "kill", "remove", "root", "use_parent"]

# The groups' common parent under the cgroup v2 root. Boxes on one machine share it: each group
# is named by its sandbox's id, which no other sandbox has.
PARENT = "lnk.sandboxes"
FREEZE_TIMEOUT_S = 5.0  # a freeze waits for every task to stop in the kernel: milliseconds
KILL_TIMEOUT_S = 5.0  # SIGKILL to every task and their exit: milliseconds
_PREFERRED_ROOT = "/sys/fs/cgroup"  # pure v2 hosts; hybrid ones mount v2 at .../unified


def root() -> Path:
    """Where the cgroup v2 hierarchy is mounted; LaunchRefused, naming it, when it is not."""
    found: list[str] = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            before, _, after = line.partition(" - ")
            if after.split(" ", 1)[0] == "cgroup2":
                found.append(before.split(" ")[4].replace("\\040", " "))
    if not found:
        raise LaunchRefused(
            "cgroup v2", "no cgroup2 file system is mounted: mount it at /sys/fs/cgroup"
        )
    return Path(_PREFERRED_ROOT if _PREFERRED_ROOT in found else found[0])


# The groups' parent, set once at the controller's start (its delegated subtree, or the root's
# lnk.sandboxes); None (tests, tools): found from the cgroup2 mount at each use.
_parent: Path | None = None


def use_parent(parent: Path | None) -> None:
    """Put the sandboxes' groups in `parent` from now on: the controller's own delegated
    subtree (cgroup_limits.delegated_parent), or the root's `lnk.sandboxes` found once."""
    global _parent  # noqa: PLW0603 - one place per controller process, set once at its start
    _parent = parent


def group_of(sandbox_id: str, cgroup_root: Path | None = None) -> Path:
    if not sandbox_id or "/" in sandbox_id or sandbox_id.startswith("."):
        raise StateError(f"not a sandbox id: {sandbox_id!r}")
    if cgroup_root is None and _parent is not None:
        return _parent / sandbox_id
    return (cgroup_root or root()) / PARENT / sandbox_id


def create(sandbox_id: str) -> Path:
    """Make the sandbox's empty group (its parent too, the first time); return its path."""
    group = group_of(sandbox_id)
    try:
        group.parent.mkdir(mode=0o755, exist_ok=True)
        group.mkdir(mode=0o755)
    except FileExistsError:
        raise StateError(f"the cgroup {group} exists already: a sandbox id was reused") from None
    except OSError as exc:
        raise LaunchRefused("cgroup v2", f"cannot make {group}: {exc.strerror}") from None
    if not (group / "cgroup.kill").exists():
        group.rmdir()
        raise LaunchRefused("cgroup v2", "cgroup.kill is missing: Linux 5.14 or newer is needed")
    return group


def freeze(sandbox_id: str, frozen: bool) -> None:
    """Freeze (pause) or thaw (resume) every process of the sandbox; returns once done."""
    group = group_of(sandbox_id)
    try:
        (group / "cgroup.freeze").write_text("1" if frozen else "0")
        cgroup_empty.wait_v2(
            group, "frozen", "1" if frozen else "0", FREEZE_TIMEOUT_S, "freeze or thaw"
        )
    except FileNotFoundError:
        raise StateError(f"sandbox {sandbox_id} has no cgroup: it is not running") from None


def remove(sandbox_id: str) -> bool:
    """Kill every process of the sandbox's group, wait until it is empty, remove it: True.
    A group that is not there is fine (already removed, or the sandbox never started), but
    proves nothing about the sandbox's processes: False."""
    group = group_of(sandbox_id)
    try:
        (group / "cgroup.kill").write_text("1")
        cgroup_empty.wait_v2(group, "populated", "0", KILL_TIMEOUT_S, "empty after cgroup.kill")
        group.rmdir()
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise StateError(
            f"cannot remove the cgroup {group}: {os.strerror(exc.errno or 0)}"
        ) from exc
    return True


def kill(sandbox_id: str) -> bool:
    """SIGKILL every process of the sandbox's group at once, without waiting for them to exit
    (`remove` waits and removes the group): whether there was a group to kill. The reaper kills
    a leased sandbox so, and sandbox_limits one that met its memory limit."""
    try:
        (group_of(sandbox_id) / "cgroup.kill").write_text("1")
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StateError(f"cannot kill the cgroup of {sandbox_id}: {exc.strerror}") from exc
    return True
