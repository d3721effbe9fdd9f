"""The caller's stdio as a sandbox gets it: a terminal or an append-only file never as it is."""

from __future__ import annotations

import errno
import fcntl
import os
import termios
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_controller.stdio_guard import (
    Passing,
    StreamKind,
    guard_stdio,
    judge_stream,
    stream_kind,
)

T, A, OTHER = StreamKind.TERMINAL, StreamKind.APPEND_FILE, StreamKind.OTHER


@pytest.mark.parametrize(
    ("index", "kind", "unsafe", "expected"),
    [
        (0, T, {}, Passing.NULL),
        (1, T, {}, Passing.PUMP),
        (2, T, {}, Passing.PUMP),
        (0, A, {}, Passing.AS_IS),  # stdin opened O_APPEND is only read
        (1, A, {}, Passing.PUMP),
        (2, A, {}, Passing.PUMP),
        (0, OTHER, {}, Passing.AS_IS),
        (1, OTHER, {}, Passing.AS_IS),
        (2, OTHER, {}, Passing.AS_IS),
        (0, T, {"unsafe_terminal": True}, Passing.AS_IS),
        (1, T, {"unsafe_terminal": True}, Passing.AS_IS),
        (1, T, {"unsafe_append": True}, Passing.PUMP),
        (1, A, {"unsafe_append": True}, Passing.AS_IS),
        (1, A, {"unsafe_terminal": True}, Passing.PUMP),
    ],
)
def test_judge_stream(
    index: int, kind: StreamKind, unsafe: dict[str, bool], expected: Passing
) -> None:
    assert judge_stream(index, kind, **unsafe) is expected


@pytest.fixture
def pty() -> Iterator[tuple[int, int]]:
    master, secondary = os.openpty()
    try:
        yield master, secondary
    finally:
        os.close(master)
        os.close(secondary)


def test_stream_kind_reads_the_kernel(pty: tuple[int, int], tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    appended = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    plain = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    try:
        assert stream_kind(pty[1]) is T
        assert stream_kind(write_end) is OTHER
        assert stream_kind(appended) is A
        assert stream_kind(plain) is OTHER
    finally:
        for fd in (read_end, write_end, appended, plain):
            os.close(fd)


def test_an_append_only_file_is_only_ever_appended_to(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"what was there\n")
    caller = os.open(log, os.O_WRONLY | os.O_APPEND)
    null = os.open(os.devnull, os.O_RDONLY)
    guarded = guard_stdio((null, caller, caller))
    try:
        sandbox_out = guarded.streams[1]
        assert guarded.streams[0] == null
        assert stream_kind(sandbox_out) is OTHER
        # The attacks a holder of the caller's descriptor could make, on what it holds now:
        fcntl.fcntl(sandbox_out, fcntl.F_SETFL, 0)  # clear O_APPEND: it has no file to clear
        with pytest.raises(OSError) as truncated:
            os.ftruncate(sandbox_out, 0)
        assert truncated.value.errno == errno.EINVAL
        with pytest.raises(OSError) as sought:
            os.pwrite(sandbox_out, b"OVER", 0)
        assert sought.value.errno == errno.ESPIPE
        os.write(sandbox_out, b"new line\n")
        os.write(guarded.streams[2], b"an error\n")
        guarded.started()  # as after the sandbox's start: the controller's copies closed
        guarded.drain()  # the sandbox's own ended with it: the pipes are at their end
    finally:
        os.close(caller)
        os.close(null)
    content = log.read_bytes()
    assert content.startswith(b"what was there\n")
    assert sorted(content.splitlines()[1:]) == [b"an error", b"new line"]


def test_a_terminal_is_never_passed_and_keeps_its_modes(pty: tuple[int, int]) -> None:
    master, secondary = pty
    before = termios.tcgetattr(secondary)
    guarded = guard_stdio((secondary, secondary, secondary))
    stdin, stdout, stderr = guarded.streams
    for fd in guarded.streams:
        assert not os.isatty(fd)
        with pytest.raises(termios.error):
            termios.tcsetattr(fd, termios.TCSANOW, [*before[:3], 0, *before[4:]])
    assert os.read(stdin, 10) == b""  # /dev/null
    os.write(stdout, b"out\n")
    os.write(stderr, b"err\n")
    guarded.started()
    guarded.drain()
    seen = b""
    while b"out" not in seen or b"err" not in seen:
        seen += os.read(master, 100)
    assert termios.tcgetattr(secondary) == before


def test_the_unsafe_switches_pass_the_callers_descriptors(
    pty: tuple[int, int], tmp_path: Path
) -> None:
    caller = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        guarded = guard_stdio((pty[1], caller, pty[1]), unsafe_terminal=True, unsafe_append=True)
        assert guarded.streams == (pty[1], caller, pty[1])
        guarded.close()
    finally:
        os.close(caller)
