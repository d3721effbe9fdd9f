"""lnk_controller.cgroup_limits on a fake cgroup tree: the v2 path (a delegated subtree, as
systemd's Delegate= gives the controller's unit) and finding a hybrid host's v1 hierarchies;
and on the real v2 tree of the machine the tests run on (what it offers, and only that)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from lnk_controller import cgroup_limits, cgroups
from lnk_controller.limits import MIB, Limits

LIMITS = Limits(processes=64, memory_bytes=512 * MIB, cpu_percent=50, open_files=256)

# This machine's kind of host: v1 pids, memory and cpu, an empty v2 tree at .../unified.
HYBRID_MOUNTINFO = """\
30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
32 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 30 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
35 30 0:31 /inner /mnt/view rw,relatime - cgroup cgroup rw,freezer,pids
"""
HYBRID_CGROUP = "8:pids:/\n4:memory:/svc/abc\n1:cpu:/\n9:name=systemd:/\n0::/\n"


def _fake_v2(tmp_path: Path, offered: str) -> Path:
    """A v2 root with the controller's unit group `own` offering `offered`."""
    root = tmp_path / "cgroup"
    own = root / "system.slice" / "lnk-controller.service"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text(offered + "\n")
    (own / "cgroup.subtree_control").write_text("")
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n")
    return root


