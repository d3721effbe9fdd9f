"""A stop event a blocking wait can watch with the socket it serves: a `threading.Event`
whose `set` also makes its descriptor readable, so a loop waits in one `select` on both (no
timeout) instead of waking every fraction of a second to look at the event.

`set` may be called from a signal handler (it runs in the main thread between bytecodes; a
`select` the signal interrupted is retried by Python after the handler, and finds the byte).
"""

from __future__ import annotations

import contextlib
import os
import threading

__all__ = ["WakingEvent"]


class WakingEvent(threading.Event):
    """`threading.Event`, readable at `fileno()` once set (until `close`)."""

    def __init__(self) -> None:
        super().__init__()
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def fileno(self) -> int:
        return self._read

    def set(self) -> None:
        super().set()
        with contextlib.suppress(BlockingIOError, OSError):  # full: readable already; closed
            os.write(self._write, b"\0")

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)
