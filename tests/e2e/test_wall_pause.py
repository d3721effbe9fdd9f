"""Pause, resume and stop against a sandbox that fights back: its processes fork all the time
and wake each other (`kill -CONT -1`), so one left running during a pause resumes the rest, and
one forked while the sandbox is being stopped would outlive a scan of /proc. Each sandbox's
processes live in a cgroup of their own, frozen and killed as one.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = pytest.mark.needs_root

PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
LNK = PREFIX / "venv" / "bin" / "lnk"
WAIT_S = 15.0
PAUSES = 6  # rounds: a pause racing a fork loses sometimes, so one round proves little
QUIET_S = 0.6  # a paused sandbox prints nothing this long (the loop prints every few ms)

# Every iteration forks a subshell that wakes every process of the sandbox, then prints; a
# process the pause misses keeps printing and wakes the ones it stopped.
RESURRECTOR = 'while :; do (kill -CONT -1 2>/dev/null; echo "t $$") ; done'


def _owner_argv(box: RunningBox, *args: str) -> list[str]:
    owner = box.owner
    return as_user(owner.uid, owner.gid, str(LNK), *args)


def _lnk(box: RunningBox, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _owner_argv(box, *args),
        env=box.owner_env(),
        cwd=str(box.owner.home),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _drain(fd: int) -> int:
    """Bytes waiting on the non-blocking `fd`, read and counted."""
    total = 0
    with suppress(BlockingIOError):
        while chunk := os.read(fd, 1 << 16):
            total += len(chunk)
    return total


def _wait_for_output(fd: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while _drain(fd) == 0:
        if time.monotonic() > deadline:
            pytest.fail("the sandbox printed nothing")
        time.sleep(0.05)


@contextmanager
def _resurrector(box: RunningBox) -> Iterator[tuple[subprocess.Popen[str], int, str]]:
    """The fighting program in a sandbox: (client process, its stdout, the sandbox's id)."""
    mark = f"lnk-pause-{secrets.token_hex(3)}"
    process = subprocess.Popen(
        _owner_argv(
            box, "sandbox", "run", "--yes", "--", "/bin/sh", "-c", f"{RESURRECTOR} # {mark}"
        ),
        env=box.owner_env(),
        cwd=str(box.owner.home),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    fd = process.stdout.fileno()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    try:
        _wait_for_output(fd)
        listing = _lnk(box, "sandbox", "list", "--json")
        assert listing.returncode == 0, listing.stderr
        (row,) = [r for r in json.loads(listing.stdout) if any(mark in c for c in r["command"])]
        yield process, fd, row["id"]
    finally:
        if process.poll() is None:
            process.kill()
        with suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=15)


def _uid_processes(uid: int) -> list[int]:
    """Live (not zombie) processes whose real, effective or saved uid is `uid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as f:
                    status = f.read()
            except OSError:
                continue
            fields = dict(x.split(":", 1) for x in status.splitlines() if ":" in x)
            zombie = fields.get("State", "").split()[:1] == ["Z"]  # in no cgroup any more
            if str(uid) in fields.get("Uid", "").split()[:3] and not zombie:
                found.append(int(entry))
    return found


def test_a_paused_sandbox_stays_paused_though_it_forks_and_wakes_itself(
    running_box: RunningBox,
) -> None:
    with _resurrector(running_box) as (process, fd, sandbox_id):
        for round_ in range(PAUSES):
            paused = _lnk(running_box, "sandbox", "pause", sandbox_id)
            assert paused.returncode == 0, paused.stderr
            _drain(fd)  # what it printed before the pause took hold
            time.sleep(QUIET_S)
            leaked = _drain(fd)
            resumed = _lnk(running_box, "sandbox", "resume", sandbox_id)
            assert resumed.returncode == 0, resumed.stderr
            assert leaked == 0, f"round {round_}: {leaked} bytes printed while paused"
            # The granted path: resumed, it runs again without a restart.
            _wait_for_output(fd)
        assert process.poll() is None


def test_a_stop_kills_a_sandbox_that_forks_all_the_time(running_box: RunningBox) -> None:
    with _resurrector(running_box) as (process, _fd, sandbox_id):
        listing = _lnk(running_box, "sandbox", "list", "--json")
        (row,) = [r for r in json.loads(listing.stdout) if r["id"] == sandbox_id]
        group = _cgroup_of(row["host_uid"])
        assert group.is_dir()
        stopped = _lnk(running_box, "sandbox", "stop", sandbox_id)
        assert stopped.returncode == 0, stopped.stderr
        assert _uid_processes(row["host_uid"]) == []
        assert not group.exists()  # the group goes with its processes
        process.wait(timeout=WAIT_S)


def test_each_sandbox_runs_in_a_cgroup_of_its_own(running_box: RunningBox) -> None:
    with _resurrector(running_box) as (_process, _fd, sandbox_id):
        listing = _lnk(running_box, "sandbox", "list", "--json")
        (row,) = [r for r in json.loads(listing.stdout) if r["id"] == sandbox_id]
        group = _cgroup_of(row["host_uid"])
        assert group.name == sandbox_id
        # Paused (so nothing forks meanwhile), it holds every process of the sandbox's uid and
        # nothing else.
        assert _lnk(running_box, "sandbox", "pause", sandbox_id).returncode == 0
        members = {int(p) for p in (group / "cgroup.procs").read_text().split()}
        assert members == set(_uid_processes(row["host_uid"]))
        assert _lnk(running_box, "sandbox", "resume", sandbox_id).returncode == 0


def _cgroup_of(uid: int) -> Path:
    """The one cgroup v2 group every process of `uid` is in."""
    groups = set()
    for pid in _uid_processes(uid):
        with suppress(FileNotFoundError), open(f"/proc/{pid}/cgroup") as f:
            groups |= {line.split(":", 2)[2].strip() for line in f if line.startswith("0::")}
    assert len(groups) == 1, groups
    return _cgroup2_root() / groups.pop().lstrip("/")


def _cgroup2_root() -> Path:
    with open("/proc/self/mountinfo") as f:
        roots = [
            x.split(" - ")[0].split()[4] for x in f if x.split(" - ")[1].startswith("cgroup2 ")
        ]
    return Path("/sys/fs/cgroup" if "/sys/fs/cgroup" in roots else roots[0])
