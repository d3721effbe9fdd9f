"""The caller's stdin, stdout and stderr as a sandbox gets them: as they are, or with what would
let the sandbox act on the caller's side swapped for something it cannot turn against it.

Two of the descriptors a client passes reach further than the bytes they carry:

- **A terminal** (the caller's own tty, on a session without a pty: only stdin, or only
  stdout, or stderr alone is one). Whoever holds it can change its modes for everyone using
  it (`stty -echo`, raw mode) and they stay changed after the run. A session whose stdin and
  stdout are both terminals gets a pty of the controller's instead (spawn.py), so this only
  judges the others: stdin that is a terminal becomes /dev/null (a pipe pumped from the
  terminal would steal the caller's next line after the run), stdout or stderr that is one
  becomes a pipe the controller copies to the terminal.
- **An append-only regular file** (`>> log`). The sandbox holding that descriptor can clear
  O_APPEND with fcntl(F_SETFL), ftruncate it, or pwrite over what was there: no flag on the
  open file survives a holder who wants it gone, and a seccomp filter cannot follow a file
  through dup. It gets a pipe instead; the controller appends what comes out of it through the
  caller's own descriptor, so the file only ever grows.

What this does NOT stop: a sandbox writing whatever bytes it likes (escape sequences included)
to the caller's terminal or file through the pipe (they are its output); a plain `> out` file
being truncated or rewritten (the caller handed over a file to write); stdin redirected from a
file the caller opened read-write (`<> file`) being written.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import logging
import os
import stat
import threading
from dataclasses import dataclass, field

__all__ = [
    "DRAIN_TIMEOUT_S",
    "GuardedStdio",
    "Passing",
    "StreamKind",
    "guard_stdio",
    "judge_stream",
    "stream_kind",
]

log = logging.getLogger(__name__)

PUMP_CHUNK = 65536  # bytes moved per read from a sandbox's pipe to the caller's descriptor
# After the sandbox has ended (every process of its pid namespace gone, so every write end is
# closed), its pipes hold at most what the kernel buffers: draining that is immediate unless
# the caller's terminal is stopped (Ctrl-S); the exit status is not held longer than this.
DRAIN_TIMEOUT_S = 5.0
STREAMS = ("stdin", "stdout", "stderr")


class StreamKind(enum.Enum):
    TERMINAL = "terminal"
    APPEND_FILE = "append-only file"
    OTHER = "other"


class Passing(enum.Enum):
    AS_IS = "as is"
    NULL = "/dev/null"  # the sandbox reads nothing
    PUMP = "pipe"  # the controller copies the sandbox's writes to the caller's descriptor


def judge_stream(
    index: int, kind: StreamKind, *, unsafe_terminal: bool = False, unsafe_append: bool = False
) -> Passing:
    """How stream `index` (0 stdin, 1 stdout, 2 stderr) of `kind` reaches a sandbox without a
    pty. The `unsafe_…` test switches pass a terminal or an append-only file as it is."""
    if kind is StreamKind.TERMINAL and not unsafe_terminal:
        return Passing.NULL if index == 0 else Passing.PUMP
    if kind is StreamKind.APPEND_FILE and index > 0 and not unsafe_append:
        return Passing.PUMP
    return Passing.AS_IS


def stream_kind(fd: int) -> StreamKind:
    """What the descriptor is, from the kernel: a tty, a regular file opened O_APPEND, other."""
    if os.isatty(fd):
        return StreamKind.TERMINAL
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
        append = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND)
    except OSError:
        return StreamKind.OTHER
    return StreamKind.APPEND_FILE if regular and append else StreamKind.OTHER


def _pump(source: int, target: int) -> None:
    """Copy `source` (a pipe's read end) to `target` until the pipe's end; then close `source`.
    A target that fails (the caller's terminal gone) only ends the copy."""
    try:
        while chunk := os.read(source, PUMP_CHUNK):
            view = memoryview(chunk)
            while view:
                try:
                    view = view[os.write(target, view) :]
                except InterruptedError:
                    continue
    except OSError as exc:
        if exc.errno not in (errno.EIO, errno.EPIPE, errno.EBADF):
            log.info("a sandbox's output could not be copied: %s", exc)
    finally:
        os.close(source)
        os.close(target)


@dataclass
class GuardedStdio:
    """The three descriptors to give the sandbox, and the copies that serve the pipes."""

    streams: tuple[int, int, int]
    _sandbox_ends: list[int] = field(default_factory=list)
    _pumps: list[threading.Thread] = field(default_factory=list)

    def started(self) -> None:
        """The sandbox holds its ends now: close ours, so its exit ends the pipes."""
        for fd in self._sandbox_ends:
            os.close(fd)
        self._sandbox_ends.clear()

    def drain(self, timeout: float = DRAIN_TIMEOUT_S) -> None:
        """Wait for every copy to reach the end of what the sandbox wrote."""
        for pump in self._pumps:
            pump.join(timeout)
            if pump.is_alive():
                log.warning("a sandbox's output is still being copied after %.0f s", timeout)

    def close(self) -> None:
        """Undo everything (the sandbox did not start): the copies end with the pipes."""
        self.started()
        self.drain()


def guard_stdio(
    stdio: tuple[int, int, int], *, unsafe_terminal: bool = False, unsafe_append: bool = False
) -> GuardedStdio:
    """Judge each stream and set up what it needs; the caller's descriptors stay the caller's
    (the pumps write through duplicates of them)."""
    guarded = GuardedStdio(streams=stdio)
    streams = list(stdio)
    try:
        for index, fd in enumerate(stdio):
            passing = judge_stream(
                index,
                stream_kind(fd),
                unsafe_terminal=unsafe_terminal,
                unsafe_append=unsafe_append,
            )
            if passing is Passing.NULL:
                streams[index] = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                guarded._sandbox_ends.append(streams[index])
            elif passing is Passing.PUMP:
                target = os.dup(fd)
                try:
                    read_end, write_end = os.pipe2(os.O_CLOEXEC)
                except OSError:
                    os.close(target)
                    raise
                guarded._sandbox_ends.append(write_end)
                streams[index] = write_end
                pump = threading.Thread(
                    target=_pump,
                    args=(read_end, target),
                    name=f"lnk-{STREAMS[index]}-pump",
                    daemon=True,
                )
                guarded._pumps.append(pump)
                pump.start()
    except BaseException:
        with contextlib.suppress(OSError):
            guarded.close()
        raise
    guarded.streams = (streams[0], streams[1], streams[2])
    return guarded
