"""Sealed placeholders: one made immutable and still standing at its name needs no read-only
bind of the wall's (the kernel refuses every change to it); one whose name was swapped before
the flag was set, or whose filesystem has no flag, keeps its bind."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_controller.placeholder_make import set_immutable
from lnk_controller.placeholder_plan import WriteGrant
from lnk_controller.placeholders import (
    _placeholders,
    _sealed,
    remove_placeholder,
)
from lnk_controller.staging import _inside_binds
from lnk_controller.wall import Bind
from lnk_shared.paths import PROJECT_RUN_DOT_ENTRIES

TOP_LEVEL = sorted({entry.split("/")[0] for entry in PROJECT_RUN_DOT_ENTRIES})

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="FS_IMMUTABLE_FL needs root")


class Records:
    """The store's add_mounts, kept in memory."""

    def __init__(self) -> None:
        self.records: list[str] = []

    def add_mounts(self, sandbox_id: str, records: list[str]) -> None:
        self.records += records


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "project"
    path.mkdir()
    yield path
    for entry in path.iterdir():  # a failed test must not leave immutable entries behind
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            set_immutable(fd, False)
        finally:
            os.close(fd)


def _make(folder: Path, records: Records) -> list[tuple[str, bool]]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        grant = WriteGrant(str(folder), fd, "", os.getuid(), os.getgid())
        return _placeholders("sbx-test", records, grant)  # type: ignore[arg-type]
    finally:
        os.close(fd)


def test_every_placeholder_is_sealed_and_refuses_every_change(folder: Path) -> None:
    records = Records()
    made = _make(folder, records)
    assert sorted(os.path.basename(p) for p, _ in made) == TOP_LEVEL
    assert all(sealed for _, sealed in made)
    envrc = folder / ".envrc"
    # What a sandbox would try with no bind over it: each refused by the flag alone.
    with pytest.raises(PermissionError):
        envrc.rmdir()
    with pytest.raises(PermissionError):
        envrc.rename(folder / "aside")
    with pytest.raises(PermissionError):
        (envrc / "x").write_text("pwn")
    with pytest.raises(PermissionError):
        envrc.chmod(0o777)
    (folder / "other").mkdir()
    with pytest.raises(PermissionError):
        (folder / "other").rename(envrc)  # replace the (empty) folder by renaming over it
    for record in records.records:
        remove_placeholder(record)
    assert sorted(os.listdir(folder)) == ["other"]


def test_a_name_swapped_before_the_flag_is_not_sealed(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    os.mkdir(".envrc", 0o555, dir_fd=fd)
    made = os.open(".envrc", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    try:
        os.rename(".envrc", "aside", src_dir_fd=fd, dst_dir_fd=fd)  # the race, won
        os.mkdir(".envrc", 0o755, dir_fd=fd)
        assert set_immutable(made, True)
        assert not _sealed(os.fstat(made), fd, ".envrc")
        os.rmdir(".envrc", dir_fd=fd)
        assert not _sealed(os.fstat(made), fd, ".envrc")  # gone: not sealed either
    finally:
        set_immutable(made, False)
        os.close(made)
        os.close(fd)


def test_a_filesystem_without_the_flag_says_so() -> None:
    fd = os.open("/proc/self/status", os.O_RDONLY)
    try:
        assert set_immutable(fd, True) is False  # procfs has no FS_IMMUTABLE_FL (ENOTTY)
    finally:
        os.close(fd)


W = "/home/u/p"


@pytest.mark.parametrize(
    ("sealed", "bound"),
    [
        (frozenset(), [f"{W}/.envrc", f"{W}/.vscode"]),  # no flag: both keep their bind
        (frozenset({f"{W}/.envrc"}), [f"{W}/.vscode"]),
        (frozenset({f"{W}/.envrc", f"{W}/.vscode"}), []),
    ],
)
def test_only_unsealed_placeholders_get_a_read_only_bind(
    tmp_path: Path, sealed: frozenset[str], bound: list[str]
) -> None:
    staged = tmp_path / "g0"
    (staged / ".envrc").mkdir(parents=True)
    (staged / ".vscode").mkdir()
    (staged / ".mcp.json").write_text("{}")  # an existing entry: always bound read-only
    binds = [Bind(str(staged), W, True)]
    placeholders = frozenset({f"{W}/.envrc", f"{W}/.vscode"})
    got = _inside_binds(binds, (f"{W}/.mcp.json",), placeholders, sealed)
    assert sorted(b.dest for b in got) == sorted([f"{W}/.mcp.json", *bound])
    assert all(not b.write for b in got)
