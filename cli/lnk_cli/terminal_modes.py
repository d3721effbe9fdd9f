"""The caller's terminal modes, saved before a launch and put back after it, whatever the
sandbox did meanwhile and however it ended (its exit, a kill, `lnk sandbox stop`, its lease).

The sandbox never holds the caller's terminal: with a terminal on stdin and stdout it gets a
pty of the controller's (relayed in raw mode by launch_client), and otherwise the controller
gives it /dev/null or a pipe in the terminal's place (lnk_controller/stdio_guard.py). So what
is put back here is mostly this client's own raw mode; it is also the last line should a
controller ever pass a terminal through (its `unsafe_caller_terminal` test switch does).

What this does NOT cover: a client killed with SIGKILL (or dying without unwinding) puts
nothing back; the terminal stays as the client left it, raw when it was relaying a pty, and
`stty sane` (or `reset`) restores it. The signals a client can catch (SIGINT, SIGTERM, SIGHUP,
SIGQUIT) go to the sandbox's program and the client still puts the modes back after the exit.
The C client (native/lnk_client.c) does the same for its own path.
"""

from __future__ import annotations

import os
import termios

# typing.TYPE_CHECKING without importing typing, which `lnk sandbox run` never needs.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

__all__ = ["kept_modes", "restore_modes", "save_modes"]

STDIO = (0, 1, 2)


def save_modes(fds: tuple[int, ...] = STDIO) -> list[tuple[int, list[Any]]]:
    """The modes of each descriptor among `fds` that is a terminal."""
    kept: list[tuple[int, list[Any]]] = []  # (descriptor, its termios attributes)
    for fd in fds:
        try:
            if os.isatty(fd):
                kept.append((fd, termios.tcgetattr(fd)))
        except (OSError, termios.error):
            continue
    return kept


def restore_modes(kept: list[tuple[int, list[Any]]]) -> None:
    """Put the saved modes back (after the output already written has gone out); a terminal
    that is gone meanwhile is left alone."""
    for fd, modes in kept:
        try:
            termios.tcsetattr(fd, termios.TCSADRAIN, modes)
        except (OSError, termios.error):
            continue


class kept_modes:  # noqa: N801 - a context manager; contextlib is one import more
    """`with kept_modes():` the caller's terminal modes, as they were, after the block."""

    def __init__(self, fds: tuple[int, ...] = STDIO) -> None:
        self._fds = fds

    def __enter__(self) -> None:
        self._kept = save_modes(self._fds)

    def __exit__(self, *_: object) -> None:
        restore_modes(self._kept)
