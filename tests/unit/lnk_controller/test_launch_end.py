"""The end of a sandbox as its client hears it: the program's status as shells say it, and the
limits said when none were applied (as any user: a real child process)."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from lnk_controller.launch_end import Ending
from lnk_controller.spawn import Running


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
