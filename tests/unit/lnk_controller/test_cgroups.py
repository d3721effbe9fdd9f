"""lnk_controller.cgroups on the real cgroup v2 hierarchy: a group holds a process and its
children, freezes and thaws them together, and is killed and removed as one."""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_controller import cgroups
from lnk_shared.errors import StateError

pytestmark = pytest.mark.needs_root


@pytest.fixture
def sandbox_id() -> Iterator[str]:
    name = f"sbx-test-{secrets.token_hex(4)}"
    yield name
    cgroups.remove(name)  # whatever the test left, and a second removal is fine


def _join_and_fork(group: Path) -> subprocess.Popen[str]:
    """A shell that joins `group` and then forks a child every few ms, printing as it goes."""
    return subprocess.Popen(
        [
            "/bin/sh",
            "-c",
            'echo 0 > "$1/cgroup.procs" && while :; do (echo t); done',
            "cgroup-test",
            str(group),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def _members(group: Path) -> list[int]:
    return [int(p) for p in (group / "cgroup.procs").read_text().split()]


def test_root_is_a_mounted_cgroup2() -> None:
    root = cgroups.root()
    assert (root / "cgroup.procs").exists()
    assert (root / "cgroup.subtree_control").exists()


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden"])
def test_a_group_name_that_is_not_a_sandbox_id_is_refused(bad: str) -> None:
    with pytest.raises(StateError, match="not a sandbox id"):
        cgroups.group_of(bad)


def test_a_group_is_made_once(sandbox_id: str) -> None:
    group = cgroups.create(sandbox_id)
    assert group == cgroups.root() / cgroups.PARENT / sandbox_id
    assert group.is_dir()
    with pytest.raises(StateError, match="exists already"):
        cgroups.create(sandbox_id)


def test_freeze_stops_every_member_forked_or_not_and_thaw_resumes(sandbox_id: str) -> None:
    group = cgroups.create(sandbox_id)
    with _join_and_fork(group) as process:
        try:
            assert process.stdout is not None
            process.stdout.readline()  # running, in the group
            cgroups.freeze(sandbox_id, True)
            members = _members(group)
            assert process.pid in members
            time.sleep(0.3)
            assert _members(group) == members  # nothing forked while frozen
            assert "frozen 1" in (group / "cgroup.events").read_text()
            cgroups.freeze(sandbox_id, False)
            assert process.stdout.readline() == "t\n"
        finally:
            process.kill()


def test_remove_kills_every_member_and_the_group_goes(sandbox_id: str) -> None:
    group = cgroups.create(sandbox_id)
    with _join_and_fork(group) as process:
        assert process.stdout is not None
        process.stdout.readline()
        assert cgroups.remove(sandbox_id) is True  # emptied here: the proof clean-up uses
        assert process.wait(timeout=5) == -9
    assert not group.exists()
    assert cgroups.remove(sandbox_id) is False  # already gone: fine, but it proves nothing


def test_remove_kills_a_frozen_group_too(sandbox_id: str) -> None:
    group = cgroups.create(sandbox_id)
    with _join_and_fork(group) as process:
        assert process.stdout is not None
        process.stdout.readline()
        cgroups.freeze(sandbox_id, True)
        cgroups.remove(sandbox_id)
        assert process.wait(timeout=5) == -9
    assert not group.exists()


def test_freezing_a_sandbox_without_a_group_says_it_is_not_running(sandbox_id: str) -> None:
    with pytest.raises(StateError, match="not running"):
        cgroups.freeze(sandbox_id, True)


def test_this_process_is_not_moved_by_any_of_it(sandbox_id: str) -> None:
    with open(f"/proc/{os.getpid()}/cgroup", encoding="ascii") as f:
        before = f.read()
    cgroups.create(sandbox_id)
    cgroups.remove(sandbox_id)
    with open(f"/proc/{os.getpid()}/cgroup", encoding="ascii") as f:
        assert f.read() == before


def test_the_groups_parent_is_found_once_at_start_not_per_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Where no subtree is delegated, the groups stay at the root's lnk.sandboxes: found once at
    # the controller's start, not from /proc/self/mountinfo at each group made and removed.
    from lnk_controller import cgroup_limits, service

    expected = cgroups.group_of("sbx-1")
    looks = []
    real_root = cgroups.root

    def counted_root() -> Path:
        looks.append(1)
        return real_root()

    monkeypatch.setattr(cgroups, "root", counted_root)
    monkeypatch.setattr(cgroup_limits, "delegated_parent", lambda root, own: None)
    try:
        service._place_cgroups()
        assert [cgroups.group_of(f"sbx-{n}") for n in (1, 2)] == [
            expected,
            expected.parent / "sbx-2",
        ]
        assert len(looks) == 1
    finally:
        cgroups.use_parent(None)
