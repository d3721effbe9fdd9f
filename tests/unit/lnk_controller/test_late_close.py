"""A removed placeholder's descriptor is closed later (late_close), its name never: the name is
gone when remove_placeholder returns, and the descriptor it held is closed by the closing
thread, which wait_closed waits for."""

from __future__ import annotations

import os
from pathlib import Path

from lnk_controller import late_close
from lnk_controller.placeholders import PLACEHOLDER, remove_placeholder


def record(path: Path) -> str:
    info = os.lstat(path)
    return f"{PLACEHOLDER}{info.st_dev}:{info.st_ino}:{path}"


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_descriptor_handed_over_is_closed_by_wait_closed() -> None:
    read_end, write_end = os.pipe()
    try:
        late_close.close_later(write_end)
        late_close.wait_closed()
        assert os.read(read_end, 1) == b""  # end of stream: the write end's last fd closed
    finally:
        os.close(read_end)


def test_several_descriptors_are_all_closed() -> None:
    pipes = [os.pipe() for _ in range(8)]
    try:
        for _, write_end in pipes:
            late_close.close_later(write_end)
        late_close.wait_closed()
        assert all(os.read(read_end, 1) == b"" for read_end, _ in pipes)
    finally:
        for read_end, _ in pipes:
            os.close(read_end)


def test_a_removed_folder_placeholder_is_gone_at_return_and_its_fd_closed_later(
    tmp_path: Path,
) -> None:
    before = open_fds()
    path = tmp_path / ".vscode"
    path.mkdir(mode=0o555)
    remove_placeholder(record(path))
    assert not os.path.lexists(path)  # the name, at once: nothing waits on the closing thread
    late_close.wait_closed()
    assert open_fds() == before


def test_a_removed_file_placeholder_is_gone_at_return_and_its_fd_closed_later(
    tmp_path: Path,
) -> None:
    before = open_fds()
    path = tmp_path / "commondir"
    path.write_bytes(b".\n")
    remove_placeholder(record(path))
    assert not os.path.lexists(path)
    late_close.wait_closed()
    assert open_fds() == before


def test_a_placeholder_kept_is_closed_at_once(tmp_path: Path) -> None:
    """One someone filled stays, and its descriptor is not handed over: closed before return."""
    late_close.wait_closed()
    before = open_fds()
    path = tmp_path / ".vscode"
    path.mkdir()
    (path / "settings.json").write_text("{}")
    remove_placeholder(record(path))
    assert (path / "settings.json").read_text() == "{}"
    assert open_fds() == before
