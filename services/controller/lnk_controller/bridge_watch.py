"""When the store bridge has (re)started, known without asking it every second: an inotify
watch on the bridge's run folder sees its admin socket made (the bridge binds it after it has
opened again every agent socket it had open), and the reconcile runs then.

The watch is on the folder, not the socket: a socket made again is a new inode. What ends the
watch (the folder removed, moved or unmounted, or a full event queue, after which a start may
have been missed) makes `changed` say True and `armed` False; the caller then asks the bridge
on a timer as before, and `arm` is tried again each time.

Does NOT: see a bridge that was started before the watch was armed (the caller reconciles once
after every `arm`), nor tell a bridge's start from any other process binding that name (only
root and the bridge's user can write the folder).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from pathlib import Path

__all__ = ["BridgeWatch"]

IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
WATCHED = IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
LOST = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED | IN_Q_OVERFLOW
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
READ_SIZE = 16 * 1024  # a folder of two sockets: a few events at a time


class BridgeWatch:
    """One inotify instance on `folder`, for the name `socket_name` (call `arm`; `close`)."""

    def __init__(self, folder: Path, socket_name: str) -> None:
        self.folder, self._name = folder, socket_name.encode()
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd: int = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        self._wd = -1

    @property
    def armed(self) -> bool:
        return self._wd >= 0

    def fileno(self) -> int:
        """Readable when an event waits (-1: inotify could not be had: never armed)."""
        return self._fd

    def arm(self) -> bool:
        """Watch the folder if it is there; whether the watch is on."""
        if self._fd < 0 or self.armed:
            return self.armed
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(self.folder), WATCHED)
        self._wd = wd if wd >= 0 else -1
        return self.armed

    def changed(self) -> bool:
        """Read what waits: whether the socket was made, or the watch was lost (either way
        the bridge must be asked)."""
        made = False
        while True:
            try:
                data = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                return made
            except OSError as exc:
                if exc.errno != errno.EINTR:
                    raise
                continue
            offset = 0
            while offset + EVENT.size <= len(data):
                _wd, mask, _cookie, length = EVENT.unpack_from(data, offset)
                name = data[offset + EVENT.size : offset + EVENT.size + length].rstrip(b"\0")
                offset += EVENT.size + length
                if mask & LOST:
                    self._wd, made = -1, True
                elif name == self._name:
                    made = True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
