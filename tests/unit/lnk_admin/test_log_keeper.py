"""A service's log keeper: writing past the size rotates at a line's end, the count of older
files is kept, the newest lines are in the current file, no line is lost or cut in two, a line
without its end waits for it, a failed write is counted and said later, a link in the log's
place is not followed, and the real process (its pipe on stdin) holds no deleted file, ends
with its pipe and, on SIGTERM, after writing what the pipe holds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lnk_admin.log_keeper import MAX_PARTIAL, RotatingLog

MAX = 4096
KEEP = 3


def _lines(count: int, width: int = 100) -> list[bytes]:
    return [f"{n:08d} ".encode() + b"x" * (width - 10) + b"\n" for n in range(count)]


def _files(log: Path) -> list[Path]:
    """The log's files, oldest first."""
    older = sorted(log.parent.glob(f"{log.name}.*"), key=lambda p: -int(p.suffix[1:]))
    return [*older, log]


def test_writing_past_the_size_rotates_and_keeps_the_count(tmp_path: Path) -> None:
    log = tmp_path / "controller.log"
    written = _lines(500)  # ~50 KiB: a dozen rotations of 4 KiB
    keeper = RotatingLog(log, MAX, KEEP)
    for line in written:
        keeper.write(line)
    keeper.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["controller.log", "controller.log.1", "controller.log.2", "controller.log.3"]
    for path in _files(log):
        assert 0 < path.stat().st_size <= MAX
        assert path.read_bytes().endswith(b"\n")  # rotated at a line's end
        assert path.stat().st_mode & 0o777 == 0o600
    kept = b"".join(p.read_bytes() for p in _files(log))
    assert written[-1] in log.read_bytes()  # the newest line is in the current file
    assert kept == b"".join(written)[-len(kept) :]  # in order, whole lines, none missing
    assert kept.startswith(b"0")  # a line's start


def test_chunks_cut_anywhere_still_rotate_at_lines(tmp_path: Path) -> None:
    log = tmp_path / "proxy.log"
    data = b"".join(_lines(300, width=77))
    keeper = RotatingLog(log, MAX, KEEP)
    for start in range(0, len(data), 1000):  # reads cut mid-line, as a pipe gives them
        keeper.write(data[start : start + 1000])
    keeper.close()
    kept = b"".join(p.read_bytes() for p in _files(log))
    assert kept == data[-len(kept) :]
    for path in _files(log):
        assert all(len(line) == 77 for line in path.read_bytes().splitlines(keepends=True))


def test_a_line_without_its_end_waits_for_it_and_is_written_at_close(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    keeper = RotatingLog(log, MAX, KEEP)
    keeper.write(b"whole\nhalf a ")
    assert log.read_bytes() == b"whole\n"
    keeper.write(b"line\nlast words")
    assert log.read_bytes() == b"whole\nhalf a line\n"
    keeper.close()
    assert log.read_bytes() == b"whole\nhalf a line\nlast words"


def test_a_line_with_no_end_in_sight_is_written_as_it_is(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    keeper = RotatingLog(log, 1 << 20, KEEP)
    keeper.write(b"y" * (MAX_PARTIAL + 1))
    assert log.stat().st_size == MAX_PARTIAL + 1
    keeper.close()


def test_an_existing_log_is_appended_to_and_counted(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"o" * (MAX - 10) + b"\n")
    keeper = RotatingLog(log, MAX, KEEP)
    keeper.write(b"new line past the size\n")
    keeper.close()
    assert log.read_bytes() == b"new line past the size\n"
    assert (tmp_path / "x.log.1").read_bytes().startswith(b"ooo")


def test_a_failed_write_is_counted_and_said_once_a_write_works(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    keeper = RotatingLog(folder / "x.log", 1000, KEEP)
    keeper.write(b"f" * 994 + b"\n")
    (folder / "x.log").unlink()
    folder.rmdir()
    keeper.write(b"lost line\n")  # its rotation's rename fails: the folder is gone
    assert keeper.lost == len(b"lost line\n")
    folder.mkdir()
    keeper.write(b"after\n")
    keeper.close()
    text = (folder / "x.log").read_text()
    assert "10 bytes of this service's output were lost" in text and text.endswith("after\n")


def test_a_link_in_the_logs_place_is_not_followed(tmp_path: Path) -> None:
    """The keeper runs as root: a link at the log's name must not aim its writes elsewhere."""
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    log = tmp_path / "x.log"
    log.symlink_to(target)
    keeper = RotatingLog(log, MAX, KEEP)
    keeper.write(b"a line\n")
    keeper.close()
    assert target.read_bytes() == b""
    assert keeper.lost == len(b"a line\n")


def _keeper(log: Path, max_bytes: int = MAX) -> tuple[subprocess.Popen[bytes], int]:
    read_end, write_end = os.pipe()
    process = subprocess.Popen(
        [sys.executable, "-m", "lnk_admin.log_keeper", str(log), str(max_bytes), str(KEEP)],
        stdin=read_end,
    )
    os.close(read_end)
    return process, write_end


def _deleted_files_held(pid: int, folder: Path) -> list[str]:
    """Files under `folder` that `pid` holds open though they were removed."""
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.endswith("(deleted)") and target.startswith(str(folder)):
            held.append(target)
    return held


def test_the_keeper_process_rotates_holds_no_deleted_file_and_ends_with_its_pipe(
    tmp_path: Path,
) -> None:
    log = tmp_path / "controller.log"
    process, pipe = _keeper(log)
    try:
        written = b"".join(_lines(400))
        os.write(pipe, written[: len(written) // 2])
        deadline = time.monotonic() + 10
        while not (tmp_path / "controller.log.3").exists():  # rotated past the count
            assert time.monotonic() < deadline, "no rotation"
            time.sleep(0.02)
        assert _deleted_files_held(process.pid, tmp_path) == []
        os.write(pipe, written[len(written) // 2 :])
    finally:
        os.close(pipe)
    assert process.wait(timeout=10) == 0  # its pipe ended: so does it
    kept = b"".join(p.read_bytes() for p in _files(log))
    assert kept == written[-len(kept) :] and written.endswith(log.read_bytes())
    assert not (tmp_path / "controller.log.4").exists()


def test_on_sigterm_the_keeper_writes_what_its_pipe_holds_then_ends(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    process, pipe = _keeper(log, max_bytes=1 << 20)
    try:
        os.write(pipe, b"ready\n")
        deadline = time.monotonic() + 10
        while not log.exists() or not log.read_bytes():
            assert time.monotonic() < deadline, "the keeper wrote nothing"
            time.sleep(0.02)
        process.send_signal(signal.SIGSTOP)  # what follows waits in the pipe
        os.write(pipe, b"in the pipe\n")
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGCONT)
        assert process.wait(timeout=5) == 0  # ended though a writer still holds the pipe
    finally:
        os.close(pipe)
    assert log.read_bytes() == b"ready\nin the pipe\n"


@pytest.mark.parametrize("argv", [[], ["x"], ["x", "big", "3"], ["x", "10", "-1"]])
def test_the_keeper_refuses_a_wrong_command_line(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lnk_admin.log_keeper", *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "usage" in done.stderr
