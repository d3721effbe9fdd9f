"""The wall over time: each sandbox is its own fresh host user while it runs and leaves nothing
when it ends, is stopped, or its controller dies; owners manage only their own sandboxes; a
terminal and signals pass through to the program.

Most tests use the session's box (`running_box`). Killing a controller uses a box of its own,
with its own run and state dirs and a uid range no other box here uses (a starting controller
removes every sandbox user of its range it has no record of).
"""

from __future__ import annotations

import json
import os
import pty
import pwd
import re
import secrets
import select
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user

from lnk_controller.cgroup_limits import v1_hierarchies

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = pytest.mark.needs_root

PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
LNK = PREFIX / "venv" / "bin" / "lnk"
LNK_PYTHON = PREFIX / "venv" / "bin" / "python"
SANDBOX_USER_PREFIX = "lnk-sbx-"
WAIT_S = 15.0  # how long a sandbox may take to show up or go away before the test gives up
SIGNAL_S = 8.0  # a forwarded signal arrives at once; the program would sleep 30 s without it
RECONCILE_S = 5.0  # "within a few seconds": a restarted controller cleans orphans this fast


# -- what a sandbox may leave behind ------------------------------------------------------------


def _uid_processes(uid: int) -> list[int]:
    """Live processes whose real, effective or saved uid is `uid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8") as f:
                status = f.read()
        except OSError:
            continue
        uids = re.search(r"^Uid:\s+(\d+)\s+(\d+)\s+(\d+)", status, re.MULTILINE)
        state = re.search(r"^State:\s+(\S)", status, re.MULTILINE)
        if uids and str(uid) in uids.groups()[:3] and state and state.group(1) != "Z":
            found.append(int(entry))
    return found


def _sandbox_mounts(run_dir: Path) -> list[str]:
    below = f"{run_dir}/sandboxes/"
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p.startswith(below)]


def _user_lines(uid: int) -> tuple[list[str], list[str]]:
    """(passwd lines, group lines) naming sandbox user `uid`."""
    name = f"{SANDBOX_USER_PREFIX}{uid}:"
    found: list[list[str]] = []
    for path in ("/etc/passwd", "/etc/group"):
        with open(path, encoding="utf-8") as f:
            found.append([f"{path}: {line.strip()}" for line in f if line.startswith(name)])
    return found[0], found[1]


def _leftovers(uid: int, run_dir: Path, state_dir: Path) -> list[str]:
    """Everything of sandbox user `uid` still on the host (empty when it is all cleaned).

    Another box on this machine (a concurrent test run) may reuse the uid as soon as it is
    free: a passwd line whose home is in another box's state dir is that box's user, and then
    the uid's group line and processes are that box's too."""
    homes = f"{state_dir}/homes/"
    users, groups = _user_lines(uid)
    mine = [line for line in users if f":{homes}" in line]
    if len(mine) < len(users):
        return mine
    left = mine + groups
    home = state_dir / "homes" / f"{SANDBOX_USER_PREFIX}{uid}"
    if home.exists():
        left.append(f"home {home}")
    left += [f"process {pid}" for pid in _uid_processes(uid)]
    left += [f"mount {m}" for m in _sandbox_mounts(run_dir)]
    return left


def _wait_for(what: str, check: Any, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


# -- running things as an owner -----------------------------------------------------------------


def _owner_argv(uid: int, gid: int, *args: str) -> list[str]:
    return as_user(uid, gid, str(LNK), *args)


def _popen_run(box: RunningBox, *args: str, **kw: Any) -> subprocess.Popen[str]:
    """`lnk sandbox run --yes ARGS` as the box's owner, in the background."""
    owner = box.owner
    return subprocess.Popen(
        _owner_argv(owner.uid, owner.gid, "sandbox", "run", "--yes", *args),
        env=box.owner_env(),
        cwd=str(owner.home),
        text=True,
        **kw,
    )