def _fake_group(path: Path, offered: str) -> None:
    """What the kernel makes in a new group (the fake tree needs them made by hand)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.controllers").write_text(offered + "\n")
    (path / "cgroup.subtree_control").write_text("")


def test_v1_hierarchies_under_the_controllers_own_groups() -> None:
    parents = cgroup_limits.v1_hierarchies(HYBRID_MOUNTINFO, HYBRID_CGROUP)
    assert parents == {
        "cpu": Path("/sys/fs/cgroup/cpu/lnk.sandboxes"),
        "memory": Path("/sys/fs/cgroup/memory/svc/abc/lnk.sandboxes"),
        "pids": Path("/sys/fs/cgroup/pids/lnk.sandboxes"),  # the bind of /inner is not it
    }


def test_no_v1_on_a_pure_v2_host() -> None:
    mountinfo = "31 25 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert cgroup_limits.v1_hierarchies(mountinfo, "0::/system.slice/x.service\n") == {}


def test_delegated_subtree_puts_sandboxes_under_the_controllers_unit(tmp_path: Path) -> None:
    root = _fake_v2(tmp_path, "cpuset cpu io memory pids")
    own = root / "system.slice" / "lnk-controller.service"
    parent = cgroup_limits.delegated_parent(root, "/system.slice/lnk-controller.service")
    assert parent == own / "lnk.sandboxes"
    # The controller moved itself into a leaf first (no-internal-process rule), then enabled
    # the controllers for the unit's children: not at the cgroup root.
    assert (own / "lnk.controller" / "cgroup.procs").read_text() == str(os.getpid())
    assert (own / "cgroup.subtree_control").read_text() == "+pids +memory +cpu"
    assert not (root / "lnk.sandboxes").exists()


def test_root_or_undelegated_group_keeps_the_old_place(tmp_path: Path) -> None:
    root = _fake_v2(tmp_path, "")  # a hybrid host's v2 tree: no controller anywhere
    assert cgroup_limits.delegated_parent(root, "/system.slice/lnk-controller.service") is None
    assert cgroup_limits.delegated_parent(root, "/") is None
    assert not (root / "system.slice" / "lnk-controller.service" / "lnk.controller").exists()


def test_v2_limits_written_in_the_sandboxs_group(tmp_path: Path) -> None:
    parent = tmp_path / "lnk.sandboxes"
    _fake_group(parent, "cpu memory pids")
    assert cgroup_limits.v2_available(parent) == ("pids", "memory", "cpu")
    assert (parent / "cgroup.subtree_control").read_text() == "+pids +memory +cpu"
    group = parent / "sbx1"
    group.mkdir()
    (group / "memory.swap.max").write_text("max\n")
    cgroup_limits.apply_v2(group, ("pids", "memory", "cpu"), LIMITS)
    assert (group / "pids.max").read_text() == "64"
    assert (group / "memory.max").read_text() == str(512 * MIB)
    assert (group / "memory.swap.max").read_text() == "0"
    assert (group / "memory.oom.group").read_text() == "1"
    assert (group / "cpu.max").read_text() == "50000 100000"


def test_v2_without_controllers_offers_none(tmp_path: Path) -> None:
    parent = tmp_path / "lnk.sandboxes"
    _fake_group(parent, "")
    assert cgroup_limits.v2_available(parent) == ()
    assert (parent / "cgroup.subtree_control").read_text() == ""


def test_outcome_read_from_v2_events(tmp_path: Path) -> None:
    group = tmp_path / "sbx1"
    group.mkdir()
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\n")
    (group / "pids.events").write_text("max 17\n")
    assert cgroup_limits.outcome(group, {}) == (1, 17)
    assert cgroup_limits.outcome(tmp_path / "gone", {}) == (0, 0)


def test_group_of_follows_the_delegated_parent(tmp_path: Path) -> None:
    cgroups.use_parent(tmp_path / "lnk.sandboxes")
    try:
        assert cgroups.group_of("sbx1") == tmp_path / "lnk.sandboxes" / "sbx1"
    finally:
        cgroups.use_parent(None)
    assert cgroups.group_of("sbx1", tmp_path) == tmp_path / "lnk.sandboxes" / "sbx1"


def test_own_v2_group() -> None:
    assert cgroup_limits.own_v2_group(HYBRID_CGROUP) == "/"
    assert (
        cgroup_limits.own_v2_group("0::/system.slice/lnk.service\n") == "/system.slice/lnk.service"
    )


def test_all_sandboxes_together_leave_the_host_its_reserve(tmp_path: Path) -> None:
    v2_parent, v1_parent = tmp_path / "v2" / "lnk.sandboxes", tmp_path / "v1" / "lnk.sandboxes"
    v2_parent.mkdir(parents=True)
    v1_parent.parent.mkdir()  # the controller's own v1 group: lnk.sandboxes is made in it
    cgroup_limits.cap_all(v2_parent, v1_parent, 3 * 1024 * MIB)
    assert (v2_parent / "memory.max").read_text() == str(3 * 1024 * MIB)
    assert (v1_parent / "memory.limit_in_bytes").read_text() == str(3 * 1024 * MIB)
    meminfo = "MemTotal:        4026532 kB\nMemFree:  100 kB\n"
    assert cgroup_limits.host_memory(meminfo) == 4026532 * 1024


def test_the_real_v2_tree_gets_the_limits_it_offers_and_no_others() -> None:
    """On the machine the tests run on, for real (root only): a group of its v2 tree gets the
    controllers the kernel offers it, its limits written and read back from the kernel; where
    the v2 tree offers none of them (a hybrid host such as this test machine, whose pids,
    memory and cpu are bound to v1 and so cannot be offered in v2, even by a private cgroup2
    mount: it is the same hierarchy), none is claimed and delegated_parent moves nothing."""
    if os.geteuid() != 0:
        pytest.skip("makes groups in the host's cgroup v2 tree")
    root = cgroups.root()
    parent = root / f"lnk-test-{secrets.token_hex(4)}"
    parent.mkdir()
    try:
        offered = set((parent / "cgroup.controllers").read_text().split())
        expected = tuple(c for c in cgroup_limits.CONTROLLERS if c in offered)
        assert cgroup_limits.v2_available(parent) == expected
        if not expected:
            assert cgroup_limits.delegated_parent(root, "/" + parent.name) is None
            assert not (parent / cgroup_limits.LEAF).exists()  # nothing moved into a leaf
            return
        group = parent / "sbx1"
        group.mkdir()
        try:
            cgroup_limits.apply_v2(group, expected, LIMITS)
            if "pids" in expected:
                assert (group / "pids.max").read_text() == "64\n"
            if "memory" in expected:
                assert (group / "memory.max").read_text() == f"{512 * MIB}\n"
            if "cpu" in expected:
                assert (group / "cpu.max").read_text() == "50000 100000\n"
        finally:
            group.rmdir()
    finally:
        parent.rmdir()


def test_all_sandboxes_together_are_weighed_below_a_service(tmp_path: Path) -> None:
    v2_parent, v1_parent = tmp_path / "v2" / "lnk.sandboxes", tmp_path / "v1" / "lnk.sandboxes"
    v2_parent.mkdir(parents=True)
    v1_parent.parent.mkdir()  # the controller's own v1 cpu group: lnk.sandboxes is made in it
    cgroup_limits.weigh_all(v2_parent, v1_parent)
    assert (v2_parent / "cpu.weight").read_text() == str(cgroup_limits.SANDBOXES_CPU_WEIGHT)
    assert (v1_parent / "cpu.shares").read_text() == str(cgroup_limits.SANDBOXES_CPU_SHARES)
    # below the kernel's default for a group (v2) and for a nice-0 task (v1)
    assert cgroup_limits.SANDBOXES_CPU_WEIGHT < 100
    assert cgroup_limits.SANDBOXES_CPU_SHARES < 1024
    cgroup_limits.weigh_all(None, None)  # neither offered: nothing written, nothing raised
