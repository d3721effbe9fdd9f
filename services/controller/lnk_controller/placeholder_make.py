"""Making one write grant's placeholders as the owner would, and sealing them: the syscalls,
with no record and no plan (placeholders.py records what this made, and decides what to make).

Each placeholder is made under a folder walked down to from the grant's descriptor, every step
`O_NOFOLLOW` (no link swapped in leads elsewhere), with this thread's file ids switched to the
owner's once for all of them; root's fallback makes only those the owner was refused in a folder
of the owner's own (a `.git` it made 0555, which the sandbox could chmod and write).

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

from lnk_controller.as_caller import CallerCredentials, caller_credentials

__all__ = ["FS_IMMUTABLE_FL", "make_all_as_owner", "make_as_owner", "set_immutable"]

Entry = tuple[str, bytes | None]  # (path under the grant, content: None for an empty folder)

# FS_IOC_SETFLAGS/GETFLAGS (the `long` ioctls of linux/fs.h) and FS_IMMUTABLE_FL: a
# placeholder nobody but root may remove, rename or fill while its sandbox runs (the kernel
# drops the sandbox's cover when the name is removed from the host's side).
FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_IMMUTABLE_FL = 0x00000010
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _make_placeholder(parent_fd: int, name: str, content: bytes | None) -> int:
    """Make one placeholder (an empty folder, or a file holding `content`) under `parent_fd`;
    return it open."""
    if content is None:
        os.mkdir(name, 0o555, dir_fd=parent_fd)
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    create = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, create, 0o444, dir_fd=parent_fd)
    try:
        os.write(fd, content)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
    """`make_as_owner` for each (entry, content), yielded as made: (entry, its fd and its
    parent's, or None). One switch to the owner's credentials for all of them (a dozen raw
    syscalls each way, against ~49 placeholders for an empty folder), then root's fallback for
    those the owner was refused. The consumer runs between two yields with this thread's file
    ids the owner's: it only records what was made."""
    refused: list[Entry] = []
    with caller_credentials(caller) if caller is not None else contextlib.nullcontext():
        for entry, content in entries:
            parent, _, name = entry.rpartition("/")
            try:
                opened = _make_walking(dir_fd, parent, name, content)
            except PermissionError:
                if caller is None:
                    raise
                refused.append((entry, content))
                continue
            yield entry, opened
    for entry, content in refused:
        parent, _, name = entry.rpartition("/")
        owned = _folders_owned_by(dir_fd, parent, owner_uid)
        yield entry, _make_walking(dir_fd, parent, name, content) if owned else None


def _make_walking(dir_fd: int, parent: str, name: str, content: bytes | None) -> tuple[int, int]:
    """Walk from `dir_fd` down to `parent`, then make the placeholder `name` there: (its fd,
    its parent's)."""
    parent_fd = os.dup(dir_fd)
    for part in parent.split("/") if parent else ():  # each step O_NOFOLLOW, not only the
        try:  # last: a `.git` swapped for a link must not lead root's fallback elsewhere
            below = os.open(part, _DIR_FLAGS, dir_fd=parent_fd)
        finally:
            os.close(parent_fd)
        parent_fd = below
    try:
        return _make_placeholder(parent_fd, name, content), parent_fd
    except BaseException:
        os.close(parent_fd)
        raise


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
