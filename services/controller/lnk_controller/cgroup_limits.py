"""A sandbox's limits in the kernel's cgroup controllers: writing them, reading what they did.

Where: cgroup v2 controllers (`pids`, `memory`, `cpu`) in the sandbox's own v2 group when they
are available to it (a pure v2 host, the controller's unit with `Delegate=`: see
`delegated_parent`); otherwise the v1 hierarchies a hybrid host mounts for them, in a group per
sandbox under the controller's own group of each hierarchy (`<own>/lnk.sandboxes/<id>`), which
the launcher joins before it starts the sandbox's first process (native/lnk_spawn.c --join), so
every process of the sandbox is born in it. A controller found in neither is not applied; a
host where none is found refuses to launch (`missing`), unless the box's admin allows it.

Memory counts the sandbox's tmpfs folders: the kernel charges a tmpfs page to the group of the
process that wrote it, in v1 and v2 alike; swap is off for the group (memory.swap.max 0 /
memsw), so the limit is one of RAM.

CPU: each sandbox's quota (`cpu.max`, v1 `cpu.cfs_quota_us`), and all sandboxes together
weighed below the box's services (`weigh_all`: the parent's `cpu.weight` or `cpu.shares`).

Does NOT stop: a process of the sandbox leaving its groups (it cannot: it sees no cgroup file
system and owns no cgroup file); kernel memory v1 does not count (socket buffers, most slab);
I/O bandwidth (no io/blkio limit).
"""

from __future__ import annotations

import errno
import os
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path

from lnk_controller import cgroup_empty
from lnk_controller.limits import Limits
from lnk_shared.errors import StateError

__all__ = [
    "CONTROLLERS",
    "OomWatch",
    "apply_v1",
    "apply_v2",
    "cap_all",
    "delegated_parent",
    "host_memory",
    "outcome",
    "own_v2_group",
    "remove_v1",
    "v1_groups_of",
    "v1_hierarchies",
    "v2_available",
    "watch_v1_oom",
    "weigh_all",
]

CONTROLLERS = ("pids", "memory", "cpu")
PARENT = "lnk.sandboxes"  # as cgroups.PARENT: the groups' common parent in each hierarchy
LEAF = "lnk.controller"  # the controller's own leaf in a delegated v2 subtree
CPU_PERIOD_US = 100_000  # the kernel's default CFS period: the quota is a share of it
# All sandboxes together weigh half of a service in the kernel's CPU sharing (v2 cpu.weight,
# default 100; v1 cpu.shares, default 1024, which a v1 group's tasks share against each task
# of the root's): when the CPU is short, the proxy and the box's other services, which every
# sandbox needs, run before the sandboxes' own programs; when it is not, the weight changes
# nothing (CPU sharing gives idle time to whoever asks).
SANDBOXES_CPU_WEIGHT = 50
SANDBOXES_CPU_SHARES = 512


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise StateError(f"cannot set {path} to {value}: {os.strerror(exc.errno or 0)}") from None


def _mounts(mountinfo: str) -> dict[str, Path]:
    """controller -> mount point of its v1 hierarchy, from /proc/self/mountinfo's text."""
    found: dict[str, Path] = {}
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, extra = before.split(" "), after.split(" ")
        if len(fields) < 5 or len(extra) < 3 or extra[0] != "cgroup" or fields[3] != "/":
            continue  # a bind of a sub-folder (a container's view) is not the hierarchy's root
        options = extra[2].split(",")
        for controller in CONTROLLERS:
            if controller in options:
                found.setdefault(controller, Path(fields[4].replace("\\040", " ")))
    return found


def _own_groups(proc_cgroup: str) -> dict[str, str]:
    """controller -> this process's group in its v1 hierarchy, from /proc/self/cgroup's text;
    "" -> the v2 group."""
    groups: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            groups[name] = path
    return groups


def own_v2_group(proc_cgroup: str | None = None) -> str:
    """This process's group in the v2 hierarchy ("/" at its root)."""
    if proc_cgroup is None:
        proc_cgroup = Path("/proc/self/cgroup").read_text(errors="replace")
    return _own_groups(proc_cgroup).get("", "/")


