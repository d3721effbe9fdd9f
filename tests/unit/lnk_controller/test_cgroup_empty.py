"""lnk_controller.cgroup_empty on this host's real cgroups: a task SIGKILLed but not yet exited
(the race a loaded host makes: a stopped sandbox's launcher still in its v1 groups) is held so
by a v1 freezer, which keeps a killed task until it is thawed; the removal of its groups waits
for its exit and then succeeds, or, past its bound, says which task is left, never EBUSY."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lnk_controller import cgroup_empty, cgroup_limits, cgroups
from lnk_shared.errors import StateError

pytestmark = pytest.mark.needs_root

FREEZER = Path("/sys/fs/cgroup/freezer")  # a hybrid host's v1 freezer hierarchy
WAIT_S = 30.0  # a thawed killed task's exit: milliseconds
SHORT_S = 0.3  # a bound the held task certainly outlives (it exits only once thawed)


@dataclass
class Held:
    """A task in a v1 pids group (and a v2 group) that was SIGKILLed while frozen."""

    process: subprocess.Popen[bytes]
    pids_group: Path
    v2_group: Path
    freezer: Path

    def thaw(self) -> None:
        (self.freezer / "freezer.state").write_text("THAWED")


def _frozen(freezer: Path) -> None:
    """Freeze the freezer group; v1 gives no event for the transition, so its state is read
    until FROZEN (a sleeping task freezes at once), bounded."""
    (freezer / "freezer.state").write_text("FROZEN")
    deadline = time.monotonic() + WAIT_S
    while (freezer / "freezer.state").read_text().strip() != "FROZEN":
        assert time.monotonic() < deadline, "the v1 freezer did not freeze the task"


@pytest.fixture
def held() -> Iterator[Held]:
    parents = cgroup_limits.v1_hierarchies()
    if "pids" not in parents or not (FREEZER / "freezer.state").parent.is_dir():
        pytest.skip("no v1 pids and freezer hierarchies on this host")
    name = f"sbx-test-{secrets.token_hex(4)}"
    parents["pids"].mkdir(mode=0o755, exist_ok=True)
    pids_group, freezer = parents["pids"] / name, FREEZER / name
    pids_group.mkdir()
    freezer.mkdir()
    v2_group = cgroups.create(name)
    joins = " ".join(f'"{g}/cgroup.procs"' for g in (pids_group, freezer, v2_group))
    process = subprocess.Popen(
        ["/bin/sh", "-c", f"for g in {joins}; do echo $$ > $g; done; echo in; exec sleep 600"],
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == b"in\n"
        _frozen(freezer)
        os.kill(process.pid, signal.SIGKILL)  # held by the freezer: killed, not exited
        assert cgroup_empty.tasks_of(pids_group) == [process.pid]
        yield Held(process, pids_group, v2_group, freezer)
    finally:
        (freezer / "freezer.state").write_text("THAWED")
        process.kill()
        process.wait(WAIT_S)
        if process.stdout is not None:
            process.stdout.close()
        for group in (pids_group, freezer):
            if group.exists():
                cgroup_empty.wait_v1(group, WAIT_S)
                group.rmdir()
        cgroups.remove(name)


def test_a_killed_task_not_yet_exited_is_waited_for_not_met_with_ebusy(held: Held) -> None:
    """The stop's race: the v1 group is removed while its killed task is still exiting."""
    removing, failures = _in_thread(cgroup_limits.remove_v1, {"pids": held.pids_group})
    _until_waiting_or_done(removing)  # the old removal was done by now: EBUSY
    held.thaw()  # the task exits now: the removal waits for that, however late it comes
    removing.join(WAIT_S)
    assert not removing.is_alive()
    assert failures == []
    assert held.process.wait(WAIT_S) == -signal.SIGKILL
    assert not held.pids_group.exists()


def test_a_task_that_outlives_the_bound_is_named_and_its_group_kept(held: Held) -> None:
    with pytest.raises(StateError, match=f"still holds tasks .*tid {held.process.pid}"):
        cgroup_limits.remove_v1({"pids": held.pids_group}, timeout=SHORT_S)
    assert held.pids_group.is_dir()
    assert cgroup_empty.tasks_of(held.pids_group) == [held.process.pid]
    held.thaw()
    cgroup_limits.remove_v1({"pids": held.pids_group})  # the granted path, once it has exited
    assert not held.pids_group.exists()


def test_the_v2_wait_ends_on_the_kernels_event_when_the_task_exits(held: Held) -> None:
    with pytest.raises(StateError, match="did not empty"):
        cgroup_empty.wait_v2(held.v2_group, "populated", "0", SHORT_S, "empty")
    waiting, failures = _in_thread(
        cgroup_empty.wait_v2, held.v2_group, "populated", "0", WAIT_S, "empty"
    )
    _until_waiting_or_done(waiting)
    held.thaw()
    waiting.join(WAIT_S)
    assert not waiting.is_alive() and failures == []
    assert cgroups.remove(held.v2_group.name)
    assert not held.v2_group.exists()


def test_a_group_already_gone_is_empty(tmp_path: Path) -> None:
    assert cgroup_empty.tasks_of(tmp_path / "gone") == []
    cgroup_empty.wait_v1(tmp_path / "gone", SHORT_S)
    with pytest.raises(FileNotFoundError):
        cgroup_empty.wait_v2(tmp_path / "gone", "populated", "0", SHORT_S, "empty")


def _until_waiting_or_done(thread: threading.Thread) -> None:
    """Return once `thread` sleeps in poll() (the kernel's wchan names it) or has ended: the
    kernel gives no event for a thread's entering a sleep, so its state is read, bounded."""
    wchan = Path(f"/proc/self/task/{thread.native_id}/wchan")
    deadline = time.monotonic() + WAIT_S
    while thread.is_alive():
        try:
            if "poll" in wchan.read_text():
                return
        except FileNotFoundError:
            return  # it has ended
        assert time.monotonic() < deadline, "the removal neither waited nor ended"


def _in_thread(
    call: Callable[..., object], *args: object
) -> tuple[threading.Thread, list[BaseException]]:
    """`call(*args)` started in a thread; what it raised, for the test to assert on."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            call(*args)
        except BaseException as exc:  # handed to the test's assertion
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, failures
