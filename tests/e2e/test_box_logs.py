"""The services' logs under `lnk box up`, and their stop: each service writes into a pipe whose
keeper rotates `logs/<name>.log` past `log_max_bytes`, keeping `log_keep_count` older files;
the newest lines are in the current file, no process holds a removed log open, `lnk box
status` and a launch still work, and `lnk box down` leaves no keeper behind. The controller,
whose API loop no longer wakes on a timer, stops promptly on SIGTERM and on `lnk box down`
(timed against a bound: a loop nobody woke would never stop)."""

from __future__ import annotations

import os
import select
import time
from pathlib import Path
from typing import Any

import pytest
from box_teardown import box_pids

pytestmark = pytest.mark.needs_root

MAX_BYTES = 64 * 1024  # the smallest log_max_bytes controller.toml allows
KEEP = 2
LINE = b"x" * 99 + b"\n"
WRITTEN = 400 * 1024  # six files' worth of lines: rotated past the count several times
STOP_BOUND_S = 10.0  # the controller's stop (its API, every sandbox cleaned): about a second
SERVICES = ("proxy", "bridge-store", "controller")


def _log_files(logs: Path, name: str) -> list[Path]:
    return sorted(logs.glob(f"{name}.log*"))


def _removed_logs_held(pids: list[int], logs: Path) -> list[str]:
    """Files under `logs` that one of `pids` holds open though they were removed."""
    held = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(str(logs)) and target.endswith("(deleted)"):
                held.append(f"{pid}: {target}")
    return held


def _keepers(run_dir: Path) -> list[int]:
    found = []
    for pid in box_pids(run_dir):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"lnk_admin.log_keeper" in cmdline:
            found.append(pid)
    return found


def _wait_for(what: str, done: Any, bound_s: float = 20.0) -> None:
    deadline = time.monotonic() + bound_s
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_services_log_rotates_past_its_size_keeping_the_count(private_box: Any) -> None:
    config = f"log_max_bytes = {MAX_BYTES}\nlog_keep_count = {KEEP}"
    with private_box(config) as box:
        logs = box.state_dir / "logs"
        _wait_for(
            "no start line", lambda: "controller ready" in (logs / "controller.log").read_text()
        )
        assert len(_keepers(box.run_dir)) == len(SERVICES)
        # What the controller writes to its stderr, through the very pipe it writes to: as
        # root, its descriptor 2 opened again from /proc.
        with open(f"/proc/{box.controller_pid()}/fd/2", "wb", buffering=0) as stderr:
            for _ in range(WRITTEN // len(LINE)):
                stderr.write(LINE)
        _wait_for("no rotation past the count", lambda: len(_log_files(logs, "controller")) > KEEP)
        run = box.lnk("sandbox", "run", "--yes", "--", "/bin/true")  # the controller's own lines
        assert run.returncode == 0, run.stderr
        _wait_for(
            "the launch's lines are not in the current file",
            lambda: b" cleaned (uid " in (logs / "controller.log").read_bytes().split(LINE)[-1],
        )
        files = _log_files(logs, "controller")
        assert [p.name for p in files] == ["controller.log", "controller.log.1", "controller.log.2"]
        for path in files:
            data = path.read_bytes()
            assert 0 < len(data) <= MAX_BYTES and data.endswith(b"\n"), path
            assert path.stat().st_mode & 0o777 == 0o600
        assert _removed_logs_held(box_pids(box.run_dir), logs) == []
        status = box.lnk("box", "status")
        assert status.returncode == 0, status.stdout + status.stderr
        down = box.lnk("box", "down")
        assert down.returncode == 0, down.stderr
        assert _keepers(box.run_dir) == []  # each ended with its service's pipe
        assert box_pids(box.run_dir) == []


def _ended_within(pid: int, bound_s: float) -> float | None:
    """Seconds until `pid` ended (a pidfd: the kernel says when), None past `bound_s`."""
    fd = os.pidfd_open(pid)
    t0 = time.monotonic()
    try:
        if not select.select([fd], [], [], bound_s)[0]:
            return None
    finally:
        os.close(fd)
    return time.monotonic() - t0


def test_the_controller_stops_promptly_on_sigterm(private_box: Any) -> None:
    with private_box() as box:
        assert box.lnk("sandbox", "list").returncode == 0  # it answers
        time.sleep(1.0)  # at rest: its API loop sleeps with no timer
        pid = box.controller_pid()
        os.kill(pid, 15)
        took = _ended_within(pid, STOP_BOUND_S)
        assert took is not None, f"the controller did not stop within {STOP_BOUND_S} s"
        log = box.state_dir / "logs" / "controller.log"
        _wait_for(  # its own stop, not a kill (the keeper writes it once the pipe has it)
            "the controller's stop is not in its log",
            lambda: "stopping: cleaning every sandbox" in log.read_text(),
        )


def test_box_down_stops_every_service_within_its_bound(private_box: Any) -> None:
    with private_box() as box:
        assert box.lnk("sandbox", "list").returncode == 0
        time.sleep(1.0)
        t0 = time.monotonic()
        down = box.lnk("box", "down")
        took = time.monotonic() - t0
        assert down.returncode == 0, down.stderr
        assert [line.split(":")[1].strip() for line in down.stdout.splitlines()] == ["down"] * 3
        assert took < STOP_BOUND_S, f"lnk box down took {took:.1f} s"
        assert box_pids(box.run_dir) == []