def v1_hierarchies(mountinfo: str | None = None, proc_cgroup: str | None = None) -> dict[str, Path]:
    """controller -> the folder the sandboxes' v1 groups go in (`<own group>/lnk.sandboxes`),
    for each of CONTROLLERS a v1 hierarchy holds here."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text(errors="replace")
    if proc_cgroup is None:
        proc_cgroup = Path("/proc/self/cgroup").read_text(errors="replace")
    own = _own_groups(proc_cgroup)
    return {
        controller: mount / own[controller].lstrip("/") / PARENT
        for controller, mount in _mounts(mountinfo).items()
        if controller in own
    }


def v2_available(parent: Path) -> tuple[str, ...]:
    """The CONTROLLERS the sandboxes' v2 groups under `parent` get: those its parent offers,
    enabled in its subtree_control (a write the kernel refuses when they are not delegated)."""
    try:
        offered = (parent / "cgroup.controllers").read_text().split()
    except OSError:
        return ()
    wanted = [c for c in CONTROLLERS if c in offered]
    if not wanted:
        return ()
    try:
        enabled = (parent / "cgroup.subtree_control").read_text().split()
        missing = [c for c in wanted if c not in enabled]
        if missing:
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))
    except OSError:
        return ()
    return tuple(wanted)


def delegated_parent(root: Path, own: str) -> Path | None:
    """Where the sandboxes' v2 groups go when the controller runs in a subtree delegated to it
    (systemd's `Delegate=`: its unit's group, `own`, is its to divide): `<own>/lnk.sandboxes`,
    after the controller moves itself into the leaf `<own>/lnk.controller` (a group with
    processes cannot enable controllers for its children: cgroup v2's no-internal-process
    rule). None when `own` is the root or offers no controller: the caller keeps the root's
    `lnk.sandboxes` (a hybrid host, whose v2 tree has no controllers at all)."""
    group = root / own.strip("/")
    if group == root:
        return None
    try:
        offered = (group / "cgroup.controllers").read_text().split()
    except OSError:
        return None
    if not any(c in offered for c in CONTROLLERS):
        return None
    leaf = group / LEAF
    leaf.mkdir(mode=0o755, exist_ok=True)
    _write(leaf / "cgroup.procs", str(os.getpid()))
    enable = " ".join(f"+{c}" for c in CONTROLLERS if c in offered)
    _write(group / "cgroup.subtree_control", enable)
    parent = group / PARENT
    parent.mkdir(mode=0o755, exist_ok=True)
    return parent


def apply_v2(group: Path, controllers: tuple[str, ...], limits: Limits) -> None:
    """Write the limits into the sandbox's v2 group, before anything runs in it."""
    if "pids" in controllers:
        _write(group / "pids.max", str(limits.processes))
    if "memory" in controllers:
        _write(group / "memory.max", str(limits.memory_bytes))
        if (group / "memory.swap.max").exists():
            _write(group / "memory.swap.max", "0")
        _write(group / "memory.oom.group", "1")  # a kill at the limit stops the whole sandbox
    if "cpu" in controllers:
        _write(group / "cpu.max", f"{limits.cpu_percent * CPU_PERIOD_US // 100} {CPU_PERIOD_US}")


def host_memory(meminfo: str | None = None) -> int:
    """The host's memory (MemTotal), in bytes."""
    if meminfo is None:
        meminfo = Path("/proc/meminfo").read_text()
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise StateError("/proc/meminfo has no MemTotal")


def cap_all(v2_parent: Path | None, v1_memory_parent: Path | None, total: int) -> None:
    """Bound all the sandboxes together (every box's on this machine: they share the parent) to
    `total` bytes of memory, so the host keeps the rest whatever each one's limit: the memory
    limit of their common parent group (v2 memory.max, v1 memory.limit_in_bytes; the v1
    hierarchy counts children in their parent: use_hierarchy is always on since Linux 5.x)."""
    if v2_parent is not None:
        _write(v2_parent / "memory.max", str(total))
    if v1_memory_parent is not None:
        v1_memory_parent.mkdir(mode=0o755, exist_ok=True)
        _write(v1_memory_parent / "memory.limit_in_bytes", str(total))


def weigh_all(v2_parent: Path | None, v1_cpu_parent: Path | None) -> None:
    """Weigh all the sandboxes together (their common parent group) below the box's services:
    `SANDBOXES_CPU_WEIGHT` (v2) or `SANDBOXES_CPU_SHARES` (v1). Each sandbox's own group keeps
    the default weight, so sandboxes share among themselves evenly; its `cpu.max` or CFS quota
    still caps it. Does NOT weigh a sandbox against its owner's own programs outside the box
    beyond that (they are the host's, at their own weights)."""
    if v2_parent is not None:
        _write(v2_parent / "cpu.weight", str(SANDBOXES_CPU_WEIGHT))
    if v1_cpu_parent is not None:
        v1_cpu_parent.mkdir(mode=0o755, exist_ok=True)
        _write(v1_cpu_parent / "cpu.shares", str(SANDBOXES_CPU_SHARES))


