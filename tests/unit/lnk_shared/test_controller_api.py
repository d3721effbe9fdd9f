"""The one controller-API client: every way the controller's socket can fail a command (missing,
nobody listening, no answer, reset, closed mid-answer, not allowed) is one line naming what
happened and the controller's log, exit status 1, for every command that calls the API; and
what the controller says of its own error keeps that error's class and statuses."""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr
from pathlib import Path

import pytest

from lnk_cli.app import run
from lnk_shared import controller_api
from lnk_shared.api_errors import error_answer
from lnk_shared.errors import CommandRefused, StateError
from lnk_shared.paths import BoxPaths

NOBODY = 65534
SHORT_S = 0.3  # the client's wait in the no-answer case: a real timeout, made short


@pytest.fixture
def box(monkeypatch: pytest.MonkeyPatch) -> Iterator[BoxPaths]:
    folder = Path(tempfile.mkdtemp(prefix="lnks-"))  # short: a socket's path is at most 108
    folder.chmod(0o755)
    monkeypatch.setenv("LNK_RUN_DIR", str(folder / "run"))
    monkeypatch.setenv("LNK_STATE_DIR", str(folder / "state"))
    (folder / "run").mkdir(mode=0o755)
    paths = BoxPaths.from_env()
    try:
        yield paths
    finally:
        for child in (folder / "run").iterdir():
            child.unlink()
        (folder / "run").rmdir()
        folder.rmdir()


@contextmanager
def _serve(path: Path, answer: Callable[[socket.socket], None]) -> Iterator[None]:
    """A stand-in controller on `path` that reads one request and does `answer` with it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                answer(conn)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)


def _reset(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _closed(conn: socket.socket) -> None:
    pass  # closed with no answer at all


def _cut(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n[1, 2")


def _refused_by_rule(conn: socket.socket) -> None:
    status, body = error_answer(CommandRefused("/usr/bin/x", "not in [commands]"))
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
    conn.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)


@pytest.mark.parametrize(
    ("answer", "said"),
    [(_reset, "connection to"), (_closed, "connection to"), (_cut, "connection to")],
    ids=["reset", "closed-without-answer", "answer-cut-short"],
)
def test_a_broken_connection_is_a_state_error_naming_the_log(
    box: BoxPaths, answer: Callable[[socket.socket], None], said: str
) -> None:
    with _serve(box.controller_socket, answer):
        with pytest.raises(StateError, match=said) as caught:
            controller_api.call("GET", "/v1/sandboxes")
        assert box.log_of("controller") in str(caught.value)


def test_no_answer_in_time_is_a_state_error_naming_the_log(box: BoxPaths) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(box.controller_socket))
        listener.listen(1)  # the kernel queues the connection; nobody ever answers it
        with pytest.raises(StateError, match=r"did not answer in 0.3 s") as caught:
            controller_api.call("GET", "/v1/sandboxes", timeout=SHORT_S)
        assert box.log_of("controller") in str(caught.value)
    finally:
        listener.close()


def test_no_socket_or_nobody_listening_says_the_box_is_not_running(box: BoxPaths) -> None:
    with pytest.raises(StateError, match="the box is not running"):
        controller_api.call("GET", "/v1/sandboxes")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(box.controller_socket))  # bound, never listening: ECONNREFUSED
    try:
        with pytest.raises(StateError, match="the box is not running"):
            controller_api.call("GET", "/v1/sandboxes")
    finally:
        dead.close()


@pytest.mark.needs_root
def test_a_socket_the_caller_may_not_use_is_said_so(box: BoxPaths) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to call as another user")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(box.controller_socket))
        listener.listen(1)
        os.chmod(box.controller_socket, 0o600)  # root's: nobody may connect
        code = "from lnk_shared.controller_api import call; call('GET', '/v1/sandboxes')"
        as_nobody = ["/usr/bin/setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        done = subprocess.run(
            [*as_nobody, sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert "StateError: not allowed to use" in done.stderr, done.stderr
    finally:
        listener.close()


# Every command that calls the controller's API, as a person types it.
COMMANDS = [
    ["sandbox", "list"],
    ["sandbox", "show", "sbx-1"],
    ["sandbox", "stop", "sbx-1"],
    ["sandbox", "lease", "sbx-1", "--seconds", "60"],
    ["sandbox", "wire", "sbx-1"],
    ["agent", "list"],
    ["agent", "stop", "a"],
    ["agent", "send", "a", "hello"],
    ["spec", "list"],
    ["secret", "list"],
]


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_every_command_says_a_reset_in_one_line_with_status_1(
    box: BoxPaths, words: list[str]
) -> None:
    with _serve(box.controller_socket, _reset):
        err = io.StringIO()
        with redirect_stderr(err):
            status = run(words)
        text = err.getvalue()
        assert status == 1, text
        assert text.count("\n") == 1 and "Traceback" not in text and "bug" not in text, text
        assert "see the controller's log" in text


@pytest.mark.parametrize("words", [["sandbox", "stop", "sbx-1"], ["agent", "stop", "a"]])
def test_the_controllers_refusal_keeps_its_class_and_status_3(
    box: BoxPaths, words: list[str]
) -> None:
    with _serve(box.controller_socket, _refused_by_rule):
        err = io.StringIO()
        with redirect_stderr(err):
            status = run(words)
        assert status == 3, err.getvalue()
        assert "refused [command]" in err.getvalue()
