"""A sandbox's launcher killed but not yet exited when its clean-up removes its groups: the race
a loaded host makes, forced here. The launcher (lnk-spawn) is in the sandbox's v1 limit groups
but not in its v2 group; the test holds it in a v1 freezer, which keeps a SIGKILLed task until
it is thawed, and thaws it only once the clean-up has emptied the v2 group and waits on the
launcher. Before the fix the clean-up met EBUSY there: `lnk box down` then kept the staging
root mounted under the run dir (its clean-up of the sandbox had failed)."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from conftest import LNK, RunningBox
from test_wall_lifecycle import WAIT_S, _leftovers, _sleeping_sandbox, _uid_processes

from lnk_controller import cgroup_empty, cgroups

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

FREEZER = Path("/sys/fs/cgroup/freezer")  # a hybrid host's v1 freezer hierarchy
SIGKILL_BIT = 1 << (signal.SIGKILL - 1)  # in /proc/PID/status's ShdPnd mask


def _status(pid: int, key: str) -> str:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        found = re.search(rf"^{key}:\s+(\S+)", f.read(), re.MULTILINE)
    assert found is not None, f"/proc/{pid}/status has no {key}"
    return found.group(1)


def _launcher_and_group(uid: int) -> tuple[int, Path] | None:
    """(lnk-spawn's pid, the sandbox's v2 group) from a process of sandbox user `uid`."""
    for pid in _uid_processes(uid):
        try:
            parent = int(_status(pid, "PPid"))
            comm = Path(f"/proc/{parent}/comm").read_text().strip()
            lines = Path(f"/proc/{pid}/cgroup").read_text().split("\n")
        except OSError:
            continue
        v2 = [line[3:] for line in lines if line.startswith("0::")]
        if comm == "lnk-spawn" and v2:
            return parent, cgroups.root() / v2[0].lstrip("/")
    return None


@contextmanager
def _frozen(pid: int) -> Iterator[Callable[[], None]]:
    """`pid` in a v1 freezer group of its own, frozen; yields the thaw."""
    group = FREEZER / f"lnk-test-{secrets.token_hex(4)}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(pid))
        (group / "freezer.state").write_text("FROZEN")
        deadline = time.monotonic() + WAIT_S  # v1 has no event for the freeze: read, bounded
        while (group / "freezer.state").read_text().strip() != "FROZEN":
            assert time.monotonic() < deadline, "the launcher did not freeze"
        yield lambda: (group / "freezer.state").write_text("THAWED")
    finally:
        (group / "freezer.state").write_text("THAWED")
        for task in cgroup_empty.tasks_of(group):  # alive after a failure: back to the root
            with suppress(ProcessLookupError):
                (FREEZER / "cgroup.procs").write_text(str(task))
        cgroup_empty.wait_v1(group, WAIT_S)
        group.rmdir()


def _pidfd_held(holder: int, pid: int) -> bool:
    fdinfo = Path(f"/proc/{holder}/fdinfo")
    for entry in os.listdir(fdinfo):
        try:
            if f"\nPid:\t{pid}\n" in (fdinfo / entry).read_text():
                return True
        except OSError:
            continue
    return False


def _waiting_on(controller: int, launcher: int, v2_group: Path) -> bool:
    """Whether the clean-up has killed the launcher, emptied and removed the v2 group, and
    now holds a pidfd of the launcher (the new code's wait on its exit)."""
    pending = int(_status(launcher, "ShdPnd"), 16) & SIGKILL_BIT
    return bool(pending) and not v2_group.exists() and _pidfd_held(controller, launcher)


def test_box_down_while_the_killed_launcher_has_not_exited_leaves_no_mount(
    running_box: RunningBox, private_box: Any
) -> None:
    if not (FREEZER / "freezer.state").parent.is_dir() or not (FREEZER / "tasks").exists():
        pytest.skip("no v1 freezer hierarchy on this host")
    with private_box() as box, _sleeping_sandbox(running_box, box) as (client, uid):
        found = _launcher_and_group(uid)
        assert found is not None, "the sandbox's launcher was not found"
        launcher, v2_group = found
        controller = box.controller_pid()
        assert int(_status(launcher, "PPid")) == controller
        with _frozen(launcher) as thaw:
            down = subprocess.Popen(
                [str(LNK), "box", "down"],
                env=box.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            deadline = time.monotonic() + WAIT_S
            while down.poll() is None and not _waiting_on(controller, launcher, v2_group):
                assert time.monotonic() < deadline, "the clean-up neither waited nor ended"
            thaw()  # the launcher exits now: the clean-up was waiting for exactly that
            _, err = down.communicate(timeout=WAIT_S * 2)
        assert down.returncode == 0, err
        client.wait(timeout=WAIT_S)
        assert _leftovers(uid, box.run_dir, box.state_dir) == []
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mounts = [line.split()[4] for line in f if str(box.run_dir) in line.split()[4]]
        assert mounts == [], "a stopped box keeps mounts under its run dir"