def apply_v1(sandbox_id: str, parents: dict[str, Path], limits: Limits) -> dict[str, Path]:
    """Make the sandbox's group in each v1 hierarchy of `parents` and write its limits; return
    controller -> group. On a failure the groups made so far are removed."""
    made: dict[str, Path] = {}
    try:
        for controller, parent in parents.items():
            parent.mkdir(mode=0o755, exist_ok=True)
            group = parent / sandbox_id
            group.mkdir(mode=0o755)
            made[controller] = group
            if controller == "pids":
                _write(group / "pids.max", str(limits.processes))
            elif controller == "memory":
                _write(group / "memory.limit_in_bytes", str(limits.memory_bytes))
                if (group / "memory.memsw.limit_in_bytes").exists():  # swap accounting is on
                    _write(group / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            elif controller == "cpu":
                _write(group / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(group / "cpu.cfs_quota_us", str(limits.cpu_percent * CPU_PERIOD_US // 100))
    except FileExistsError:
        remove_v1(made)
        raise StateError(
            f"the v1 cgroup of {sandbox_id} exists already: an id was reused"
        ) from None
    except (OSError, StateError) as exc:
        remove_v1(made)
        raise StateError(f"cannot set the sandbox's v1 cgroup limits: {exc}") from None
    return made


class OomWatch:
    """A thread that calls `on_oom` once the v1 memory group meets its limit (the kernel's
    notification through cgroup.event_control): v1 kills one process at the limit, not the
    group, so the caller stops the whole sandbox, as v2's memory.oom.group does."""

    def __init__(self, group: Path, on_oom: Callable[[], None]) -> None:
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._event = os.eventfd(0, os.EFD_CLOEXEC)
        control = os.open(group / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _write(group / "cgroup.event_control", f"{self._event} {control}")
        except StateError:
            self._close()
            raise
        finally:
            os.close(control)
        self._group = group
        self.fired = False
        self._thread = threading.Thread(target=self._run, args=(on_oom,), daemon=True)
        self._thread.start()

    def _run(self, on_oom: Callable[[], None]) -> None:
        poller = select.poll()  # not select(): a busy controller's descriptors pass 1024
        poller.register(self._event, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        ready = [fd for fd, _ in poller.poll()]
        # The kernel also signals when the group is removed (a clean-up from elsewhere): that
        # is no limit met.
        if self._event in ready and self._stop_r not in ready and self._group.is_dir():
            self.fired = True  # the sandbox met its limit, even when our kill beats the kernel's
            on_oom()

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        self._thread.join()
        self._close()

    def _close(self) -> None:
        for fd in (self._stop_r, self._stop_w, self._event):
            os.close(fd)


def watch_v1_oom(group: Path, on_oom: Callable[[], None]) -> OomWatch:
    return OomWatch(group, on_oom)


def _keyed(path: Path) -> dict[str, int]:
    try:
        text = path.read_text()
    except OSError:
        return {}
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[key] = int(value)
    return values


def outcome(v2_group: Path, v1: dict[str, Path]) -> tuple[int, int]:
    """(kills by the memory limit, forks refused at the process limit) so far."""
    kills = _keyed(v2_group / "memory.events").get("oom_kill", 0)
    refused = _keyed(v2_group / "pids.events").get("max", 0)
    if "memory" in v1:
        kills += _keyed(v1["memory"] / "memory.oom_control").get("oom_kill", 0)
    if "pids" in v1:
        refused += _keyed(v1["pids"] / "pids.events").get("max", 0)
    return kills, refused


def remove_v1(groups: dict[str, Path], timeout: float = cgroup_empty.EMPTY_TIMEOUT_S) -> None:
    """Remove the sandbox's v1 groups once their tasks have exited: the v2 group was emptied
    first, but the launcher, killed by a stop, is in these groups and not in that one, and may
    not have exited yet (an rmdir then fails with EBUSY). A group already gone is fine."""
    problems = []
    deadline = time.monotonic() + timeout  # one bound for all the groups, not one each
    for group in groups.values():
        try:
            cgroup_empty.wait_v1(group, max(0.0, deadline - time.monotonic()))
            group.rmdir()
        except StateError as exc:
            problems.append(str(exc))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                problems.append(f"{group}: {os.strerror(exc.errno or 0)}")
    if problems:
        raise StateError("cannot remove the sandbox's v1 cgroups: " + "; ".join(problems))


def v1_groups_of(sandbox_id: str, parents: dict[str, Path]) -> dict[str, Path]:
    """The sandbox's v1 groups, found again from its id (for a clean-up after a crash)."""
    return {c: p / sandbox_id for c, p in parents.items() if (p / sandbox_id).is_dir()}
