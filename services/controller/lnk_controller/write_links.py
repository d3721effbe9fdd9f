"""Where a sandbox may make symbolic links: only in its own private places, never in a write
grant, so no link it makes lands in the owner's folders.

A link the sandbox leaves in a write grant is followed later by the owner's tools outside,
with the owner's rights: `report.txt -> ~/.ssh/authorized_keys` turns the owner's own
`echo x > report.txt` into a write of authorized_keys. Keeping links "inside" cannot be
judged: a relative target's meaning depends on where the owner's tool resolves it, and a
folder renamed later changes it. So the confiner refuses making them at all, with Landlock's
LANDLOCK_ACCESS_FS_MAKE_SYM, which is handled but granted only below the places this module
lists (the kernel also asks for it when a link is renamed or hard-linked into a folder).
Landlock rights add up along the path, so a private place with a write grant bound somewhere
below it (a grant under /tmp) is not listed either: it would give the grant MAKE_SYM too.

What this breaks in write grants, by design: tools that make links there (`python -m venv`
without `--copies`, npm's `node_modules/.bin`, pnpm, `git checkout` of a tree with links,
`ln -s`) fail with EACCES. What it does NOT stop: links the owner already had in the folder
being followed by the sandbox (as far as its own grants reach), hard links (across mounts they
are EXDEV, and within a grant both ends are the owner's), or a sandbox writing a file whose
*content* names a path (`.gitmodules`, a `.pth` file) that the owner's tools then act on.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["symlink_places"]


def _at_or_below(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def symlink_places(
    private: Iterable[str], granted_writes: Iterable[str], *, unsafe: bool = False
) -> list[str]:
    """The places the sandbox may make links in: each `private` one (its /tmp, /dev/shm, home)
    with no granted write folder at or below it; with the `unsafe` test switch, every write
    place, grants included."""
    grants = sorted(set(granted_writes))
    places = set(private)
    if unsafe:
        return sorted(places | set(grants))
    return sorted(p for p in places if not any(_at_or_below(g, p) for g in grants))
