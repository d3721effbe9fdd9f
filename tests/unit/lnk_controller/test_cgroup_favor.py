"""cgroup_favor's decisions: which mount to remount with favordynmods, with which options (a
cgroup2 remount resets every root flag it is not given), and when to ask at all."""

from __future__ import annotations

import pytest

from lnk_controller.cgroup_favor import remount_options, wanted

HYBRID = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
SYSTEMD = (
    "30 23 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n"
)


@pytest.mark.parametrize(
    ("mountinfo", "expected"),
    [
        (HYBRID, ("/sys/fs/cgroup/unified", "remount,favordynmods")),
        # its root flags kept: without them the remount would clear nsdelegate
        (SYSTEMD, ("/sys/fs/cgroup", "remount,nsdelegate,memory_recursiveprot,favordynmods")),
        (SYSTEMD.replace("memory_recursiveprot", "memory_recursiveprot,favordynmods"), None),
        (
            HYBRID.replace("cgroup2 cgroup2 rw", "cgroup2 cgroup2 ro"),
            ("/sys/fs/cgroup/unified", "remount,favordynmods"),
        ),
        # a bind of a sub-folder (a container's view) is not the hierarchy's root
        ("50 23 0:27 /lnk /mnt/cg rw - cgroup2 cgroup2 rw\n", None),
        ("39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n", None),  # v1 only
        ("", None),
        (
            "41 31 0:38 / /sys/fs/my\\040cg rw - cgroup2 cgroup2 rw\n",
            ("/sys/fs/my cg", "remount,favordynmods"),
        ),
    ],
)
def test_which_mount_and_options(mountinfo: str, expected: tuple[str, str] | None) -> None:
    assert remount_options(mountinfo) == expected


@pytest.mark.parametrize(
    ("enabled", "limits_on", "v1_joins", "asked"),
    [
        (True, True, True, True),
        (False, True, True, False),  # limits.favordynmods = false: the host's mount left alone
        (True, False, True, False),  # limits.unsafe_no_limits: no join on the launch path
        (True, True, False, False),  # pure v2: CLONE_INTO_CGROUP, no migration to speed up
    ],
)
def test_asked_only_when_launches_join_v1_groups(
    enabled: bool, limits_on: bool, v1_joins: bool, asked: bool
) -> None:
    assert wanted(enabled, limits_on, v1_joins) is asked
