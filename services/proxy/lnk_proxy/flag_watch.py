"""The sandboxes' stop and pause flags, known without a `stat` per request: an inotify watch on
the flags folder says which names changed, and the server reads a sandbox's flags again only
then (two `stat`s, each a raised FileNotFoundError, were a twentieth of a small request's CPU).

Exact, not a cache with an age: the kernel queues an inotify event inside the syscall that
makes, removes, renames or re-permissions a name (before it returns to the controller), and
the server asks `FlagWatch.pending` (one `poll` with no wait) before every decision, so a
decision taken after the controller's `set_flag` returned sees the flag exactly as a `stat`
would. What forgets every sandbox's flags: a full queue (`IN_Q_OVERFLOW`), a change to the
folder itself (its mode: a `stat` could now fail, which counts as set) and the folder being
moved, removed or unmounted, after which the watch is gone (`armed` is False) and the server
reads the flags by path on every request, as without a watch, until `arm` succeeds again
(the folder may also not exist yet: the controller makes it with the first flag).

Does NOT: follow a flag that is a symbolic link to its target (the server reads such a flag by
path on every request instead: `watches._flag_state`), nor see the folder's parents replaced
(only root can: the watch stays on the folder it found).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from pathlib import Path

from lnk_shared.errors import StateError

__all__ = ["EVERYTHING", "FlagWatch"]

IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
IN_ATTRIB = 0x004
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
# A name made, removed, renamed or re-permissioned; the folder itself changed or went away.
WATCHED = IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
WATCHED |= IN_DELETE_SELF | IN_MOVE_SELF
GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED  # the watch ends
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
READ_SIZE = 64 * 1024  # a few thousand events per read; a burst past the queue is an overflow
EVERYTHING = None  # what `drain` says when any flag may have changed


class FlagWatch:
    """One inotify instance watching `folder` (call `arm`; `close` last)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._libc = ctypes.CDLL(None, use_errno=True)
        fd: int = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise StateError(
                f"cannot start an inotify watch for the flags ({os.strerror(code)}): raise "
                "fs.inotify.max_user_instances, or the proxy reads the flags on every request"
            )
        self._fd = fd
        self._wd = -1

    @property
    def armed(self) -> bool:
        return self._wd >= 0

    def fileno(self) -> int:
        return self._fd

    def arm(self) -> bool:
        """Watch the folder if it exists and may be read; whether the watch is on. The
        caller reads every flag again after a watch starts (changes before it were not seen)."""
        if self._wd >= 0:
            return True
        path = os.fsencode(self.folder)
        wd: int = self._libc.inotify_add_watch(self._fd, path, WATCHED | IN_ONLYDIR)
        if wd < 0:
            code = ctypes.get_errno()
            if code not in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):
                raise OSError(code, f"inotify_add_watch {self.folder}: {os.strerror(code)}")
            return False
        self._wd = wd
        return True

    def drain(self) -> set[str] | None:
        """Read every queued event: the names that changed, or `EVERYTHING` (None) when any
        flag may have (an overflow, the folder's own change; the watch may have ended)."""
        names: set[str] = set()
        everything = False
        while True:
            try:
                data = os.read(self._fd, READ_SIZE)
            except (BlockingIOError, InterruptedError):
                break
            offset = 0
            while offset + EVENT.size <= len(data):
                wd, mask, _, length = EVENT.unpack_from(data, offset)
                name = data[offset + EVENT.size : offset + EVENT.size + length].rstrip(b"\0")
                offset += EVENT.size + length
                if mask & IN_Q_OVERFLOW or (mask & IN_ATTRIB and not name):
                    everything = True
                if wd == self._wd and mask & GONE:
                    if mask & IN_MOVE_SELF:  # the kernel would keep watching it elsewhere
                        self._libc.inotify_rm_watch(self._fd, wd)
                    self._wd = -1  # this watch is over (IN_IGNORED follows)
                    everything = True
                if name and not mask & IN_ISDIR:
                    names.add(os.fsdecode(name))
        return EVERYTHING if everything else names

    def close(self) -> None:
        os.close(self._fd)
        self._wd = -1
