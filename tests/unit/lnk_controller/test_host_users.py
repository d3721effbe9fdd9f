"""Host users: real /etc/passwd and /etc/group edits, real homes, real processes, as root.

Every uid comes from the `uids` fixture (a random block above 3_000_000_000) and is removed at
teardown, whatever the test did; teardown fails if a line or process of it is left.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lnk_controller import host_users, spawn
from lnk_controller.host_users import (
    HostUser,
    UidRange,
    check_range_is_free,
    create_user,
    ids_in_use,
    kill_uid_processes,
    list_lnk_users,
    remove_user,
    user_name,
)
from lnk_shared.errors import StateError

TEST_IDS_BASE = 3_000_000_000  # far above any real user, below (uid_t)-1
TEST_IDS_SPAN = 1_000_000_000
ETC_FILES = ("/etc/passwd", "/etc/group", "/etc/shadow", "/etc/gshadow")

NewUid = Callable[[], int]


def _snapshot() -> dict[str, bytes]:
    return {path: Path(path).read_bytes() for path in ETC_FILES}


def _names(text: bytes) -> set[bytes]:
    return {line.split(b":", 1)[0] for line in text.splitlines()}


def _without_others(
    snapshot: dict[str, bytes], ours: str, other: dict[str, bytes]
) -> dict[str, bytes]:
    """`snapshot` less the lines of sandbox users that other test runs on this machine added or
    removed between it and `other` (an `lnk-` name in one of the two only, not `ours`): every
    other line, the machine's own users' included, must still match byte for byte."""
    out = {}
    for path, text in snapshot.items():
        churn = _names(text) ^ _names(other[path])
        foreign = {n for n in churn if n.startswith(b"lnk-") and n != ours.encode()}
        out[path] = b"".join(
            line for line in text.splitlines(keepends=True) if line.split(b":", 1)[0] not in foreign
        )
    return out


def _assert_etc_as(before: dict[str, bytes], ours: str = "") -> None:
    """/etc's user files as they were `before`, but for other test runs' sandbox users."""
    after = _snapshot()
    assert _without_others(after, ours, before) == _without_others(before, ours, after)


def _status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def _live_pids_of(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        status = _status(int(entry)) if entry.isdigit() else {}
        if status and str(uid) in status["Uid"].split()[:3] and status["State"][0] not in "ZX":
            pids.append(int(entry))
    return pids


def _lines_naming(name: str) -> list[str]:
    return [
        f"{path}: {line}"
        for path in ETC_FILES
        for line in Path(path).read_text().splitlines()
        if line.split(":")[0] == name
    ]


@pytest.fixture
def homes(tmp_path: Path) -> Path:
    homes = tmp_path / "homes"
    homes.mkdir()
    homes.chmod(0o711)
    return homes


@pytest.fixture
def uids(homes: Path) -> Iterator[NewUid]:
    """Hands out fresh test uids; at teardown removes each one's user, home and processes."""
    counter = itertools.count(TEST_IDS_BASE + secrets.randbelow(TEST_IDS_SPAN // 1000) * 1000)
    handed: list[int] = []

    def new_uid() -> int:
        handed.append(next(counter))
        return handed[-1]

    yield new_uid
    left = []
    for uid in handed:
        home = homes / user_name(uid)
        if home.is_symlink():
            home.unlink()
        try:
            remove_user(HostUser(user_name(uid), uid, uid, str(home)))
        except StateError as e:
            left.append(str(e))
        left += _lines_naming(user_name(uid)) + [f"pid {p}" for p in _live_pids_of(uid)]
    assert not left, f"test users left behind: {left}"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; each is killed and reaped at teardown."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


def _start_as(
    uid: int, argv: list[str], procs: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    """Start argv as uid:uid with no groups, and wait until it runs as that uid."""
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    p = subprocess.Popen([*setpriv, *argv], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    procs.append(p)
    deadline = time.monotonic() + 5
    while _status(p.pid).get("Uid", "").split()[:1] != [str(uid)]:
        assert time.monotonic() < deadline, "setpriv did not drop to the test uid"
        time.sleep(0.005)
    return p


# --- create and remove ------------------------------------------------------------------------


@pytest.mark.needs_root
def test_create_then_remove_leaves_etc_byte_identical(uids: NewUid, homes: Path) -> None:
    before = _snapshot()
    modes = {p: os.stat(p) for p in ETC_FILES}
    user = create_user(uids(), homes_dir=homes)
    after_create = _snapshot()
    created = _without_others(after_create, user.name, before)
    unchanged = _without_others(before, user.name, after_create)
    assert created["/etc/shadow"] == unchanged["/etc/shadow"]  # no shadow line: '*' is enough
    assert created["/etc/gshadow"] == unchanged["/etc/gshadow"]
    for path, st in modes.items():
        now = os.stat(path)
        assert (now.st_mode, now.st_uid, now.st_gid) == (st.st_mode, st.st_uid, st.st_gid)
    remove_user(user)
    _assert_etc_as(before, user.name)
    assert not (homes / user.name).exists()
    assert not [p for p in os.listdir("/etc") if p.endswith(".lnk-new")]


@pytest.mark.needs_root
def test_created_user_resolves_and_has_no_supplementary_groups(uids: NewUid, homes: Path) -> None:
    user = create_user(uids(), homes_dir=homes)
    u, name = user.uid, user.name
    passwd = subprocess.run(["getent", "passwd", name], capture_output=True, text=True, check=True)
    assert passwd.stdout == f"{name}:*:{u}:{u}::{homes}/{name}:/usr/sbin/nologin\n"
    group = subprocess.run(["getent", "group", name], capture_output=True, text=True, check=True)
    assert group.stdout == f"{name}:*:{u}:\n"
    groups = subprocess.run(["id", "-G", name], capture_output=True, text=True, check=True)
    assert groups.stdout.split() == [str(u)]
    assert (
        subprocess.run(["getent", "shadow", name], check=False, capture_output=True).returncode == 2
    )


@pytest.mark.needs_root
def test_home_is_private_and_owned_by_the_uid(uids: NewUid, homes: Path) -> None:
    user = create_user(uids(), homes_dir=homes)
    st = os.lstat(user.home)
    assert user.home == str(homes / user.name)
    assert (oct(st.st_mode), st.st_uid, st.st_gid) == (oct(0o40700), user.uid, user.gid)


@pytest.mark.needs_root
def test_removing_twice_is_fine(uids: NewUid, homes: Path) -> None:
    user = create_user(uids(), homes_dir=homes)
    remove_user(user)
    remove_user(user)
    assert not _lines_naming(user.name)


@pytest.mark.needs_root
def test_listed_users_include_created_ones_and_group_only_leftovers(
    uids: NewUid, homes: Path
) -> None:
    user = create_user(uids(), homes_dir=homes)
    assert user in list_lnk_users()
    assert user.uid in ids_in_use()
    host_users._edit(host_users._without_user(user), (host_users.USERS_FILE,))  # crash mid-remove
    leftover = HostUser(user.name, user.uid, user.gid, "")
    assert leftover in list_lnk_users()
    remove_user(leftover)
    assert not _lines_naming(user.name)


# --- refusals -------------------------------------------------------------------------------


@pytest.mark.needs_root
def test_duplicate_uid_is_refused(uids: NewUid, homes: Path) -> None:
    user = create_user(uids(), homes_dir=homes)
    before = _snapshot()
    with pytest.raises(StateError, match=f"uid {user.uid} is taken by {user.name}"):
        create_user(user.uid, homes_dir=homes)
    _assert_etc_as(before)


@pytest.mark.needs_root
def test_uid_of_a_foreign_group_is_refused(uids: NewUid, homes: Path) -> None:
    uid = uids()
    subprocess.run(["groupadd", "-g", str(uid), f"lnktest-{uid}"], check=True)
    try:
        assert check_range_is_free(UidRange(uid, uid)) != []
        before = _snapshot()
        with pytest.raises(StateError, match=f"uid {uid} is taken by lnktest-{uid} in /etc/group"):
            create_user(uid, homes_dir=homes)
        _assert_etc_as(before)
        assert not (homes / user_name(uid)).exists()
    finally:
        subprocess.run(["groupdel", f"lnktest-{uid}"], check=True)


@pytest.mark.needs_root
def test_planted_group_membership_is_refused_not_inherited(uids: NewUid, homes: Path) -> None:
    """A group still naming a removed sandbox user would hand its next owner that group."""
    user = create_user(uids(), homes_dir=homes)
    group = f"lnktest-{user.uid}"
    subprocess.run(["groupadd", group], check=True)
    try:
        subprocess.run(["gpasswd", "-a", user.name, group], check=True, capture_output=True)
        remove_user(user)
        with pytest.raises(StateError, match=f"is taken by {group} in /etc/group"):
            create_user(user.uid, homes_dir=homes)
    finally:
        subprocess.run(["groupdel", group], check=True)


@pytest.mark.needs_root
def test_leftover_lnk_users_are_not_range_conflicts(uids: NewUid, homes: Path) -> None:
    user = create_user(uids(), homes_dir=homes)
    assert check_range_is_free(UidRange(user.uid, user.uid + 10)) == []


@pytest.mark.needs_root
@pytest.mark.parametrize("problem", ["link", "world-writable", "not-root-owned", "relative"])
def test_unsafe_homes_dir_is_refused(uids: NewUid, tmp_path: Path, problem: str) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o711)
    homes = real
    if problem == "link":
        homes = tmp_path / "link"
        homes.symlink_to(real)
    elif problem == "world-writable":
        real.chmod(0o777)
    elif problem == "not-root-owned":
        os.chown(real, 65534, 65534)
    else:
        homes = Path("real")
    before = _snapshot()
    with pytest.raises(StateError, match="homes dir"):
        create_user(uids(), homes_dir=homes)
    _assert_etc_as(before)


@pytest.mark.needs_root
def test_existing_home_is_refused_and_leaves_no_lines(uids: NewUid, homes: Path) -> None:
    uid = uids()
    (homes / user_name(uid)).mkdir()
    before = _snapshot()
    with pytest.raises(StateError, match="already exists"):
        create_user(uid, homes_dir=homes)
    _assert_etc_as(before)
    (homes / user_name(uid)).rmdir()


@pytest.mark.needs_root
def test_home_replaced_by_link_to_etc_is_refused(uids: NewUid, homes: Path) -> None:
    user = create_user(uids(), homes_dir=homes)
    shutil.rmtree(user.home)
    Path(user.home).symlink_to("/etc")
    etc_before = sorted(os.listdir("/etc"))
    with pytest.raises(StateError, match="is a link"):
        remove_user(user)
    assert sorted(os.listdir("/etc")) == etc_before
    assert _lines_naming(user.name)  # nothing removed: the person looks first


@pytest.mark.needs_root
def test_links_inside_home_are_removed_not_followed(
    uids: NewUid, homes: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    user = create_user(uids(), homes_dir=homes)
    (Path(user.home) / "dir").mkdir()
    (Path(user.home) / "dir" / "to-outside").symlink_to(outside)
    (Path(user.home) / "file-link").symlink_to(outside / "precious")
    os.link(outside / "precious", Path(user.home) / "hardlink")
    remove_user(user)
    assert (outside / "precious").read_text() == "keep"
    assert not Path(user.home).exists()


@pytest.mark.needs_root
def test_mount_under_home_is_refused(uids: NewUid, homes: Path) -> None:
    user = create_user(uids(), homes_dir=homes)
    mount_point = Path(user.home) / "mnt"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(mount_point)], check=True)
    try:
        (mount_point / "data").write_text("on another filesystem")
        with pytest.raises(StateError, match="mounted"):
            remove_user(user)
        assert (mount_point / "data").exists()
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


@pytest.mark.parametrize("uid", [0, 1, 999, 65534])
def test_killing_root_or_system_uids_is_refused(uid: int) -> None:
    with pytest.raises(StateError, match="cannot be a sandbox's"):
        kill_uid_processes(uid)


# --- processes ------------------------------------------------------------------------------


@pytest.mark.needs_root
def test_kill_ends_a_process_of_the_uid_and_spares_others(
    uids: NewUid, procs: list[subprocess.Popen[bytes]]
) -> None:
    uid, other = uids(), uids()
    target = _start_as(uid, ["sleep", "1000"], procs)
    bystander = _start_as(other, ["sleep", "1000"], procs)
    assert kill_uid_processes(uid) == 1
    assert target.wait(timeout=5) == -9
    assert bystander.poll() is None
    assert kill_uid_processes(uid) == 0


@pytest.mark.needs_root
def test_kill_finds_a_double_forked_process(
    uids: NewUid, procs: list[subprocess.Popen[bytes]]
) -> None:
    uid = uids()
    shell = _start_as(uid, ["sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!"], procs)
    assert shell.stdout is not None
    orphan = int(shell.stdout.readline())
    shell.wait(timeout=5)
    assert _live_pids_of(uid) == [orphan]
    assert kill_uid_processes(uid) == 1
    assert _live_pids_of(uid) == []


@pytest.mark.needs_root
def test_kill_catches_processes_forked_while_killing(
    uids: NewUid, procs: list[subprocess.Popen[bytes]]
) -> None:
    uid = uids()
    _start_as(uid, ["sh", "-c", "for i in $(seq 300); do sleep 1000 & done; wait"], procs)
    time.sleep(0.02)
    assert kill_uid_processes(uid) >= 1
    assert _live_pids_of(uid) == []


@pytest.mark.needs_root
def test_remove_kills_a_running_process_first(
    uids: NewUid, homes: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    user = create_user(uids(), homes_dir=homes)
    sleeper = _start_as(user.uid, ["sleep", "1000"], procs)
    remove_user(user)
    assert sleeper.wait(timeout=5) == -9
    assert not _lines_naming(user.name)


# --- concurrency and the shared lock --------------------------------------------------------

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
    assert len(_lines_naming(user_name(uid))) == 2


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
        before = _snapshot()
        with pytest.raises(StateError, match="stayed locked"):
            create_user(uids(), homes_dir=homes)
        _assert_etc_as(before)
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


# --- file edits, byte for byte --------------------------------------------------------------


@pytest.mark.parametrize(
    ("original", "expected"),
    [
        (b"a:x:1:\n", b"a:x:1:\nlnk-sbx-5000:*:5000:\n"),
        (b"a:x:1:", b"a:x:1:\nlnk-sbx-5000:*:5000:\n"),  # missing trailing newline
        (b"", b"lnk-sbx-5000:*:5000:\n"),
        (b"a:x:1:\n\nb:x:2:\n", b"a:x:1:\n\nb:x:2:\nlnk-sbx-5000:*:5000:\n"),
    ],
)
def test_adding_keeps_every_other_byte(
    original: bytes, expected: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_users, "_refuse_taken", lambda uid: None)  # not reading /etc
    add = host_users._with_user(HostUser("lnk-sbx-5000", 5000, 5000, "/h/lnk-sbx-5000"))
    assert add(host_users.GROUPS_FILE, original) == expected


@pytest.mark.parametrize(
    ("original", "expected"),
    [
        (b"a:x:1:\nlnk-sbx-5000:*:5000:\nb:x:2:\n", b"a:x:1:\nb:x:2:\n"),
        (b"a:x:1:\nlnk-sbx-5000:*:5000:", b"a:x:1:\n"),
        (b"lnk-sbx-5000:*:5000:\n", b""),
        (b"a:x:1:\n\xff\xfe:x:9:\n", b"a:x:1:\n\xff\xfe:x:9:\n"),  # nothing to remove: unchanged
        (b"a:x:1:\n\nlnk-sbx-50000:*:50000:\n", b"a:x:1:\n\nlnk-sbx-50000:*:50000:\n"),
    ],
)
def test_removing_keeps_every_other_byte(original: bytes, expected: bytes) -> None:
    drop = host_users._without_user(HostUser("lnk-sbx-5000", 5000, 5000, ""))
    assert drop(host_users.GROUPS_FILE, original) == expected


def test_removing_a_line_with_our_name_but_another_uid_is_refused() -> None:
    drop = host_users._without_user(HostUser("lnk-sbx-5000", 5000, 5000, ""))
    with pytest.raises(StateError, match="not for uid 5000"):
        drop(host_users.GROUPS_FILE, b"lnk-sbx-5000:*:0:\n")


# --- speed ----------------------------------------------------------------------------------


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


def test_exports() -> None:
    assert sorted(host_users.__all__) == sorted(set(host_users.__all__))
    for name in host_users.__all__:
        assert hasattr(host_users, name), name


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
