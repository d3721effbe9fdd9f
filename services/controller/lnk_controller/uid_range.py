"""Which host ids a sandbox may get, and what its host user is called: pure decisions, no I/O.

`host_users` does the I/O (passwd, group, homes, processes) and calls these. Trusts its inputs
to be what the caller read from /etc or NSS and the controller's records; decides nothing
about what those ids may do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

from lnk_shared.errors import StateError

__all__ = [
    "NAME_PREFIX",
    "HostUser",
    "UidRange",
    "allocate_uid",
    "check_uid",
    "range_conflicts",
    "user_name",
]

NAME_PREFIX = "lnk-sbx-"  # with a uid of at most 10 digits: 18 characters, valid for useradd
_SYSTEM_IDS_LAST = 999  # Debian: 0-99 static and 100-999 dynamic system users and groups
_SPECIAL_16BIT = (65534, 65535)  # nobody (the kernel's overflow id) and (uid16_t)-1
_UID_MAX = 2**32 - 2  # (uid_t)-1 is "no change" to setresuid, never a real id
BAD_IN_PASSWD = re.compile(r"[:\x00-\x1f\x7f]")  # ':' and newlines would forge passwd fields


def check_uid(uid: int) -> None:
    """Raise StateError unless `uid` may be a sandbox's: never root's, a system id or nobody."""
    if not _SYSTEM_IDS_LAST < uid <= _UID_MAX or uid in _SPECIAL_16BIT:
        raise StateError(
            f"uid {uid} cannot be a sandbox's: it must lie in {_SYSTEM_IDS_LAST + 1}-{_UID_MAX}"
            " and not be 65534 or 65535"
        )


def user_name(uid: int) -> str:
    """The host user name of sandbox uid `uid`."""
    check_uid(uid)
    return f"{NAME_PREFIX}{uid}"


@dataclass(frozen=True)
class UidRange:
    """The uids (and equal gids) sandboxes may get; from the controller's config."""

    first: int
    last: int

    def __post_init__(self) -> None:
        holds_special = self.first <= max(_SPECIAL_16BIT) and self.last >= min(_SPECIAL_16BIT)
        if not _SYSTEM_IDS_LAST < self.first <= self.last <= _UID_MAX or holds_special:
            raise StateError(
                f"uid range {self.first}-{self.last} is unusable: it must be non-empty, lie in"
                f" {_SYSTEM_IDS_LAST + 1}-{_UID_MAX}, and not hold 65534 or 65535"
            )

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last


@dataclass(frozen=True)
class HostUser:
    """A sandbox's host user. `home` is "" only for a group line whose passwd line is gone."""

    name: str
    uid: int
    gid: int
    home: str

    def __post_init__(self) -> None:
        if self.name != f"{NAME_PREFIX}{self.uid}" or self.gid != self.uid:
            raise StateError(
                f"{self.name} (uid {self.uid}, gid {self.gid}) is not a user lnk box made"
                f" ({NAME_PREFIX}<uid> with gid == uid): check it by hand"
            )
        check_uid(self.uid)
        home = PurePosixPath(self.home)
        if self.home and (
            not home.is_absolute()
            or home.name != self.name
            or ".." in home.parts
            or BAD_IN_PASSWD.search(self.home)
        ):
            raise StateError(f"{self.name}: home {self.home!r} is not <homes dir>/{self.name}")


def allocate_uid(uid_range: UidRange, taken: set[int]) -> int:
    """The lowest uid of `uid_range` not in `taken`: pass the recorded sandboxes' uids and
    `host_users.ids_in_use()`. `create_user` still refuses a uid taken meanwhile."""
    uid = uid_range.first
    while uid in taken:
        uid += 1
    if uid > uid_range.last:
        raise StateError(
            f"no free uid in the range {uid_range.first}-{uid_range.last}: end some sandboxes"
            " or widen the range"
        )
    return uid


def range_conflicts(uid_range: UidRange, entries: Iterable[tuple[str, str, int]]) -> list[str]:
    """One message per entry (source, name, id) whose id lies in the range under a name other
    than the lnk-sbx- name of that id; those are leftovers, for reconcile, not conflicts."""
    span = f"{uid_range.first}-{uid_range.last}"
    found = (
        f"{source}: {name} has id {i}, inside the sandbox uid range {span}"
        for source, name, i in entries
        if i in uid_range and name != f"{NAME_PREFIX}{i}"
    )
    return list(dict.fromkeys(found))
