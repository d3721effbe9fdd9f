"""The end-of-sandbox sweep: strip set-id and group/other write from what a sandbox left in its
write grants (belt and braces behind `seccomp_modes`).

When a sandbox has ended and every one of its processes is gone, the controller walks each of
its staged write grants (the idmapped mounts in its staging folder, before unmounting them) and:

- on every file (not a folder) whose status changed during the run (ctime at or after the
  sandbox's start), clears S_ISUID and S_ISGID;
- on every file or folder born during the run (statx's btime; the ctime where the filesystem
  keeps no birth time), also clears S_IWGRP and S_IWOTH.

It covers what the seccomp filter cannot see: group and other write that a creating call got
through a umask the sandbox cleared (`umask 0; mkdir d`), and any mode bit set by a path the
filter does not know. Folders keep their set-gid bit (inherited from a set-gid parent the owner
made: it gives no privilege). It runs as root, through descriptors: links are never followed,
each file is opened without following and checked to be the one examined before its mode
changes, and it stays on the grant's own mount. An entry whose ctime is before the start is
passed over on a plain lstat, without its statx: `stripped_mode` strips only what changed or was
born since the start, and a birth time is never after the ctime (the kernel sets the ctime at
birth and at every change, and no call sets it back), so such an entry keeps its bits anyway.
(A write grant of 100 files swept in 0.85 ms, of which the statx through ctypes was most.)

Security limitations: it does NOT stop
- anything while the sandbox runs: the bits the filter lets through (group/other write from a
  cleared umask) are on disk until the sweep, and another local user who can reach the folder
  may use them meanwhile;
- ACLs (the filter refuses every xattr write, so none is left to strip) or the owner's own
  changes: a file the owner made group-writable outside during the run loses that bit too;
- more than MAX_SWEEP_ENTRIES entries per grant: past that it stops and logs the folder;
- a sandbox whose processes could not all be killed: it is not swept (they could race it);
- an entry changed during the run while root set the wall clock back before the run's start:
  its ctime reads as older than the run, and it is passed over.
"""

from __future__ import annotations

import ctypes
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from lnk_shared.errors import StateError

__all__ = ["MAX_SWEEP_ENTRIES", "Examined", "examine", "stripped_mode", "sweep"]

log = logging.getLogger(__name__)

# Entries walked per grant at most: a large checkout (~100k files) sweeps in about a second;
# a bound keeps a huge grant from holding a clean-up for minutes.
MAX_SWEEP_ENTRIES = 500_000
SET_ID = stat.S_ISUID | stat.S_ISGID
SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH

_AT_SYMLINK_NOFOLLOW = 0x100
_STATX_BASIC_STATS = 0x7FF
_STATX_BTIME = 0x800
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


@dataclass(frozen=True)
class Examined:
    """One entry as statx saw it, without following a link."""

    mode: int  # st_mode: type and permission bits
    changed_ns: int  # ctime
    born_ns: int | None  # btime, when the filesystem keeps it
    ino: int
    dev: tuple[int, int]


def stripped_mode(entry: Examined, since_ns: int) -> int | None:
    """The permission bits `entry` should have after a sandbox that started at `since_ns`, or
    None when they stay as they are. Pure."""
    kind = stat.S_IFMT(entry.mode)
    if kind == stat.S_IFLNK:
        return None
    bits = stat.S_IMODE(entry.mode)
    new = bits
    if kind != stat.S_IFDIR and entry.changed_ns >= since_ns:
        new &= ~SET_ID
    born = entry.born_ns if entry.born_ns is not None else entry.changed_ns
    if born >= since_ns:
        new &= ~SHARED_WRITE
    return new if new != bits else None


class _Timestamp(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_uint32), ("_r", ctypes.c_int32))


