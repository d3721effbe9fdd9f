"""The paths written into a key's forced command (the spec, the folder, the box's run dir), and
the root-owned folders the gate trusts.

A path on an `authorized_keys` line is read twice by programs that split words: sshd's option
parser (inside `command="..."`) and the box user's `/bin/sh -c`. Rather than quote for both,
such a path may hold only characters that mean nothing to either: letters, digits and
`/ . _ + , = @ : -`, absolute and normalized (no `.`/`..` segment, no `//`, no trailing `/`).

What this does NOT do: check what the spec opens (the controller judges it at each session).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from lnk_shared.errors import RefusedError

__all__ = [
    "GatePathRefused",
    "UnsafeFolderRefused",
    "check_line_path",
    "check_root_owned_path",
]

_SAFE = re.compile(r"^/[A-Za-z0-9/._+,=@:-]*$")
# Named in the refusal for the characters people are most likely to try.
_NAMED = {
    '"': "a double quote",
    "\\": "a backslash",
    "$": "a dollar sign",
    "`": "a backtick",
    ";": "a semicolon",
    "\n": "a line break",
    "\r": "a carriage return",
    "\x00": "a NUL byte",
}


class GatePathRefused(RefusedError):
    rule = "gate-path"


class UnsafeFolderRefused(RefusedError):
    """A folder the gate trusts (keys, the box's run dir) that someone but root could change."""

    rule = "gate-folder"


def check_line_path(text: str, what: str) -> str:
    """`text` as it may stand on a forced command line, or a refusal naming what is wrong."""
    label = f"{what} {text!r}"
    if not text.startswith("/"):
        raise GatePathRefused(label, "it must be an absolute path (starting with /)")
    for char, name in _NAMED.items():
        if char in text:
            raise GatePathRefused(label, f"it holds {name}")
    if any(c.isspace() for c in text):
        raise GatePathRefused(label, "it holds whitespace")
    if ".." in text.split("/"):
        raise GatePathRefused(label, "it holds a `..` segment")
    if (text != "/" and os.path.normpath(text) != text) or text.startswith("//"):
        raise GatePathRefused(
            label, f"it is not normalized: write it as {os.path.normpath(text)!r}"
        )
    if not _SAFE.fullmatch(text):
        raise GatePathRefused(
            label, "it may hold only letters, digits and / . _ + , = @ : - on a key's line"
        )
    return text


def check_root_owned_path(path: Path, what: str) -> None:
    """Refuse unless `path` and every folder above it is root's and writable by root only:
    anyone else who could rename a folder on the way could put their own in its place."""
    for depth in range(1, len(path.parts) + 1):
        current = Path(*path.parts[:depth])
        try:
            info = os.lstat(current)
        except OSError as exc:
            raise UnsafeFolderRefused(f"{what} {path}", f"{current}: {exc.strerror}") from None
        if stat.S_ISLNK(info.st_mode):
            raise UnsafeFolderRefused(f"{what} {path}", f"{current} is a link")
        if info.st_uid != 0:
            raise UnsafeFolderRefused(
                f"{what} {path}", f"{current} is owned by uid {info.st_uid}, not root"
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafeFolderRefused(
                f"{what} {path}", f"{current} is writable by others than root"
            )
