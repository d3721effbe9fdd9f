"""A placeholder's parent is walked one step at a time without following a link: a `.git`
swapped for a link to a folder elsewhere (one that holds an `info` of its own, as
/usr/share does) never leads the placeholder there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lnk_controller import placeholder_make


def test_a_link_above_the_parent_is_not_followed(tmp_path: Path) -> None:
    grant, elsewhere = tmp_path / "grant", tmp_path / "elsewhere"
    (elsewhere / "info").mkdir(parents=True)
    grant.mkdir()
    (grant / ".git").symlink_to(elsewhere)
    fd = os.open(grant, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError):
            placeholder_make.make_as_owner(
                fd, ".git/info", "attributes", b"", caller=None, owner_uid=0
            )
    finally:
        os.close(fd)
    assert list((elsewhere / "info").iterdir()) == []


def test_a_real_parent_gets_the_placeholder(tmp_path: Path) -> None:
    (tmp_path / ".git" / "info").mkdir(parents=True)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        made = placeholder_make.make_as_owner(
            fd, ".git/info", "attributes", b"", caller=None, owner_uid=0
        )
    finally:
        os.close(fd)
    assert made is not None
    for opened in made:
        os.close(opened)
    assert (tmp_path / ".git" / "info" / "attributes").read_bytes() == b""
