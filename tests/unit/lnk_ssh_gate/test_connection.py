"""A gate whose session's stdout loses its reader (sshd gone) exits, with a pipe and with a
socket; one whose reader stays runs on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from lnk_ssh_gate.connection import EXIT_CONNECTION_LOST

CHILD = (
    "import time\n"
    "from lnk_ssh_gate.connection import end_with_connection\n"
    "end_with_connection(1)\n"
    "print('watching', flush=True)\n"
    "time.sleep(30)\n"
)
WAIT_S = 15


def _start(stdout: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdout=stdout,
        stdin=subprocess.DEVNULL,
        env={"PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_a_closed_pipe_reader_ends_the_gate() -> None:
    read, write = os.pipe()
    child = _start(write)
    os.close(write)
    try:
        assert os.read(read, 100) == b"watching\n"
    finally:
        os.close(read)  # sshd's end goes away
    assert child.wait(timeout=WAIT_S) == EXIT_CONNECTION_LOST


def test_a_closed_socket_peer_ends_the_gate() -> None:
    ours, theirs = socket.socketpair()
    child = _start(theirs.fileno())
    theirs.close()
    try:
        assert ours.recv(100) == b"watching\n"
    finally:
        ours.close()
    assert child.wait(timeout=WAIT_S) == EXIT_CONNECTION_LOST


def test_a_half_closed_socket_is_not_a_lost_connection() -> None:
    """sshd shuts its writing side when the client sends EOF on stdin: the session goes on."""
    ours, theirs = socket.socketpair()
    child = _start(theirs.fileno())
    theirs.close()
    try:
        assert ours.recv(100) == b"watching\n"
        ours.shutdown(socket.SHUT_WR)
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1)
    finally:
        child.kill()
        child.wait()
        ours.close()