class _Statx(ctypes.Structure):
    """struct statx (linux/stat.h), 256 bytes."""

    _fields_ = (
        ("mask", ctypes.c_uint32),
        ("blksize", ctypes.c_uint32),
        ("attributes", ctypes.c_uint64),
        ("nlink", ctypes.c_uint32),
        ("uid", ctypes.c_uint32),
        ("gid", ctypes.c_uint32),
        ("mode", ctypes.c_uint16),
        ("_spare0", ctypes.c_uint16),
        ("ino", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("blocks", ctypes.c_uint64),
        ("attributes_mask", ctypes.c_uint64),
        ("atime", _Timestamp),
        ("btime", _Timestamp),
        ("ctime", _Timestamp),
        ("mtime", _Timestamp),
        ("rdev_major", ctypes.c_uint32),
        ("rdev_minor", ctypes.c_uint32),
        ("dev_major", ctypes.c_uint32),
        ("dev_minor", ctypes.c_uint32),
        ("_spare", ctypes.c_uint64 * 14),
    )


_libc = ctypes.CDLL(None, use_errno=True)
_libc.statx.argtypes = (
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_int,
    ctypes.c_uint,
    ctypes.POINTER(_Statx),
)
_libc.statx.restype = ctypes.c_int


def _ns(ts: _Timestamp) -> int:
    return int(ts.tv_sec) * 1_000_000_000 + int(ts.tv_nsec)


def examine(dir_fd: int, name: str) -> Examined:
    """statx of `name` in `dir_fd`, not following a link; OSError when it is gone."""
    buf = _Statx()
    flags = _AT_SYMLINK_NOFOLLOW
    rc = _libc.statx(
        dir_fd, name.encode(), flags, _STATX_BASIC_STATS | _STATX_BTIME, ctypes.byref(buf)
    )
    if rc != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number), name)
    born = _ns(buf.btime) if buf.mask & _STATX_BTIME else None
    return Examined(
        int(buf.mode), _ns(buf.ctime), born, int(buf.ino), (buf.dev_major, buf.dev_minor)
    )


def _apply(dir_fd: int, name: str, entry: Examined, mode: int) -> None:
    """Change the mode of exactly the entry examined, opened without following a link."""
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError:
        return  # gone, a socket, or a device on this nodev mount: nothing to run or write
    try:
        info = os.fstat(fd)
        if info.st_ino == entry.ino and stat.S_IFMT(info.st_mode) == stat.S_IFMT(entry.mode):
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def sweep(root: Path, since_ns: int) -> int:
    """Strip what `stripped_mode` says below `root` (a staged write grant: a folder or one
    file); the number of entries changed. Raises StateError when `root` cannot be opened."""
    changed = 0
    seen = 0
    parent_fd = os.open(root.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        top = examine(parent_fd, root.name)
        if not stat.S_ISDIR(top.mode):
            mode = stripped_mode(top, since_ns)
            if mode is not None:
                _apply(parent_fd, root.name, top, mode)
                changed += 1
            return changed
    except OSError as exc:
        raise StateError(f"cannot sweep {root}: {exc.strerror}") from exc
    finally:
        os.close(parent_fd)
    for _folder, dirs, files, dir_fd in os.fwalk(root, follow_symlinks=False):
        for name in [*dirs, *files]:
            seen += 1
            if seen > MAX_SWEEP_ENTRIES:
                log.warning("sweep of %s stopped after %d entries", root, MAX_SWEEP_ENTRIES)
                return changed
            try:
                seen_now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            there = (os.major(seen_now.st_dev), os.minor(seen_now.st_dev))
            if there != top.dev and stat.S_ISDIR(seen_now.st_mode):
                dirs.remove(name)  # another filesystem mounted inside: not this grant's
                continue
            if seen_now.st_ctime_ns < since_ns:
                continue  # unchanged since the start: nothing to strip (see the docstring)
            try:
                entry = examine(dir_fd, name)
            except OSError:
                continue
            mode = stripped_mode(entry, since_ns)
            if mode is not None:
                _apply(dir_fd, name, entry, mode)
                changed += 1
    return changed
