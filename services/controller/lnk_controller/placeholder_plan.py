"""Which of a write grant's placeholders are made before its sandbox starts, and which while it
starts held (the confiner waits for the controller's release before the program runs).

A placeholder sealed by FS_IMMUTABLE_FL needs no bind of the wall's (staging.py), so nothing of
bwrap's command line depends on it: bwrap and the confiner can start while the controller makes
it, provided the program is released only once every one is made, sealed and checked. One that
does not seal needs a bind, which must be on bwrap's command line before it starts. Whether the
flag takes is the filesystem's answer, so it is asked, not guessed from a filesystem's name: the
first placeholder under each folder (the grant's top, its `.git`) is made and sealed before the
start (`probes`); where it sealed, the others under that folder are made on a worker from then
on, while the staging goes on and bwrap starts (`held`), and where it did not, before the start
as always, each keeping its bind.

What this does NOT decide: a held placeholder that fails to seal all the same (its name swapped
between its `mkdir` and the flag, or a folder below it on another filesystem) is not given a bind
after the fact; the launch is refused before the program is released (placeholders.make_held).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

__all__ = ["HeldPlaceholders", "WriteGrant", "parent_of", "split_probes"]

Entry = tuple[str, bytes | None]  # (path under the grant, content: None for an empty folder)


@dataclass(frozen=True)
class WriteGrant:
    """A write grant whose placeholders are made: its real path, the owner's descriptor of it,
    its staged mount ("" for none), and the owner's ids they are made with."""

    folder: str
    source_fd: int
    staged: str
    owner_uid: int
    owner_gid: int


@dataclass(frozen=True)
class HeldPlaceholders:
    """A write grant's placeholders left for a held start, and their making when it was begun
    at staging (each path with whether it sealed), or None when `make_held` is to make them."""

    grant: WriteGrant
    entries: tuple[Entry, ...]
    making: Future[list[tuple[str, bool]]] | None = None


def parent_of(entry: str) -> str:
    """The folder under the grant that holds `entry` ("" for the grant's top)."""
    return entry.rpartition("/")[0]


def split_probes(entries: list[Entry]) -> tuple[list[Entry], list[Entry]]:
    """(the first entry under each folder, the rest) of `entries`, each in its order."""
    seen: set[str] = set()
    probes: list[Entry] = []
    rest: list[Entry] = []
    for entry in entries:
        parent = parent_of(entry[0])
        (rest if parent in seen else probes).append(entry)
        seen.add(parent)
    return probes, rest
