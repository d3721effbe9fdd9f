"""lnk_controller.cgroup_limits on this host's real v1 memory hierarchy: a process in a
sandbox's group that allocates past its limit is killed by the kernel, the watch fires, and the
outcome counts the kill; the group is removed after."""

from __future__ import annotations

import secrets
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lnk_controller import cgroup_limits
from lnk_controller.limits import MIB, Limits

pytestmark = pytest.mark.needs_root

LIMITS = Limits(processes=64, memory_bytes=32 * MIB, cpu_percent=100, open_files=64)
HOG = "open(sys.argv[1], 'w').write('0'); held = bytearray(256 * 1024 * 1024)"
WAIT_S = 30.0  # the kernel's kill and its notification: milliseconds


def test_a_hog_in_the_group_is_killed_and_the_watch_fires() -> None:
    parents = cgroup_limits.v1_hierarchies()
    if "memory" not in parents:
        pytest.skip("no v1 memory hierarchy on this host")
    sandbox_id = f"sbx-test-{secrets.token_hex(4)}"
    groups = cgroup_limits.apply_v1(sandbox_id, {"memory": parents["memory"]}, LIMITS)
    try:
        group = groups["memory"]
        assert (group / "memory.limit_in_bytes").read_text().strip() == str(32 * MIB)
        fired = threading.Event()
        watch = cgroup_limits.watch_v1_oom(group, fired.set)
        try:
            hog = subprocess.run(
                [sys.executable, "-c", f"import sys; {HOG}", str(group / "cgroup.procs")],
                capture_output=True,
                timeout=WAIT_S,
                check=False,
            )
            assert hog.returncode == -9, hog.stderr  # the kernel killed it at the limit
            assert fired.wait(WAIT_S)
            assert watch.fired
        finally:
            watch.stop()
        kills, refused = cgroup_limits.outcome(Path("/nonexistent"), groups)
        assert (kills, refused) == (1, 0)
    finally:
        cgroup_limits.remove_v1(groups)
    assert not (parents["memory"] / sandbox_id).exists()


def test_removing_the_group_does_not_fire_the_watch() -> None:
    parents = cgroup_limits.v1_hierarchies()
    if "memory" not in parents:
        pytest.skip("no v1 memory hierarchy on this host")
    sandbox_id = f"sbx-test-{secrets.token_hex(4)}"
    groups = cgroup_limits.apply_v1(sandbox_id, {"memory": parents["memory"]}, LIMITS)
    fired = threading.Event()
    watch = cgroup_limits.watch_v1_oom(groups["memory"], fired.set)
    cgroup_limits.remove_v1(groups)  # a clean-up from elsewhere: the kernel signals removal
    watch._thread.join(WAIT_S)  # the watch has seen the removal and ended
    watch.stop()
    assert not fired.is_set() and not watch.fired
