"""A service's log under `lnk box up`: what the service (and any child of it) writes to its
stdout and stderr arrives on a pipe, and this process, the pipe's only reader and the log's
only writer, appends it to `logs/<service>.log`, rotated by size with a fixed number of older
files kept (`<service>.log.1` the newest of them). Under systemd the journal holds the output
instead and nothing here runs.

    python -m lnk_admin.log_keeper LOG_PATH MAX_BYTES KEEP     (the pipe on stdin)

Why a process of its own, not the service's logging: the services write more than their log
lines (a traceback at exit, warnings, what a child prints), all of it to descriptors 1 and 2;
a rotation inside the service would leave every one of those still open on a renamed and
finally deleted file. Only this process holds the file, so a rotation leaves no descriptor on
an old inode and loses nothing: what the service writes meanwhile waits in the pipe. And the
proxy and the store bridge, which run as their own users, could not rename files in `logs/`
(root's, 0700), nor should they own a folder root later opens files in.

A file takes the whole lines that fit in MAX_BYTES and the next file the rest, so a line is
never cut in two files; only a line longer than MAX_BYTES itself makes a file pass it (a line
without its end is held back up to MAX_PARTIAL, then written as it is). It ends when the pipe
does: every writer has exited (`lnk box down` stops the service, then waits for this). SIGTERM
makes it write what the pipe holds and end.

Does NOT: bound a writer's rate (a service that logs without end fills its KEEP + 1 files
over and over, the oldest lines going first); keep lines a full disk refused (each write that
fails is counted, and said in the file once a write works again).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
from pathlib import Path

__all__ = ["MAX_PARTIAL", "READ_BYTES", "RotatingLog", "keep", "main"]

READ_BYTES = 64 * 1024  # one pipe's worth (Linux's default pipe buffer) per read
MAX_PARTIAL = 64 * 1024  # a line without an end held back at most this long, then written as is
LOG_MODE = 0o600  # the services' output may name what a sandbox ran: root's alone


class RotatingLog:
    """The file at `path`, appended to line by line and rotated past `max_bytes`, with `keep`
    older files (`path.1` … `path.KEEP`; the oldest is dropped at a rotation)."""

    def __init__(self, path: Path, max_bytes: int, keep: int) -> None:
        if max_bytes < 1 or keep < 1:
            raise ValueError("max_bytes and keep must be at least 1")
        self.path, self.max_bytes, self.keep = path, max_bytes, keep
        self._partial = b""  # the end of the last read, after its last newline
        self._fd: int | None = None
        self._size = 0
        self.lost = 0  # bytes no write took since the last that worked
        self._why = ""

    def write(self, data: bytes) -> None:
        """Append the whole lines of what was held back plus `data`; hold the rest back."""
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        if len(data) - cut > MAX_PARTIAL:  # a line with no end in sight: written as it is
            cut = len(data)
        self._partial = data[cut:]
        if cut:
            self._append(data[:cut])

    def close(self) -> None:
        """Write what is held back (the last line, ended or not) and close the file."""
        if self._partial:
            self._partial, last = b"", self._partial
            self._append(last)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _append(self, lines: bytes) -> None:
        try:
            if self._fd is None:
                self._open()
            if self.lost:
                said = (
                    f"lnk box: {self.lost} bytes of this service's output were lost ({self._why})\n"
                )
                self.lost = 0
                self._append_now(said.encode())
            self._append_now(lines)
        except OSError as exc:
            self.lost += len(lines)
            self._why = exc.strerror or str(exc)
            if self._fd is not None:  # opened again at the next write
                os.close(self._fd)
                self._fd = None

    def _append_now(self, lines: bytes) -> None:
        """Write `lines`, each file taking the whole lines that fit, the next file the rest."""
        while lines:
            room = self.max_bytes - self._size
            if len(lines) <= room:
                piece = lines
            else:
                cut = lines.rfind(b"\n", 0, max(room, 0)) + 1
                if not cut and self._size:  # not one more whole line fits: a new file first
                    self._rotate()
                    continue
                if not cut:  # one line longer than a whole file: it gets a file of its own
                    cut = lines.find(b"\n") + 1 or len(lines)
                piece = lines[:cut]
            self._write_all(piece)
            lines = lines[len(piece) :]

    def _write_all(self, piece: bytes) -> None:
        assert self._fd is not None
        view = memoryview(piece)
        while view:
            done = os.write(self._fd, view)
            self._size += done
            view = view[done:]

    def _rotate(self) -> None:
        """`path.K-1` → `path.K` … `path` → `path.1`, then a new `path`. Each is a rename in
        the folder, so a reader sees either the old name or the new, never half a file."""
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        for n in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if os.path.lexists(older):
                os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._open()

    def _open(self) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.path, flags, LOG_MODE)
        os.fchmod(fd, LOG_MODE)
        self._fd, self._size = fd, os.fstat(fd).st_size


def keep(fd: int, log: RotatingLog, stop_fd: int | None = None) -> None:
    """Copy `fd` into `log` until its end; once `stop_fd` is readable (SIGTERM's wake-up
    byte), only what `fd` holds at that moment, then end."""
    watched = [fd] if stop_fd is None else [fd, stop_fd]
    try:
        while True:
            ready, _, _ = select.select(watched, [], [])
            if stop_fd in ready:
                break
            chunk = os.read(fd, READ_BYTES)
            if not chunk:
                return
            log.write(chunk)
        os.set_blocking(fd, False)
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(fd, READ_BYTES):
                log.write(chunk)
    finally:
        log.close()


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[1].isdigit() or not argv[2].isdigit():
        print("usage: python -m lnk_admin.log_keeper LOG_PATH MAX_BYTES KEEP", file=sys.stderr)
        return 2
    os.chdir("/")  # holds no folder of whoever started it
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # nor any descriptor it left open (a pipe's end)
    stop_r, stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(stop_w)  # SIGTERM's number lands there: the loop sees it at once
    signal.signal(signal.SIGTERM, lambda *_: None)  # handled (not the default death): drained
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the command, not this
    # Started with SIGTERM blocked (service_logs): one sent before the handler was there waits
    # until now, and is handled as any other.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    keep(0, RotatingLog(Path(argv[0]), int(argv[1]), int(argv[2])), stop_r)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
