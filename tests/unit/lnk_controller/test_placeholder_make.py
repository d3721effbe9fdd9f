"""Making placeholders, the syscalls alone (placeholders.py records and plans them): an empty
folder 0555 or a file holding its content 0444, made under the grant's descriptor with every
step of the walk refusing a link, and sealed so that not even their owner can remove them."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_controller.placeholder_make import make_all_as_owner, set_immutable

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="FS_IMMUTABLE_FL needs root")


@pytest.fixture
def grant(tmp_path: Path) -> Iterator[int]:
    (tmp_path / ".git").mkdir()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def _close_all(made: list[tuple[str, tuple[int, int] | None]]) -> None:
    for _, opened in made:
        if opened is not None:
            for fd in opened:
                os.close(fd)


def test_folders_and_files_are_made_with_their_modes_and_content(
    grant: int, tmp_path: Path
) -> None:
    entries = [(".claude", None), (".git/commondir", b".\n"), ("mise.toml", None)]
    made = list(make_all_as_owner(grant, entries, caller=None, owner_uid=0))
    try:
        assert [entry for entry, _ in made] == [".claude", ".git/commondir", "mise.toml"]
        assert all(opened is not None for _, opened in made)
        folder = os.lstat(tmp_path / ".claude")
        assert stat.S_ISDIR(folder.st_mode) and stat.S_IMODE(folder.st_mode) == 0o555
        file = os.lstat(tmp_path / ".git" / "commondir")
        assert stat.S_ISREG(file.st_mode) and stat.S_IMODE(file.st_mode) == 0o444
        assert (tmp_path / ".git" / "commondir").read_bytes() == b".\n"
        # The fds are the very entries made, and their parents'.
        for entry, opened in made:
            assert opened is not None
            assert os.fstat(opened[0]).st_ino == os.lstat(tmp_path / entry).st_ino
            assert os.fstat(opened[1]).st_ino == os.lstat((tmp_path / entry).parent).st_ino
    finally:
        _close_all(made)


def test_an_entry_already_there_is_never_taken_over(grant: int, tmp_path: Path) -> None:
    (tmp_path / ".vscode").mkdir()
    with pytest.raises(FileExistsError):
        list(make_all_as_owner(grant, [(".vscode", None)], caller=None, owner_uid=0))
    (tmp_path / ".envrc").write_text("mine")
    with pytest.raises(FileExistsError):
        list(make_all_as_owner(grant, [(".envrc", b"")], caller=None, owner_uid=0))
    assert (tmp_path / ".envrc").read_text() == "mine"


def test_a_folder_on_the_way_swapped_for_a_link_is_not_followed(grant: int, tmp_path: Path) -> None:
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    try:
        os.rmdir(tmp_path / ".git")
        (tmp_path / ".git").symlink_to(elsewhere)
        with pytest.raises(OSError):  # ELOOP or ENOTDIR: O_NOFOLLOW on each step
            list(make_all_as_owner(grant, [(".git/commondir", b".\n")], caller=None, owner_uid=0))
        assert list(elsewhere.iterdir()) == []
    finally:
        for child in elsewhere.iterdir():
            child.unlink()
        elsewhere.rmdir()


def test_a_sealed_placeholder_cannot_be_removed_until_it_is_unsealed(
    grant: int, tmp_path: Path
) -> None:
    ((entry, opened),) = list(
        make_all_as_owner(grant, [(".cursor", None)], caller=None, owner_uid=0)
    )
    assert opened is not None
    fd, parent = opened
    try:
        if not set_immutable(fd, True):
            pytest.skip("this filesystem has no FS_IMMUTABLE_FL")
        with pytest.raises(PermissionError):
            os.rmdir(tmp_path / entry)
        with pytest.raises(PermissionError):
            os.rename(tmp_path / entry, tmp_path / "moved")
        assert set_immutable(fd, False)
        os.rmdir(tmp_path / entry)
    finally:
        with contextlib.suppress(OSError):
            set_immutable(fd, False)
        os.close(fd)
        os.close(parent)
