"""The owner's login PATH, judged from the profile files and the per-user bin folders, not from
the caller's current PATH."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lnk_shared.login_path import (
    MAX_MEMO_TEXT_CHARS,
    USER_BIN_DIRS,
    login_path_dirs,
    parse_path_folders,
)

HOME = "/home/owner"
DEBIAN_PROFILE = """\
# set PATH so it includes user's private bin if it exists
if [ -d "$HOME/bin" ] ; then
    PATH="$HOME/bin:$PATH"
fi

# set PATH so it includes user's private bin if it exists
if [ -d "$HOME/.local/bin" ] ; then
    PATH="$HOME/.local/bin:$PATH"
fi
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(DEBIAN_PROFILE, ["/home/owner/bin", "/home/owner/.local/bin"], id="debian"),
        pytest.param("export PATH=~/tools/bin:$PATH", ["/home/owner/tools/bin"], id="tilde"),
        pytest.param('PATH="${HOME}/x:/opt/y/bin"', ["/home/owner/x", "/opt/y/bin"], id="braces"),
        pytest.param("path+=($HOME/zbin)", ["/home/owner/zbin"], id="zsh-array"),
        pytest.param("fish_add_path ~/fbin", ["/home/owner/fbin"], id="fish"),
        pytest.param("set -gx PATH $HOME/g/bin $PATH", ["/home/owner/g/bin"], id="fish-set"),
        pytest.param("PATH=$GOPATH/bin:$PATH", [], id="other-variable-skipped"),
        pytest.param("PATH=bin:$PATH", [], id="relative-skipped"),
        pytest.param("# PATH=$HOME/commented", [], id="comment-skipped"),
        pytest.param('alias x="$HOME/notpath"', [], id="line-without-path-skipped"),
        pytest.param("PATH=$HOME/a/../b/", ["/home/owner/b"], id="normalized"),
        pytest.param("MANPATH=$HOME/man", [], id="manpath-is-not-path"),
    ],
)
def test_parse_path_folders(text: str, expected: list[str]) -> None:
    assert list(parse_path_folders(text, HOME)) == expected


def test_well_known_folders_are_judged_whatever_the_profiles_say(tmp_path: Path) -> None:
    found = login_path_dirs(os.getuid(), str(tmp_path))
    for folder in ("bin", ".local/bin", ".cargo/bin", "go/bin", ".npm-global/bin"):
        assert str(tmp_path / folder) in found
    assert len(USER_BIN_DIRS) >= 5


def test_a_profile_line_adds_its_folder_even_before_it_exists(tmp_path: Path) -> None:
    (tmp_path / ".bashrc").write_text('[ -d "$HOME/mytools" ] && PATH="$HOME/mytools:$PATH"\n')
    assert str(tmp_path / "mytools") in login_path_dirs(os.getuid(), str(tmp_path))


def test_a_profile_of_another_user_is_not_read(tmp_path: Path) -> None:
    (tmp_path / ".profile").write_text("PATH=$HOME/theirs:$PATH\n")
    os.chown(tmp_path / ".profile", 12345, 12345)
    assert str(tmp_path / "theirs") not in login_path_dirs(os.getuid(), str(tmp_path))


def test_a_linked_profile_of_the_owner_is_read(tmp_path: Path) -> None:
    (tmp_path / "dotfiles").mkdir()
    (tmp_path / "dotfiles" / "profile").write_text("PATH=$HOME/stowed:$PATH\n")
    (tmp_path / ".profile").symlink_to(tmp_path / "dotfiles" / "profile")
    assert str(tmp_path / "stowed") in login_path_dirs(os.getuid(), str(tmp_path))


def test_an_edited_profile_is_judged_anew_though_its_last_text_was_remembered(
    tmp_path: Path,
) -> None:
    """The owner adds a folder to ~/.profile between two launches, the file's size and times
    kept as they were: the next judging names the new folder (the memo is keyed by the text)."""
    profile = tmp_path / ".profile"
    profile.write_text("PATH=$HOME/aaaaa:$PATH\n")
    assert str(tmp_path / "aaaaa") in login_path_dirs(os.getuid(), str(tmp_path))
    before = profile.stat()
    profile.write_text("PATH=$HOME/bbbbb:$PATH\n")  # same length
    os.utime(profile, ns=(before.st_atime_ns, before.st_mtime_ns))
    found = login_path_dirs(os.getuid(), str(tmp_path))
    assert str(tmp_path / "bbbbb") in found
    assert str(tmp_path / "aaaaa") not in found


def test_a_profile_past_the_memo_size_is_still_parsed(tmp_path: Path) -> None:
    filler = "# " + "x" * 78 + "\n"
    text = filler * (MAX_MEMO_TEXT_CHARS // len(filler) + 1) + "PATH=$HOME/late:$PATH\n"
    assert len(text) > MAX_MEMO_TEXT_CHARS
    (tmp_path / ".bashrc").write_text(text)
    assert str(tmp_path / "late") in login_path_dirs(os.getuid(), str(tmp_path))


def test_one_text_is_parsed_per_home(tmp_path: Path) -> None:
    """The same system profile under two owners' homes names each owner's own folder."""
    text = "PATH=$HOME/tools:$PATH\n"
    for home in (tmp_path / "one", tmp_path / "two"):
        home.mkdir()
        (home / ".profile").write_text(text)
        assert str(home / "tools") in login_path_dirs(os.getuid(), str(home))