def _listed(box: RunningBox) -> list[dict[str, Any]]:
    result = box.as_owner("sandbox", "list", "--json")
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def _running_rows(box: RunningBox, command_mark: str) -> list[dict[str, Any]]:
    """The owner's running sandboxes whose command line contains `command_mark`."""
    return [
        r
        for r in _listed(box)
        if r["state"] == "running" and any(command_mark in part for part in r["command"])
    ]


def _exactly(n: int, rows: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    return rows if len(rows) == n else None


def _end(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    with suppress(subprocess.TimeoutExpired):
        process.communicate(timeout=10)


# -- two at once ---------------------------------------------------------------------------------


def test_two_concurrent_sandboxes_are_two_users_and_leave_nothing(
    running_box: RunningBox,
) -> None:
    mark = f"lnk-two-{secrets.token_hex(3)}"
    script = f"id -u; sleep 3; : {mark}"
    runs = [
        _popen_run(
            running_box,
            "--command=id",
            "--command=sleep",
            "--",
            "/bin/sh",
            "-c",
            script,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    try:
        both = _wait_for(
            "two sandboxes running at once", lambda: _exactly(2, _running_rows(running_box, mark))
        )
        listed_uids = {r["host_uid"] for r in both}
        outputs = [p.communicate(timeout=30) for p in runs]
    finally:
        for process in runs:
            _end(process)
    for process, (_, err) in zip(runs, outputs, strict=True):
        assert process.returncode == 0, err
    uids = {int(out.strip()) for out, _ in outputs}
    assert len(uids) == 2, outputs
    assert uids == listed_uids
    assert running_box.owner.uid not in uids
    for uid in uids:
        assert _leftovers(uid, running_box.run_dir, running_box.state_dir) == []
    assert not _running_rows(running_box, mark)


# -- list and stop ------------------------------------------------------------------------------


def test_stop_kills_the_program_and_cleans_everything(running_box: RunningBox) -> None:
    mark = f"lnk-stop-{secrets.token_hex(3)}"
    process = _popen_run(
        running_box,
        "--command=sleep",
        "--",
        "/bin/sh",
        "-c",
        f"sleep 30; echo not-stopped; : {mark}",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        (row,) = _wait_for(
            "the sandbox in `lnk sandbox list`", lambda: _running_rows(running_box, mark)
        )
        uid = row["host_uid"]
        assert _uid_processes(uid), "the sandbox's program is not running as its uid"
        listing = running_box.as_owner("sandbox", "list")
        assert row["id"] in listing.stdout and "running" in listing.stdout
        started = time.monotonic()
        stop = running_box.as_owner("sandbox", "stop", row["id"])
        out, _ = process.communicate(timeout=WAIT_S)
        took = time.monotonic() - started
    finally:
        _end(process)
    assert "not-stopped" not in out
    assert process.returncode != 0
    assert took < 10, f"the program ran on for {took:.1f} s after stop"
    assert _leftovers(uid, running_box.run_dir, running_box.state_dir) == []
    assert not _running_rows(running_box, mark)
    assert stop.returncode == 0, f"stop failed: {stop.stderr}"
    assert row["id"] in stop.stdout


@dataclass
class _OtherOwner:
    name: str
    uid: int
    gid: int
    home: Path


@contextmanager
def _other_owner() -> Iterator[_OtherOwner]:
    name = "lnko" + secrets.token_hex(3)
    subprocess.run(
        ["useradd", "-m", "-s", "/bin/bash", "-K", "UID_MIN=1500", name],
        check=True,
        capture_output=True,
    )
    try:
        entry = pwd.getpwnam(name)
        yield _OtherOwner(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    finally:
        with suppress(KeyError):
            for pid in _uid_processes(pwd.getpwnam(name).pw_uid):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        subprocess.run(["userdel", "-r", name], capture_output=True, check=False)


def test_another_owner_cannot_see_stop_or_pause_a_sandbox(running_box: RunningBox) -> None:
    mark = f"lnk-other-{secrets.token_hex(3)}"
    process = _popen_run(
        running_box,
        "--command=sleep",
        "--",
        "/bin/sh",
        "-c",
        f"sleep 30; : {mark}",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        (row,) = _wait_for(
            "the sandbox in `lnk sandbox list`", lambda: _running_rows(running_box, mark)
        )
        with _other_owner() as other:
            env = {**running_box.owner_env(), "HOME": str(other.home), "USER": other.name}

            def as_other(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    _owner_argv(other.uid, other.gid, *args),
                    env=env,
                    cwd=str(other.home),
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )

            listing = as_other("sandbox", "list", "--json")
            listing_all = as_other("sandbox", "list", "--all", "--json")
            stop = as_other("sandbox", "stop", row["id"])
            pause = as_other("sandbox", "pause", row["id"])
        assert listing.returncode == 0, listing.stderr
        assert json.loads(listing.stdout) == []
        assert row["id"] not in listing_all.stdout
        for refused in (stop, pause):
            assert refused.returncode != 0
            assert "no such sandbox" in refused.stderr, refused.stderr
        # Still running, not frozen, and still the owner's.
        assert process.poll() is None
        assert _running_rows(running_box, mark)
        for pid in _uid_processes(row["host_uid"]):
            with open(f"/proc/{pid}/status", encoding="utf-8") as f:
                state = re.search(r"^State:\s+(\S)", f.read(), re.MULTILINE)
            assert state is not None and state.group(1) != "T", f"pid {pid} was paused"
    finally:
        _end(process)
    _wait_for(
        "the sandbox to be cleaned after its client was killed",
        lambda: not _leftovers(row["host_uid"], running_box.run_dir, running_box.state_dir),
    )


# -- terminal and signals -----------------------------------------------------------------------


def _read_until(fd: int, pattern: re.Pattern[bytes], seen: bytearray, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not pattern.search(seen):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other side of the pty is closed
            return bool(pattern.search(seen))
        if not chunk:
            return bool(pattern.search(seen))
        seen += chunk
    return True


def test_interactive_bash_over_a_pty_works(running_box: RunningBox) -> None:
    owner = running_box.owner
    argv = _owner_argv(
        owner.uid,
        owner.gid,
        "sandbox",
        "run",
        "--yes",
        "--command=/bin/bash",
        "--",
        "/bin/bash",
        "-i",
    )
    env = {**running_box.owner_env(), "TERM": "xterm"}
    pid, master = pty.fork()
    if pid == 0:  # the child: becomes the owner's `lnk` on the pty
        try:
            os.chdir(owner.home)
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    seen = bytearray()
    status = None
    try:
        assert _read_until(master, re.compile(rb"\$ ?$|\$ "), seen, WAIT_S), bytes(seen)
        os.write(master, b"echo $((6*7))\n")
        assert _read_until(master, re.compile(rb"[\r\n]42\r?\n"), seen, WAIT_S), bytes(seen)
        os.write(master, b"exit 5\n")
        _read_until(master, re.compile(rb"(?!)"), seen, WAIT_S)  # to the end of output
        deadline = time.monotonic() + WAIT_S
        while status is None and time.monotonic() < deadline:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = raw
            else:
                time.sleep(0.05)
    finally:
        if status is None:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(master)
    assert status is not None, f"lnk did not exit: {bytes(seen)!r}"
    assert os.waitstatus_to_exitcode(status) == 5, bytes(seen)


@pytest.mark.parametrize("client", ["full", "quick"])
def test_sigterm_to_the_client_reaches_the_program(running_box: RunningBox, client: str) -> None:
    """The program says "ready" as it starts, maybe before the client has read the "started"
    frame: a SIGTERM sent then must still reach the program (held by the client until it
    forwards it), not end the client. `quick`: the plain form, `lnk sandbox run --spec F --`."""
    script = 'trap "echo got-term; exit 9" TERM; echo ready; sleep 30 & wait'
    grant, spec = ["--command=sleep"], None
    if client == "quick":
        owner = running_box.owner
        spec = owner.home / f"sleep-{secrets.token_hex(3)}.toml"
        spec.write_text('[commands]\nallow = ["sleep"]\n')
        os.chown(spec, owner.uid, owner.gid)
        grant = ["--spec", str(spec)]
    process = _popen_run(
        running_box,
        *grant,
        "--",
        "/bin/sh",
        "-c",
        script,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], WAIT_S)
        assert ready, "the program did not start"
        assert process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        try:
            out, err = process.communicate(timeout=SIGNAL_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"SIGTERM to `lnk sandbox run` did not reach the program in {SIGNAL_S:g} s")
    finally:
        _end(process)
        if spec is not None:
            spec.unlink(missing_ok=True)
    assert "got-term" in out, (out, err)
    assert process.returncode == 9, (out, err)


# -- a controller killed ------------------------------------------------------------------------


@contextmanager
def _sleeping_sandbox(
    running_box: RunningBox, box: Any
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """The session owner's `sleep 60` in a sandbox of `box`: (its client, the sandbox's uid)."""
    owner = running_box.owner
    env = {**running_box.owner_env(), **{k: box.env[k] for k in box.env if k.startswith("LNK_")}}
    client = subprocess.Popen(
        _owner_argv(
            owner.uid,
            owner.gid,
            "sandbox",
            "run",
            "--yes",
            "--command=sleep",
            "--",
            "/bin/sleep",
            "60",
        ),
        env=env,
        cwd=str(owner.home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        (uid,) = _wait_for("the sandbox's user", box.uids)
        _wait_for("the sandbox's program", lambda: _uid_processes(uid))
        yield client, uid
    finally:
        _end(client)


def test_orphan_of_a_killed_controller_is_cleaned_on_restart(
    running_box: RunningBox, private_box: Any
) -> None:
    with private_box() as box, _sleeping_sandbox(running_box, box) as (client, uid):
        assert _sandbox_mounts(box.run_dir), "no staged mount while the sandbox runs"
        assert len(_limit_groups(box.state_dir)) == 3  # its pids, memory and cpu v1 groups
        os.kill(box.controller_pid(), signal.SIGKILL)
        # The client notices its controller is gone. (Not `communicate`: a sandbox that
        # outlives its controller still holds the client's stdout until reconcile.)
        client.wait(timeout=WAIT_S)
        orphan = _leftovers(uid, box.run_dir, box.state_dir)
        assert any("/etc/passwd" in o for o in orphan), "no orphan for reconcile to clean"
        assert any(o.startswith("mount ") for o in orphan), orphan
        up = box.lnk("box", "up")
        assert up.returncode == 0, up.stderr
        started = time.monotonic()
        while _leftovers(uid, box.run_dir, box.state_dir):
            if time.monotonic() - started > RECONCILE_S:
                break
            time.sleep(0.1)
        left = _leftovers(uid, box.run_dir, box.state_dir)
        assert left == [], f"orphan not cleaned {RECONCILE_S:g} s after restart: {left}"
        assert _limit_groups(box.state_dir) == []  # reconcile removed its limits' groups too
        assert client.returncode != 0


def _limit_groups(state_dir: Path) -> list[Path]:
    """The v1 limit groups of this box's sandboxes still on the host (the controller was
    started from this process: its own v1 groups, the sandboxes' parents, are this one's)."""
    with closing(sqlite3.connect(f"file:{state_dir / 'controller.db'}?mode=ro", uri=True)) as db:
        ids = [row[0] for row in db.execute("SELECT id FROM sandboxes")]
    parents = v1_hierarchies().values()
    return [p / i for p in parents for i in ids if (p / i).exists()]


def test_box_down_with_a_sandbox_running_leaves_no_process_user_or_mount(
    running_box: RunningBox, private_box: Any
) -> None:
    with private_box() as box, _sleeping_sandbox(running_box, box) as (client, uid):
        down = box.lnk("box", "down")
        assert down.returncode == 0, down.stderr
        client.wait(timeout=WAIT_S)
        assert _leftovers(uid, box.run_dir, box.state_dir) == []
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mounts = [line.split()[4] for line in f if str(box.run_dir) in line.split()[4]]
        assert mounts == [], "a stopped box keeps mounts under its run dir"
        assert client.returncode == 128 + signal.SIGKILL  # its client is told it was killed
