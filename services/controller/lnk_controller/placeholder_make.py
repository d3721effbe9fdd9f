"""Making one write grant's placeholders as the owner would, and sealing them: the syscalls,
with no record and no plan (placeholders.py records what this made, and decides what to make).

Each placeholder is made under a folder walked down to from the grant's descriptor, every step
`O_NOFOLLOW` (no link swapped in leads elsewhere), with this thread's file ids switched to the
owner's once for all of them; root's fallback makes only those the owner was refused in a folder
of the owner's own (a `.git` it made 0555, which the sandbox could chmod and write).

An empty folder's placeholder is renamed in from the owner's pool where it holds one
(placeholder_pool.py, lent before the switch to the owner's ids, as only root may open the pool;
the rename itself runs under the owner's, so the kernel checks it as it would the mkdir).

The syscalls themselves are lnk_controller._placeholder_calls (ext/placeholder_calls.c) and, from
the pool, _placeholder_pool (ext/placeholder_pool.c): one call
makes a batch, one seals it, with the GIL released, on the calling thread (so under the file ids
`caller_credentials` gave it). In Python each of a placeholder's ~8 syscalls let the GIL go and
waited to take it back from the launch's thread running beside: more of a write grant's start
than the syscalls themselves (bench/README, session 12). The module is built with the package
(setup.py) and has no fallback: a controller without it does not start.

What this does NOT do: make anything in a folder of another user's (the sandbox, writing only as
the owner, cannot make the name there either); seal on a filesystem without FS_IMMUTABLE_FL
(`set_immutable` answers False and the wall's bind stands in the sandbox's way).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from lnk_controller import _placeholder_calls as calls
from lnk_controller import _placeholder_pool as pool_calls
from lnk_controller import placeholder_pool
from lnk_controller.as_caller import CallerCredentials, caller_credentials

__all__ = [
    "FS_IMMUTABLE_FL",
    "Making",
    "Opened",
    "make_all_as_owner",
    "make_as_owner",
    "make_batch_as_owner",
    "seal_all",
    "set_immutable",
]

Entry = tuple[str, bytes | None]  # (path under the grant, content: None for an empty folder)

# FS_IOC_SETFLAGS/GETFLAGS (the `long` ioctls of linux/fs.h) and FS_IMMUTABLE_FL: a
# placeholder nobody but root may remove, rename or fill while its sandbox runs (the kernel
# drops the sandbox's cover when the name is removed from the host's side).
FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_IMMUTABLE_FL = 0x00000010


@dataclass(frozen=True)
class Opened:
    """A placeholder made and open: its fd, its parent's, and who and what it was when made."""

    fd: int
    parent_fd: int
    dev: int
    ino: int
    uid: int
    gid: int


@dataclass
class Making:
    """What one `make_batch_as_owner` made, in order (None: not made, a folder of another
    user's on the way), and where it stopped: (entry, its error), or None once all were made."""

    made: list[tuple[str, Opened | None]] = field(default_factory=list)
    failed: tuple[str, OSError] | None = None


def _wire(entry: str, content: bytes | None) -> calls.Entry:
    parent, _, name = entry.rpartition("/")
    parts = tuple(os.fsencode(part) for part in parent.split("/")) if parent else ()
    return parts, os.fsencode(name), content


def _make_in_c(
    dir_fd: int, entries: list[Entry], making: Making, loan: _Lent | None = None
) -> tuple[int, list[Entry]]:
    """Make entries (placeholder_calls.c's `make`, batch by batch; with a loan, each empty folder
    lent one renamed in from the owner's pool instead: placeholder_pool.c's `take`) until one
    fails: (0, []) or (its errno, the entries from it on)."""
    for at in range(0, len(entries), calls.MAX_BATCH):
        batch = entries[at : at + calls.MAX_BATCH]
        if loan is None:
            opened, err = calls.make(dir_fd, tuple(_wire(*entry) for entry in batch))
        else:
            wire = tuple((*_wire(*e), loan.names.get(e[0])) for e in batch)
            opened, err, taken = pool_calls.take(dir_fd, loan.fd, wire)
            for (entry, _), took in zip(batch, taken, strict=False):
                if took:  # taken, or found filled in the pool: not lent again
                    loan.names.pop(entry, None)  # the rest go back
        making.made += [(e, Opened(*o)) for (e, _), o in zip(batch, opened, strict=False)]
        if err:
            return err, entries[at + len(opened) :]
    return 0, []


@dataclass
class _Lent:
    """The owner's pool open, and the pool name lent to each empty folder still to be made."""

    fd: int
    names: dict[str, bytes]


@contextlib.contextmanager
def _lent(dir_fd: int, entries: list[Entry], owner_uid: int) -> Iterator[_Lent | None]:
    """Pool names lent to the empty folders of `entries` (placeholder_pool.lend), and given back
    when the making ends, those not taken."""
    folders = [entry for entry, content in entries if content is None]
    loan = placeholder_pool.lend(owner_uid, os.fstat(dir_fd).st_dev, len(folders))
    if loan is None:
        yield None
        return
    lent = _Lent(loan.fd, dict(zip(folders, loan.names, strict=False)))
    try:
        yield lent
    finally:
        placeholder_pool.give_back(owner_uid, list(lent.names.values()))
        os.close(loan.fd)


