"""Host users' processes and their concurrency, as root: killing a uid's processes (double-forked,
forking meanwhile), a recorded process killed only while it is
that process, creates from many threads and processes at once, the lock shared with shadow-utils
(lckpwdf), and the time a create and a remove take.

Every uid comes from the `uids` fixture and is removed at teardown, whatever the test did
(conftest.py, tests/unit/helpers/host_user_kit.py).
"""

from __future__ import annotations

import ctypes
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from host_user_kit import (
    NewUid,
    assert_etc_as,
    etc_snapshot,
    lines_naming,
    live_pids_of,
    start_as,
)

from lnk_controller import host_users, spawn
from lnk_controller.host_users import (
    create_user,
    kill_uid_processes,
    remove_user,
    user_name,
)
from lnk_shared.errors import StateError

# --- processes --------------------------------------------------------------------------------


@pytest.mark.needs_root
def test_kill_ends_a_process_of_the_uid_and_spares_others(
    uids: NewUid, procs: list[subprocess.Popen[bytes]]
) -> None:
    uid, other = uids(), uids()
    target = start_as(uid, ["sleep", "1000"], procs)
    bystander = start_as(other, ["sleep", "1000"], procs)
    assert kill_uid_processes(uid) == 1
    assert target.wait(timeout=5) == -9
    assert bystander.poll() is None
    assert kill_uid_processes(uid) == 0


@pytest.mark.needs_root
def test_kill_finds_a_double_forked_process(
    uids: NewUid, procs: list[subprocess.Popen[bytes]]
) -> None:
    uid = uids()
    shell = start_as(uid, ["sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!"], procs)
    assert shell.stdout is not None
    orphan = int(shell.stdout.readline())
    shell.wait(timeout=5)
    assert live_pids_of(uid) == [orphan]
    assert kill_uid_processes(uid) == 1
    assert live_pids_of(uid) == []


@pytest.mark.needs_root
def test_kill_catches_processes_forked_while_killing(
    uids: NewUid, procs: list[subprocess.Popen[bytes]]
) -> None:
    uid = uids()
    start_as(uid, ["sh", "-c", "for i in $(seq 300); do sleep 1000 & done; wait"], procs)
    time.sleep(0.02)
    assert kill_uid_processes(uid) >= 1
    assert live_pids_of(uid) == []


@pytest.mark.needs_root
def test_remove_kills_a_running_process_first(
    uids: NewUid, homes: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    user = create_user(uids(), homes_dir=homes)
    sleeper = start_as(user.uid, ["sleep", "1000"], procs)
    remove_user(user)
    assert sleeper.wait(timeout=5) == -9
    assert not lines_naming(user.name)


def test_a_recorded_process_is_killed_only_while_it_is_that_process() -> None:
    with subprocess.Popen(["/bin/sleep", "30"]) as sleeper:
        start = spawn.start_time(sleeper.pid)
        assert start is not None
        # Another start time: a reused pid is someone else's and is left alone.
        assert not host_users.kill_recorded_process(sleeper.pid, start + 1)
        assert sleeper.poll() is None
        assert host_users.kill_recorded_process(sleeper.pid, start)
        assert sleeper.wait(timeout=5) == -9
    assert not host_users.kill_recorded_process(None, None)
    assert not host_users.kill_recorded_process(1, 0)  # never init


# --- concurrency and the shared lock ----------------------------------------------------------


_CHILD = """
import json, sys, threading, time
from pathlib import Path
from lnk_controller.host_users import create_user
homes, start, uids = Path(sys.argv[1]), float(sys.argv[2]), [int(u) for u in sys.argv[3:]]
made, errors = [], []
def one(uid):
    time.sleep(max(0.0, start - time.time()))
    try:
        made.append(create_user(uid, homes_dir=homes).uid)
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=one, args=(u,)) for u in uids]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"made": made, "errors": errors}))
"""


@pytest.mark.needs_root
def test_concurrent_creates_from_threads_and_processes(uids: NewUid, homes: Path) -> None:
    own = [uids() for _ in range(20)]
    theirs = [[uids() for _ in range(5)] for _ in range(4)]
    start = time.time() + 1.5  # every thread in every process begins at once
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(homes), str(start), *map(str, batch)],
            stdout=subprocess.PIPE,
        )
        for batch in theirs
    ]
    made: list[int] = []
    errors: list[str] = []

    def one(uid: int) -> None:
        time.sleep(max(0.0, start - time.time()))
        try:
            made.append(create_user(uid, homes_dir=homes).uid)
        except StateError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=one, args=(u,)) for u in own]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for child in children:
        out, _ = child.communicate(timeout=60)
        result = json.loads(out)
        made += result["made"]
        errors += result["errors"]
    assert errors == []
    expected = own + [u for batch in theirs for u in batch]
    assert sorted(made) == sorted(expected)
    passwd = [line.split(":") for line in Path("/etc/passwd").read_text().splitlines()]
    group = [line.split(":") for line in Path("/etc/group").read_text().splitlines()]
    assert all(len(f) == 7 and f[2].isdigit() and f[3].isdigit() for f in passwd)
    assert all(len(f) == 4 and f[2].isdigit() for f in group)
    assert len({f[0] for f in passwd}) == len(passwd)
    assert len({f[0] for f in group}) == len(group)
    for uid in expected:
        got = subprocess.run(
            ["getent", "passwd", user_name(uid)], check=True, capture_output=True, text=True
        )
        assert got.stdout.split(":")[2] == str(uid)


