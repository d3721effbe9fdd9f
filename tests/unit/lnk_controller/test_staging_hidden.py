"""Covering the box's folders inside a grant (`staging.hidden_mount_points`), as the caller: a
protected path it cannot see answers as a missing one, a missing one under its home is made by
it (its own, 0700), and one it could not make refuses the launch with nothing made. Real files,
a real change of this thread's file credentials: root only."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_controller.as_caller import CallerCredentials
from lnk_controller.staging import hidden_mount_points
from lnk_shared.errors import LaunchRefused

pytestmark = pytest.mark.needs_root

NOBODY = CallerCredentials(65534, 65534, ())


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder every user may search (pytest's own is root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="lnk-hidden-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _home(base: Path, owner: int = NOBODY.uid) -> Path:
    home = base / "home"
    home.mkdir(mode=0o755)
    os.chown(home, owner, owner)
    return home


@pytest.mark.parametrize("there", [True, False])
def test_a_path_the_caller_cannot_search_answers_as_a_missing_one(base: Path, there: bool) -> None:
    home = _home(base)
    private = base / "private"
    private.mkdir(mode=0o700)  # root's
    if there:
        (private / "settings").mkdir()
    hidden = (str(private / "settings"),)
    assert hidden_mount_points(hidden, home=str(home), caller=NOBODY) == ()
    assert os.listdir(private) == (["settings"] if there else [])


def test_a_missing_folder_under_the_home_is_made_by_the_caller(base: Path) -> None:
    home = _home(base)
    wanted = str(home / "Link" / "History")
    assert hidden_mount_points((wanted,), home=str(home), caller=NOBODY) == (wanted,)
    for path in (home / "Link", home / "Link" / "History"):
        info = os.lstat(path)
        assert stat.S_ISDIR(info.st_mode)
        assert (info.st_uid, info.st_gid) == (NOBODY.uid, NOBODY.gid)
        assert stat.S_IMODE(info.st_mode) == 0o700


def test_a_home_the_caller_cannot_write_is_refused_and_left_as_it_was(base: Path) -> None:
    home = _home(base, owner=0)  # root's, 0755: the caller could make nothing in it
    wanted = str(home / ".lnk")
    with pytest.raises(LaunchRefused, match=r"cannot make it \(Permission denied\)"):
        hidden_mount_points((wanted,), home=str(home), caller=NOBODY)
    assert os.listdir(home) == []


def test_a_link_on_the_way_is_refused_and_nothing_is_made_where_it_points(base: Path) -> None:
    home = _home(base)
    elsewhere = base / "elsewhere"
    elsewhere.mkdir(mode=0o777)
    (home / "Link").symlink_to(elsewhere)
    os.lchown(home / "Link", NOBODY.uid, NOBODY.gid)
    with pytest.raises(LaunchRefused, match="no link"):
        hidden_mount_points((str(home / "Link" / "History"),), home=str(home), caller=NOBODY)
    assert os.listdir(elsewhere) == []


def test_nothing_to_cover_looks_nothing_up(base: Path) -> None:
    # A launch without folders covers nothing: not even the home is looked up (one that is
    # not there is not an error), and no credentials are switched.
    assert hidden_mount_points((), home=str(base / "no-such-home"), caller=NOBODY) == ()
