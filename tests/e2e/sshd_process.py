"""Starting a test sshd: a free loopback port, and sshd in the foreground on its own config,
logging to a file, until it accepts connections (the gate's and the deploy tests' sshds)."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from contextlib import suppress
from pathlib import Path

SSHD = "/usr/sbin/sshd"
START_S = 10.0  # sshd listens within milliseconds; this only bounds a broken start
STOP_S = 10.0  # a client or sshd ends within milliseconds of SIGTERM; past this it is killed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_sshd(config: Path, log: Path, port: int, what: str = "sshd") -> subprocess.Popen[bytes]:
    """`sshd -D -e -f config` in a session of its own (kill its group to stop it), once it
    accepts on 127.0.0.1:port; RuntimeError with its log when it does not start."""
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    deadline = time.monotonic() + START_S
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return process
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start: {log.read_text()}")
        time.sleep(0.05)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it is still there after STOP_S, and reap it (pipes drained), so
    a stuck ssh client neither fails the test that ran it nor outlives it."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.communicate(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            process.kill()
        process.communicate()
