"""A flag's state as the watches read it (`watches`): whatever cannot be checked counts as set,
and a link is read by path every time (its target's change is not the folder's)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lnk_proxy import watches


def _missing(path: Path) -> None:
    del path


def _file(path: Path) -> None:
    path.touch()


def _link_loop(path: Path) -> None:
    path.symlink_to(path)  # stat() fails with ELOOP


def _link_to_nothing(path: Path) -> None:
    path.symlink_to(path.parent / "gone")


def _link_to_file(path: Path) -> None:
    (path.parent / "there").touch()
    path.symlink_to(path.parent / "there")


@pytest.mark.parametrize(
    ("make", "state"),
    [
        (_missing, (False, False)),
        (_file, (True, False)),
        (_link_loop, (True, True)),
        (_link_to_nothing, (False, True)),
        (_link_to_file, (True, True)),
    ],
)
def test_a_flag_is_set_unless_it_is_surely_absent(
    tmp_path: Path, make: Callable[[Path], None], state: tuple[bool, bool]
) -> None:
    flag = tmp_path / "sbx-a.stop"
    make(flag)
    assert watches._flag_state(str(flag)) == state
    assert watches._flag_set(flag) is state[0]


def test_a_flag_under_a_file_is_not_set(tmp_path: Path) -> None:
    (tmp_path / "flags").touch()
    flag = tmp_path / "flags" / "sbx-a.stop"
    assert watches._flag_state(str(flag)) == (False, False)
    assert watches._flag_set(flag) is False