@pytest.mark.needs_root
def test_same_uid_from_many_threads_is_created_once(uids: NewUid, homes: Path) -> None:
    uid = uids()
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def one() -> None:
        barrier.wait()
        try:
            create_user(uid, homes_dir=homes)
            outcomes.append("made")
        except StateError as e:
            outcomes.append(str(e))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("made") == 1
    assert len(lines_naming(user_name(uid))) == 2


_HOLD_LCKPWDF = """
import ctypes, sys, time
libc = ctypes.CDLL("libc.so.6", use_errno=True)
assert libc.lckpwdf() == 0
print("held", flush=True)
time.sleep(float(sys.argv[1]))
"""


@pytest.mark.needs_root
def test_create_waits_for_a_shadow_utils_lock_holder(uids: NewUid, homes: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LCKPWDF, "0.5"], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    began = time.monotonic()
    create_user(uids(), homes_dir=homes)
    assert time.monotonic() - began > 0.3
    holder.wait(timeout=5)
    holder.stdout.close()


@pytest.mark.needs_root
def test_lock_held_too_long_is_a_state_error(
    uids: NewUid, homes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_users, "LOCK_TIMEOUT", 0.2)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LCKPWDF, "3"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        before = etc_snapshot()
        with pytest.raises(StateError, match="stayed locked"):
            create_user(uids(), homes_dir=homes)
        assert_etc_as(before)
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


@pytest.mark.needs_root
def test_our_lock_excludes_lckpwdf() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    with host_users._etc_locked():
        tried = subprocess.run(
            [
                sys.executable,
                "-c",
                "import ctypes,fcntl,os\n"
                "fd = os.open('/etc/.pwd.lock', os.O_WRONLY)\n"
                "try:\n    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
                "except OSError:\n    print('busy')\n",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    assert tried.stdout == "busy\n"
    assert libc.lckpwdf() == 0  # released again
    assert libc.ulckpwdf() == 0


# --- speed ------------------------------------------------------------------------------------


@pytest.mark.needs_root
def test_create_and_remove_time(uids: NewUid, homes: Path) -> None:
    """Not asserted: prints the times (run with -s). The whole sandbox start target is 60 ms."""
    creates, removes = [], []
    for _ in range(20):
        began = time.perf_counter()
        user = create_user(uids(), homes_dir=homes)
        created = time.perf_counter()
        remove_user(user)
        creates.append((created - began) * 1000)
        removes.append((time.perf_counter() - created) * 1000)
    for what, times in (("create_user", creates), ("remove_user", removes)):
        print(
            f"\n{what}: median {statistics.median(times):.1f} ms,"
            f" min {min(times):.1f} ms, max {max(times):.1f} ms over {len(times)}"
        )
