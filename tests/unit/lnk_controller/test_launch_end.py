"""The end of a sandbox as its client hears it: the program's status as shells say it, and the
limits said when none were applied (as any user: a real child process)."""

from __future__ import annotations

import subprocess
import threading
from types import SimpleNamespace

import pytest

from lnk_controller.launch_end import Ending
from lnk_controller.spawn import Running
from lnk_shared.errors import StateError


def _running(script: str) -> Running:
    process = subprocess.Popen(["/bin/sh", "-c", script])
    return Running(row=SimpleNamespace(id="sbx-1"), process=process, terminal_master=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("script", "status"), [("exit 0", 0), ("exit 3", 3), ("kill -TERM $$", 143)]
)
def test_the_status_is_the_programs_and_128_plus_a_signal(script: str, status: int) -> None:
    assert Ending().waited(_running(script)) == status


def test_without_limits_applied_none_are_said_nor_met() -> None:
    ending = Ending()
    ending._limits = {}
    running = _running("exit 0")
    running.process.wait()
    assert ending.limits_said(running) == "none (limits.unsafe_no_limits)"
    assert ending.limits_outcome(running) is None


class _Unreadable:
    """A store whose database cannot be read (a full or failed disk)."""

    def get(self, sandbox_id: str) -> None:
        raise StateError(f"cannot read the controller database /x (disk I/O error): {sandbox_id}")


class _Gone:
    def get(self, sandbox_id: str) -> None:
        return None  # ended and pruned: nothing to clean


def _ending(store: object, rung: list[str]) -> Ending:
    ending = Ending()
    ending.store = store  # type: ignore[assignment]
    ending.cfg = None  # type: ignore[assignment]  # not reached: the record is read first
    ending._places, ending._limits = {}, {}
    ending._active, ending._active_guard = {"sbx-1"}, threading.Lock()
    ending._left_to_reaper = lambda: rung.append("rung")
    return ending


def test_a_clean_up_that_fails_hands_the_row_to_the_reaper_and_wakes_it() -> None:
    rung: list[str] = []
    ending = _ending(_Unreadable(), rung)
    assert ending.clean_or_leave("sbx-1", 0) is False
    assert ending._active == set()  # the reaper's now: a live row no launch has
    assert rung == ["rung"]  # asleep until the next lease's end otherwise


def test_a_clean_up_that_lands_does_not_wake_the_reaper() -> None:
    rung: list[str] = []
    ending = _ending(_Gone(), rung)
    assert ending.clean_or_leave("sbx-1", 0) is True
    assert ending._active == set() and rung == []
