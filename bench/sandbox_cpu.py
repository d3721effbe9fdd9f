"""A bench client placed for CPU as a sandbox of the box is: in a group of its own under the
sandboxes' common parent (`lnk.sandboxes`), written by the controller's own code
(`cgroup_limits`: the parent weighed below the services by `weigh_all`, the group's quota
`cpu.max` / `cpu.cfs_quota_us` at the box's default of one core, its weight the kernel's
default, as every sandbox's), so the kernel shares the CPU between a flooding client, a
measuring one and the proxy as it does between two sandboxes and the proxy.

Where: the v1 `cpu` hierarchy when the host mounts one (a hybrid host, as the controller
does), otherwise the v2 tree's `lnk.sandboxes` with the `cpu` controller enabled in it. Only
CPU: the memory and pids limits a sandbox also has do not change who runs when.

Does NOT: run the client in a sandbox (no namespaces, no confiner, no relay: it dials the
proxy's unix socket directly, as the bench's other clients do).
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(CHECKOUT / "services" / "controller"), str(CHECKOUT / "shared")]
from lnk_controller import cgroup_limits, cgroups  # noqa: E402
from lnk_controller.limits import MIB, BoxLimits, Limits  # noqa: E402


def _box_default() -> Limits:
    box = BoxLimits()
    return Limits(box.processes, box.memory_mb * MIB, box.cpu_percent, box.open_files)


def cpu_group(stack: ExitStack, name: str) -> Path:
    """A sandbox's CPU group named `name` (unique on this machine: boxes share the parent),
    removed when `stack` closes; its `cgroup.procs` is what `popen_in` writes."""
    limits = _box_default()
    v1 = cgroup_limits.v1_hierarchies()
    if "cpu" in v1:
        cgroup_limits.weigh_all(None, v1["cpu"])
        made = cgroup_limits.apply_v1(name, {"cpu": v1["cpu"]}, limits)
        stack.callback(cgroup_limits.remove_v1, made)
        return made["cpu"]
    parent = cgroups.root() / cgroups.PARENT
    parent.mkdir(mode=0o755, exist_ok=True)
    if "cpu" not in cgroup_limits.v2_available(parent):
        raise RuntimeError(f"no cpu controller for {parent}: the bench cannot place a sandbox")
    cgroup_limits.weigh_all(parent, None)
    group = parent / name
    group.mkdir(mode=0o755)
    stack.callback(group.rmdir)
    cgroup_limits.apply_v2(group, ("cpu",), limits)
    return group


def popen_in(
    stack: ExitStack, group: Path, argv: list[str], **kwargs: Any
) -> subprocess.Popen[str]:
    """argv started inside `group` (it joins before it execs: every instruction it runs is
    the group's), stopped when `stack` closes, before the group is removed."""
    procs = str(group / "cgroup.procs")

    def join() -> None:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    process = subprocess.Popen(argv, preexec_fn=join, text=True, **kwargs)  # noqa: PLW1509
    stack.callback(_end, process)
    return process


def _end(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(10)  # reaped before its group is removed (rmdir of a group with tasks fails)
