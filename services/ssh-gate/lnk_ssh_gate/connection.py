"""Ending a session whose SSH connection is gone, when no terminal would tell it.

With a pty, a dropped connection closes the pty and the kernel hangs up the session: the
launch client dies of SIGHUP and the controller stops the sandbox (a client that goes away
stops its sandbox). Without one, sshd only closes its ends of the session's pipes; a program
that neither reads nor writes (a `sleep`, a long silent job) would run on, unseen, until its
lease ends. So the gate watches its own copy of the session's stdout: when sshd's end is gone
(POLLERR on a pipe whose reader closed, POLLHUP on a socket), the gate exits, and the
controller, seeing its launch client go, stops the sandbox and cleans it away.

What this does NOT do: notice a connection that hangs without closing (sshd's
ClientAliveInterval is for that), or stop a sandbox by itself.
"""

from __future__ import annotations

import os
import select
import threading

__all__ = ["EXIT_CONNECTION_LOST", "end_with_connection"]

EXIT_CONNECTION_LOST = 255  # what ssh itself reports for a lost connection; nobody reads it


def _watch(fd: int) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLERR | select.POLLHUP)  # never POLLIN: not ours to read
    while True:
        for _, events in poller.poll():
            if events & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                os._exit(EXIT_CONNECTION_LOST)  # the launch socket closes with us: see above


def end_with_connection(fd: int = 1) -> None:
    """Exit this process at once when the other end of `fd` (sshd's) goes away."""
    threading.Thread(target=_watch, args=(fd,), daemon=True, name="lnk-ssh-connection").start()
