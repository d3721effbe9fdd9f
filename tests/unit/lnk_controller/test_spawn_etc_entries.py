"""Which /etc entries a sandbox gets as copies and which as binds (spawn.open_etc_entries), on
real files: a regular file is copied from the descriptor opened here, a directory or a file too
large to copy is bound, anything else is left out, and no descriptor leaks on any path."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_controller.spawn import MAX_ETC_COPY_BYTES, open_etc_entries


class Hung(Exception):
    pass


def _open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


@pytest.fixture
def etc(tmp_path: Path) -> Iterator[Path]:
    """A small /etc: a file, a link to it, a directory, files just over and at the copy limit
    (sparse), a FIFO, a dangling link and a listening unix socket."""
    (tmp_path / "hosts").write_text("127.0.0.1 localhost\n")
    (tmp_path / "localtime").symlink_to(tmp_path / "hosts")
    (tmp_path / "ssl").mkdir()
    for name, size in (("huge", MAX_ETC_COPY_BYTES + 1), ("at-limit", MAX_ETC_COPY_BYTES)):
        with open(tmp_path / name, "wb") as f:
            f.truncate(size)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "sock"))
    listener.listen()
    try:
        yield tmp_path
    finally:
        listener.close()


def _paths(etc: Path, *names: str) -> tuple[str, ...]:
    return tuple(str(etc / name) for name in names)


def test_regular_files_are_copied_from_descriptors_with_their_content(etc: Path) -> None:
    binds, copies = open_etc_entries(_paths(etc, "hosts", "localtime", "at-limit"))
    try:
        assert binds == ()
        assert tuple(path for _, path in copies) == _paths(etc, "hosts", "localtime", "at-limit")
        for fd, _ in copies[:2]:  # the link is followed, as a bind follows it
            assert os.read(fd, 100) == b"127.0.0.1 localhost\n"
        assert all(not os.get_inheritable(fd) for fd, _ in copies), "only pass_fds hands them on"
    finally:
        for fd, _ in copies:
            os.close(fd)


def test_directories_and_files_over_the_limit_are_bound(etc: Path) -> None:
    before = _open_fds()
    binds, copies = open_etc_entries(_paths(etc, "ssl", "huge"))
    assert binds == _paths(etc, "ssl", "huge")
    assert copies == []
    assert _open_fds() == before


@pytest.mark.parametrize("name", ["fifo", "sock", "dangling", "missing"])
def test_anything_else_is_left_out_without_hanging_or_leaking(etc: Path, name: str) -> None:
    # A FIFO opened without O_NONBLOCK blocks until a writer comes: the alarm ends the wait
    # (with an error that is not an OSError, which the code under test would take as "missing").
    def hung(signum: int, frame: object) -> None:
        raise Hung("opening the entry hung: a launch would hang the same way")

    before = _open_fds()
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        assert open_etc_entries(_paths(etc, name)) == ((), [])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert _open_fds() == before


def test_the_order_of_the_entries_is_kept(etc: Path) -> None:
    binds, copies = open_etc_entries(_paths(etc, "ssl", "hosts", "sock", "huge", "localtime"))
    try:
        assert binds == _paths(etc, "ssl", "huge")
        assert tuple(path for _, path in copies) == _paths(etc, "hosts", "localtime")
    finally:
        for fd, _ in copies:
            os.close(fd)
