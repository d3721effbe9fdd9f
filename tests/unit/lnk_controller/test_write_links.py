"""Where a sandbox may make symbolic links: its private places only, never a write grant."""

from __future__ import annotations

import pytest

from lnk_controller.write_links import symlink_places

PRIVATE = ["/tmp", "/dev/shm", "/home/lnk-s1", "/dev"]


@pytest.mark.parametrize(
    ("grants", "unsafe", "expected"),
    [
        ([], False, ["/dev", "/dev/shm", "/home/lnk-s1", "/tmp"]),
        (["/home/owner/project/out"], False, ["/dev", "/dev/shm", "/home/lnk-s1", "/tmp"]),
        # A grant below a private place would inherit its right: that place loses it.
        (["/tmp/build"], False, ["/dev", "/dev/shm", "/home/lnk-s1"]),
        (["/tmp"], False, ["/dev", "/dev/shm", "/home/lnk-s1"]),
        (["/tmpfoo"], False, ["/dev", "/dev/shm", "/home/lnk-s1", "/tmp"]),
        (["/dev/shm/x"], False, ["/home/lnk-s1", "/tmp"]),
        # A grant above a private place is not given the place's right (rights go downward).
        (["/home"], False, ["/dev", "/dev/shm", "/home/lnk-s1", "/tmp"]),
        (
            ["/home/owner/out"],
            True,
            ["/dev", "/dev/shm", "/home/lnk-s1", "/home/owner/out", "/tmp"],
        ),
    ],
)
def test_symlink_places(grants: list[str], unsafe: bool, expected: list[str]) -> None:
    assert symlink_places(PRIVATE, grants, unsafe=unsafe) == expected


def test_no_write_grant_is_ever_a_symlink_place() -> None:
    grants = ["/home/o/a", "/home/o/a/b", "/srv/x"]
    assert not set(symlink_places(PRIVATE, grants)) & set(grants)
