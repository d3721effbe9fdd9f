"""Closing a removed placeholder's last descriptor after the clean-up, not during it.

On a filesystem mounted with `discard` (this host's ext4), freeing a folder's data block
waits for the device's discard: 2-4 ms per placeholder with the CPU idle, ~49 of them for a
write grant, most of its clean-up. The block is freed when the inode is evicted, which is at
the *last* reference's end, not at `rmdir`: a placeholder removed while its descriptor is
still open leaves the owner's folder at once (its name is gone, `ls -a`, `git clean -n -d` and
the owner's `rm -rf` see nothing of it) and the discard waits in the `close` instead. The
clean-up removes each name, then hands its descriptor here: one thread closes them one after
another, off the launch's reply.

What is left pending is only the freed inode and its block (a few KiB of free space that
`df` counts a few ms later) and, for a placeholder reached through a grant's staged mount,
that lazily detached mount, which no mount table shows. If the controller dies first, the
kernel closes its descriptors at its exit, which frees them the same way: nothing is ever
left on disk by a pending close.

What this does NOT do: make the discard cheaper (the same device time is spent, later, on
this thread), or defer anything that a person or a later launch can see: every name is
removed before the clean-up returns.
"""

from __future__ import annotations

import logging
import os
import queue
import threading

__all__ = ["close_later", "wait_closed"]

log = logging.getLogger(__name__)


class _Closer:
    """One closing thread, started at the first descriptor handed over."""

    def __init__(self) -> None:
        self.pending: queue.Queue[int] = queue.Queue()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None

    def put(self, fd: int) -> None:
        with self._guard:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._close_all, name="lnk-late-close", daemon=True
                )
                self._thread.start()
        self.pending.put(fd)

    def _close_all(self) -> None:
        while True:
            fd = self.pending.get()
            try:
                os.close(fd)
            except OSError as exc:  # the name is gone already; only the freeing is left
                log.warning("closing a removed placeholder: %s", exc.strerror)
            finally:
                self.pending.task_done()


_closer = _Closer()


def close_later(fd: int) -> None:
    """Close `fd` on the closing thread; the caller must not use it any more."""
    _closer.put(fd)


def wait_closed() -> None:
    """Return once every descriptor handed over so far is closed (for tests and shutdown)."""
    _closer.pending.join()
