"""`launch.say_note`: the note goes on the program's stderr before the program exists, as one
line; a stream with no room for it now, or none at all, gets nothing and never holds the
launch (the caller's stream is theirs: a full pipe they do not read must not stall it)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator

import pytest

from lnk_controller.launch import say_note
from lnk_controller.sandbox_plan import cwd_note


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    try:
        yield r, w
    finally:
        os.close(r)
        os.close(w)


def test_the_note_is_one_line_on_the_stream(pipe: tuple[int, int]) -> None:
    r, w = pipe
    note = cwd_note("/home/u/proj", "/home/s")
    say_note(w, note)
    assert os.read(r, 65536) == note.encode() + b"\n"


def test_no_note_writes_nothing(pipe: tuple[int, int]) -> None:
    r, w = pipe
    say_note(w, "")
    os.set_blocking(r, False)
    with pytest.raises(BlockingIOError):
        os.read(r, 1)


def test_a_full_pipe_gets_nothing_and_the_launch_does_not_wait(pipe: tuple[int, int]) -> None:
    r, w = pipe
    os.set_blocking(w, False)
    with pytest.raises(BlockingIOError):
        while True:
            os.write(w, b"x" * 4096)
    os.set_blocking(w, True)  # as the caller's may be: a write would block forever
    assert fcntl.fcntl(w, fcntl.F_GETFL) & os.O_NONBLOCK == 0
    say_note(w, cwd_note("/home/u/proj", "/home/s"))  # returns: the test's own timeout is the proof
    os.set_blocking(r, False)
    kept = b""
    with pytest.raises(BlockingIOError):
        while chunk := os.read(r, 65536):
            kept += chunk
    assert set(kept) == {ord("x")}  # only what was there


def test_a_stream_that_is_gone_is_no_error() -> None:
    r, w = os.pipe()
    os.close(r)
    say_note(w, "lnk: note: x")  # EPIPE (SIGPIPE is ignored by Python): nothing raised
    os.close(w)
    say_note(w, "lnk: note: x")  # not a descriptor any more
