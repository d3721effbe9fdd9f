"""The end of a test box: every process of it gone before its mounts and folders are removed.

`lnk box down` stops the services named in their pidfiles; a controller still starting (its
pidfile not written yet, or written after `box down` read it), or one that outlived its SIGTERM
and was SIGKILLed without being waited for, can make its staging mount on <run dir>/sandboxes
after the teardown unmounted it, and the mount is left on the host. So the teardown finds the
box's processes by what they all carry, LNK_RUN_DIR=<run dir> in their environment (`lnk box up`
starts each service with the box's environment), kills them, waits for each to exit (a pidfd:
the kernel says when, no polling), and only then unmounts everything under the run dir.

What this does NOT stop: a process that drops LNK_RUN_DIR from its environment before the
teardown runs (none of the box's services do), or a `lnk box up` another thread starts after it.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
from contextlib import suppress
from pathlib import Path

EXIT_WAIT_S = 30.0  # a SIGKILLed process exits in milliseconds; a loaded 2-core machine, seconds


def box_pids(run_dir: Path) -> list[int]:
    """The pids of processes started with LNK_RUN_DIR=<run_dir> (this process never)."""
    wanted = f"LNK_RUN_DIR={run_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:  # gone already, or a kernel thread
            continue
        if wanted in environ:
            found.append(int(entry))
    return found


def kill_and_wait(pids: list[int]) -> list[int]:
    """SIGKILL each, wait until each has exited. Returns those still alive after EXIT_WAIT_S."""
    fds = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        with suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        fds.append((pid, fd))
    alive = []
    try:
        for pid, fd in fds:
            if not select.select([fd], [], [], EXIT_WAIT_S)[0]:
                alive.append(pid)
    finally:
        for _, fd in fds:
            os.close(fd)
    return alive


def mounts_under(folder: Path) -> list[str]:
    """Mount points at or under `folder` in this mount namespace, deepest first."""
    prefix = str(folder).rstrip("/")
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"), reverse=True)


def end_box(run_dir: Path) -> list[str]:
    """Kill the box's processes (waiting for each), then unmount everything under its run
    dir. Returns what is still there: processes that would not die, mounts that stayed."""
    problems = [f"pid {pid} of {run_dir} did not exit" for pid in kill_and_wait(box_pids(run_dir))]
    for point in mounts_under(run_dir):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    problems += [f"mount {point} is left" for point in mounts_under(run_dir)]
    return problems
