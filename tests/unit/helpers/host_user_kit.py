"""Host users as the controller's tests meet them (tests/unit/lnk_controller/test_host_users*.py):
/etc's user files read and compared byte for byte (but for other test runs' sandbox users), a
process's status, the live processes of a uid, the lines that name a user, and a process started
as a test uid. The fixtures (`homes`, `uids`: fresh test uids removed at teardown, `procs`) are in
tests/unit/lnk_controller/conftest.py."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

TEST_IDS_BASE = 3_000_000_000  # far above any real user, below (uid_t)-1
TEST_IDS_SPAN = 1_000_000_000
ETC_FILES = ("/etc/passwd", "/etc/group", "/etc/shadow", "/etc/gshadow")

NewUid = Callable[[], int]


def etc_snapshot() -> dict[str, bytes]:
    return {path: Path(path).read_bytes() for path in ETC_FILES}


def etc_names(text: bytes) -> set[bytes]:
    return {line.split(b":", 1)[0] for line in text.splitlines()}


def without_others(
    snapshot: dict[str, bytes], ours: str, other: dict[str, bytes]
) -> dict[str, bytes]:
    """`snapshot` less the lines of sandbox users that other test runs on this machine added or
    removed between it and `other` (an `lnk-` name in one of the two only, not `ours`): every
    other line, the machine's own users' included, must still match byte for byte."""
    out = {}
    for path, text in snapshot.items():
        churn = etc_names(text) ^ etc_names(other[path])
        foreign = {n for n in churn if n.startswith(b"lnk-") and n != ours.encode()}
        out[path] = b"".join(
            line for line in text.splitlines(keepends=True) if line.split(b":", 1)[0] not in foreign
        )
    return out


def assert_etc_as(before: dict[str, bytes], ours: str = "") -> None:
    """/etc's user files as they were `before`, but for other test runs' sandbox users."""
    after = etc_snapshot()
    assert without_others(after, ours, before) == without_others(before, ours, after)


def proc_status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def live_pids_of(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        status = proc_status(int(entry)) if entry.isdigit() else {}
        if status and str(uid) in status["Uid"].split()[:3] and status["State"][0] not in "ZX":
            pids.append(int(entry))
    return pids


def lines_naming(name: str) -> list[str]:
    return [
        f"{path}: {line}"
        for path in ETC_FILES
        for line in Path(path).read_text().splitlines()
        if line.split(":")[0] == name
    ]


def start_as(
    uid: int, argv: list[str], procs: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    """Start argv as uid:uid with no groups, and wait until it runs as that uid."""
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    p = subprocess.Popen([*setpriv, *argv], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    procs.append(p)
    deadline = time.monotonic() + 5
    while proc_status(p.pid).get("Uid", "").split()[:1] != [str(uid)]:
        assert time.monotonic() < deadline, "setpriv did not drop to the test uid"
        time.sleep(0.005)
    return p