def make_batch_as_owner(
    dir_fd: int, entries: list[Entry], *, caller: CallerCredentials | None, owner_uid: int
) -> Making:
    """Make each (entry, content) as the owner would (`make_as_owner`), in order, until one
    fails. One switch to the owner's credentials for all of them (a dozen raw syscalls each way,
    against ~49 placeholders for an empty folder), the syscalls in C on this thread (so under
    these file ids) with the GIL released; then root's fallback for those the owner was refused.
    """
    making, refused = Making(), []
    with (
        _lent(dir_fd, entries, owner_uid) as loan,
        caller_credentials(caller) if caller is not None else contextlib.nullcontext(),
    ):
        rest = entries
        while rest:
            err, rest = _make_in_c(dir_fd, rest, making, loan)
            if err in (errno.EACCES, errno.EPERM) and caller is not None:
                refused.append(rest[0])  # PermissionError: root's fallback may make it
                rest = rest[1:]
            elif err:
                making.failed = (rest[0][0], OSError(err, os.strerror(err)))
                return making
    for entry, content in refused:
        parent = entry.rpartition("/")[0]
        try:
            owned = _folders_owned_by(dir_fd, parent, owner_uid)
        except OSError as exc:
            making.failed = (entry, exc)
            return making
        if not owned:
            making.made.append((entry, None))
            continue
        err, _ = _make_in_c(dir_fd, [(entry, content)], making)
        if err:
            making.failed = (entry, OSError(err, os.strerror(err)))
            return making
    return making


def make_as_owner(
    dir_fd: int,
    parent: str,
    name: str,
    content: bytes | None,
    *,
    caller: CallerCredentials | None,
    owner_uid: int,
) -> tuple[int, int] | None:
    """Make one placeholder as the owner would (`caller_credentials`): (its fd, its parent's
    fd), or None where the owner may not make it and could not make itself able to, because a
    folder on the way is another user's (then the sandbox, which writes only as the owner,
    cannot make the name either, and root must not make anything in that user's folder).
    Where the folder in the way is the owner's own (a `.git` it made 0555), the sandbox could
    chmod it and make the name: root makes the placeholder, as the owner could have."""
    entry = f"{parent}/{name}" if parent else name
    made = make_all_as_owner(dir_fd, [(entry, content)], caller=caller, owner_uid=owner_uid)
    return next(made)[1]


def make_all_as_owner(
    dir_fd: int,
    entries: list[Entry],
    *,
    caller: CallerCredentials | None,
    owner_uid: int,
) -> Iterator[tuple[str, tuple[int, int] | None]]:
    """`make_batch_as_owner`, each made yielded: (entry, its fd and its parent's, or None);
    where it stopped, its error raised (the OSError of that syscall: FileExistsError for a
    name already there, ELOOP or ENOTDIR for a link on the way)."""
    making = make_batch_as_owner(dir_fd, entries, caller=caller, owner_uid=owner_uid)
    for entry, opened in making.made:
        yield entry, None if opened is None else (opened.fd, opened.parent_fd)
    if making.failed is not None:
        raise making.failed[1]


def seal_all(
    made: list[tuple[Opened, bytes]], owner_uid: int, owner_gid: int
) -> tuple[list[bool], OSError | None]:
    """Seal each placeholder made (placeholder_calls.c's `seal`: made the owner's, set
    FS_IMMUTABLE_FL, then whether its name, bytes under its parent, is still that inode) until
    one fails: (whether each done is sealed, the error of the next or None)."""
    sealed: list[bool] = []
    for at in range(0, len(made), calls.MAX_BATCH):
        batch = made[at : at + calls.MAX_BATCH]
        items = tuple((o.fd, o.parent_fd, name, o.dev, o.ino, o.uid, o.gid) for o, name in batch)
        done, err = calls.seal(items, owner_uid, owner_gid)
        sealed += done
        if err:
            return sealed, OSError(err, os.strerror(err))
    return sealed, None


def _folders_owned_by(dir_fd: int, parent: str, uid: int) -> bool:
    """Whether every folder from the grant's top down to `parent` is `uid`'s (lstat, no link
    followed: the walk found them as folders)."""
    path = ""
    for part in ["", *(parent.split("/") if parent else [])]:
        path = f"{path}/{part}".strip("/")
        info = os.lstat(path or ".", dir_fd=dir_fd)
        if info.st_uid != uid:
            return False
    return True


def set_immutable(fd: int, on: bool) -> bool:
    """Set or clear FS_IMMUTABLE_FL on an open placeholder; whether it now is as asked. A
    filesystem without the flag (ENOTTY, EOPNOTSUPP, EINVAL) leaves the placeholder removable
    by its owner, which only uncovers the name for the owner's own writes (the wall's bind
    over it then stands in the sandbox's way); nothing else is given up."""
    try:
        buf = bytearray(struct.pack("l", 0))
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf)
        (flags,) = struct.unpack("l", buf)
        wanted = flags | FS_IMMUTABLE_FL if on else flags & ~FS_IMMUTABLE_FL
        if wanted != flags:
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("l", wanted))
    except OSError as exc:
        if exc.errno not in (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL):
            raise
        return False
    return True
