"""Running a program on the host as another user (the tests' box owners, who launch sandboxes
with the installed `lnk`): setpriv drops root to that user's uid, gid and groups."""

from __future__ import annotations

SETPRIV = "/usr/bin/setpriv"


def as_user(uid: int, gid: int, *argv: str) -> list[str]:
    """The argv that runs `argv` as uid:gid with that user's groups."""
    return [SETPRIV, f"--reuid={uid}", f"--regid={gid}", "--init-groups", "--", *argv]
