"""On this hybrid host (v1 pids, memory and cpu hierarchies joined at each launch), a starting
controller remounts the host's cgroup2 mount with favordynmods, keeping its other options, and
a launch still works.

The option is cleared first (a remount without it: the kernel clears the flag and, from 6.18,
keeps its per-thread-group half, saying so in dmesg), so the test sees the controller set it.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.needs_root

MS_REMOUNT = 32
FAVOR = "favordynmods"  # the mount option (lnk_controller.cgroup_favor.FAVOR)


def _cgroup2() -> tuple[str, list[str]] | None:
    """The cgroup2 mount point and its superblock options (rw/ro left out)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, extra = before.split(" "), after.split(" ")
        if extra[0] == "cgroup2" and fields[3] == "/":
            return fields[4], [o for o in extra[2].split(",") if o not in ("rw", "ro")]
    return None


def _clear_favor(point: str, options: list[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    data = ",".join(o for o in options if o != FAVOR).encode()
    if libc.mount(None, point.encode(), None, MS_REMOUNT, data) != 0:
        pytest.fail(f"cannot clear {FAVOR} on {point}: {os.strerror(ctypes.get_errno())}")


def test_a_starting_controller_sets_favordynmods_and_keeps_the_other_options(
    private_box: Any,
) -> None:
    found = _cgroup2()
    if found is None or not Path("/sys/fs/cgroup/pids").is_dir():
        pytest.skip("not a hybrid cgroup host")
    point, options = found
    _clear_favor(point, options)
    assert FAVOR not in (_cgroup2() or ("", []))[1]
    with private_box() as box:
        after = _cgroup2()
        ran = box.lnk("sandbox", "run", "--yes", "--", "/bin/true")
    assert ran.returncode == 0, ran.stderr
    assert after is not None
    assert FAVOR in after[1], after
    assert [o for o in after[1] if o != FAVOR] == [o for o in options if o != FAVOR]
