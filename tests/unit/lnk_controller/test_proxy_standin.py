"""While the proxy is down, the controller answers on the listeners it keeps: each connection
gets the 503 saying so (real unix sockets; the proxy is a missing admin socket)."""

from __future__ import annotations

import array
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_controller import proxy_link
from lnk_controller.config import ControllerConfig
from lnk_controller.proxy_standin import ANSWER, MAX_HEAD, StandIn, head_complete
from lnk_shared import handed_sockets
from lnk_shared.handed_sockets import HEADER

WAIT_S = 10.0  # a client's read: the stand-in answers within a second


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lnksi", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _listener(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    sock.setblocking(False)  # as the proxy makes it
    return sock


def _ask(path: Path, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(WAIT_S)
        client.connect(str(path))
        if request:
            client.sendall(request)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
        return answer


@pytest.mark.parametrize(
    ("head", "complete"),
    [
        (b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", True),
        (b"CONNECT a:443 HTTP/1.1\r\n", False),
        (b"x" * MAX_HEAD, True),  # past the proxy's own limit: read no further
        (b"", False),
    ],
)
def test_head_complete(head: bytes, complete: bool) -> None:
    assert head_complete(head) is complete


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET http://www.example/ HTTP/1.1\r\nHost: www.example\r\n\r\n",
        b"CONNECT www.example:443 HTTP/1.1\r\n\r\n",
        b"POST http://www.example/ HTTP/1.1\r\nContent-Length: 100000\r\n\r\n" + b"b" * 100000,
        b"",  # a client that sends nothing gets it once the head's time is up
    ],
    ids=["plain", "connect", "body", "silent"],
)
def test_every_connection_gets_the_503_and_goes_nowhere(base: Path, request_bytes: bytes) -> None:
    listener = _listener(base / "l.sock")
    stand_in = StandIn()
    answers: list[bytes] = []
    client = threading.Thread(target=lambda: answers.append(_ask(base / "l.sock", request_bytes)))
    client.start()
    try:
        while client.is_alive():
            assert stand_in.serve([listener.fileno()], 0.2, lambda: False) is False
    finally:
        client.join(WAIT_S)
        listener.close()
    assert answers == [ANSWER]
    assert ANSWER.startswith(b"HTTP/1.1 503 ") and b"lnk box up" in ANSWER
    assert stand_in.answered == 1


def test_keep_listeners_answers_503_while_the_proxy_is_down_and_keeps_running(
    base: Path,
) -> None:
    """Before, the keeper died at the first `list` the dead proxy did not answer (StateError):
    no listener was ever handed back, and clients waited in the backlog."""
    cfg = ControllerConfig(run_dir=base / "run", state_dir=base)  # no proxy answers there
    listener = _listener(base / "sbx.sock")
    proxy_link.HELD.keep("sbx-1", os.dup(listener.fileno()), {"op": "adopt"})  # as open's
    stop = threading.Event()
    keeper = threading.Thread(target=proxy_link.keep_listeners, args=(cfg, stop))
    keeper.start()
    try:
        first = _ask(base / "sbx.sock", b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n")
        second = _ask(base / "sbx.sock", b"CONNECT a:443 HTTP/1.1\r\n\r\n")
        assert keeper.is_alive()
    finally:
        stop.set()
        keeper.join(WAIT_S)
        proxy_link.HELD.drop("sbx-1")  # closes the descriptor it kept
        listener.close()  # the dead proxy's copy
    assert (first, second) == (ANSWER, ANSWER)
    assert not keeper.is_alive()


def test_a_connection_made_once_the_proxy_is_back_waits_for_it(base: Path) -> None:
    """Asked before the accept: the proxy answers again, so nothing is accepted and the
    connection stays in the backlog for the restarted proxy."""
    listener = _listener(base / "l.sock")
    stand_in = StandIn()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(base / "l.sock"))
        client.sendall(b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n")
        assert stand_in.serve([listener.fileno()], WAIT_S, lambda: True) is True
        assert stand_in.answered == 0
        accepted, _ = listener.accept()  # the new proxy's, with the request intact
        with accepted:
            accepted.settimeout(WAIT_S)
            assert accepted.recv(100).startswith(b"GET http://a/")
    listener.close()


def _hand(path: Path, fd: int) -> bytes:
    """A hand-off as the relay sends it (`lnk_shared.handed_sockets`): what the unix side got."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sender:
        sender.settimeout(WAIT_S)
        sender.connect(str(path))
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
        sender.sendmsg([HEADER], rights)
        answer = b""
        while chunk := sender.recv(65536):
            answer += chunk
        return answer


def _serve_until(stand_in: StandIn, listener: socket.socket, done: threading.Thread) -> None:
    while done.is_alive():
        assert stand_in.serve([listener.fileno()], 0.2, lambda: False) is False


def test_a_handed_connection_gets_the_503_on_its_own_socket(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox's client reads the 503 from the TCP socket its relay handed over (another
    namespace's in a sandbox: here this process's, the namespace rule told it differs)."""
    cookie = handed_sockets.own_netns_cookie()
    assert cookie is not None
    monkeypatch.setattr(handed_sockets, "own_netns_cookie", lambda: cookie + 1)
    listener = _listener(base / "h.sock")
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname(), WAIT_S)
    accepted, _ = server.accept()
    got: list[bytes] = []

    def relay_and_read() -> None:
        client.sendall(b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n")
        got.append(_hand(base / "h.sock", accepted.fileno()))
        accepted.close()  # the relay keeps no copy
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
        got.append(answer)

    stand_in = StandIn()
    thread = threading.Thread(target=relay_and_read)
    thread.start()
    try:
        _serve_until(stand_in, listener, thread)
    finally:
        thread.join(WAIT_S)
        stand_in.finish()  # closes what it still holds (the handed socket lingers for its rest)
        for sock in (listener, server, client):
            sock.close()
    assert got == [b"", ANSWER]  # nothing on the unix side: the answer went to the client


def test_a_refused_hand_off_is_closed_unanswered(base: Path) -> None:
    """A socket of the stand-in's own namespace (the host's) is refused as the proxy refuses it."""
    listener = _listener(base / "r.sock")
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname(), WAIT_S)
    accepted, _ = server.accept()
    got: list[bytes] = []

    def relay_and_read() -> None:
        client.sendall(b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n")
        got.append(_hand(base / "r.sock", accepted.fileno()))
        accepted.close()
        try:
            got.append(client.recv(65536))
        except ConnectionResetError:  # closed with the request unread: the kernel's reset
            got.append(b"")

    stand_in = StandIn()
    thread = threading.Thread(target=relay_and_read)
    thread.start()
    try:
        _serve_until(stand_in, listener, thread)
    finally:
        thread.join(WAIT_S)
        stand_in.finish()  # closes what it still holds (the handed socket lingers for its rest)
        for sock in (listener, server, client):
            sock.close()
    assert got == [b"", b""]
    assert stand_in.answered == 0
