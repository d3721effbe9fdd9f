"""The API's uvicorn server at rest: its loop sleeps until there is work (no 0.1 s tick), and it
still answers, dates its answers with the second they are sent, stops at once when asked (from
a thread, by SIGTERM, under either event loop) and at uvicorn's request limit."""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from lnk_controller.api import PeerCredProtocol
from lnk_controller.api_server import RestingServer
from lnk_shared.api_client import UnixHTTPConnection
from lnk_shared.unix import bind_socket

IDLE_S = 1.0  # the window a resting server is watched in: uvicorn's tick wakes 10 times in it
MAX_IDLE_WAKES = 2  # the loop's own start may poll once or twice; a tick is ten
STOP_BOUND_S = 2.0  # uvicorn's shutdown takes ~0.1 s; a loop nobody woke would never end
LOOPS = ("asyncio", "uvloop")


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/ping")
    def ping() -> dict[str, bool]:
        return {"ok": True}

    return app


class _CountingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The loop's selector, counting how often the loop waits (each wait is one wake-up)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def select(self, timeout: float | None = None) -> Any:
        self.waits += 1
        return super().select(timeout)


@contextmanager
def _serving(
    server_class: type[uvicorn.Server], **options: Any
) -> Iterator[tuple[uvicorn.Server, Path, _CountingSelector, threading.Thread]]:
    """A server of `server_class` on a fresh unix socket, run by a thread in an asyncio loop
    whose selector counts its waits."""
    folder = Path(tempfile.mkdtemp(prefix="lnkr-"))
    path = folder / "api.sock"
    sock = bind_socket(path, mode=0o600, dir_mode=0o700)
    config = uvicorn.Config(
        _app(), http=PeerCredProtocol, lifespan="off", log_level="critical", **options
    )
    server = server_class(config)
    selector = _CountingSelector()

    def run() -> None:
        loop = asyncio.SelectorEventLoop(selector)
        try:
            loop.run_until_complete(server.serve(sockets=[sock]))
        finally:
            loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield server, path, selector, thread
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        path.unlink(missing_ok=True)
        folder.rmdir()


def _get(path: Path) -> tuple[int, dict[str, str]]:
    conn = UnixHTTPConnection(path, timeout=5)
    try:
        conn.request("GET", "/ping")
        answer = conn.getresponse()
        answer.read()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}
    finally:
        conn.close()


def _idle_waits(selector: _CountingSelector) -> int:
    time.sleep(0.2)  # the start's own steps end
    before = selector.waits
    time.sleep(IDLE_S)  # the window watched: nothing is asked of the server in it
    return selector.waits - before


def test_a_resting_server_does_not_wake_while_nobody_asks() -> None:
    with _serving(RestingServer) as (_server, path, selector, _thread):
        assert _get(path)[0] == 200
        waits = _idle_waits(selector)
    assert waits <= MAX_IDLE_WAKES, f"the idle loop woke {waits} times in {IDLE_S} s"


def test_the_measure_sees_uvicorns_own_tick() -> None:
    """The count above can fail: uvicorn's own server wakes about ten times in the window."""
    with _serving(uvicorn.Server) as (_server, _path, selector, _thread):
        waits = _idle_waits(selector)
    assert waits >= 5, f"uvicorn's own loop woke only {waits} times: the measure is blind"


def test_its_answers_carry_the_date_of_the_second_they_are_sent() -> None:
    with _serving(RestingServer) as (_server, path, _selector, _thread):
        status, first = _get(path)
        time.sleep(1.1)  # past the next whole second: a frozen header would show it
        _, second = _get(path)
        now = time.time()
    assert status == 200
    assert first["date"] != second["date"]
    assert abs(parsedate_to_datetime(second["date"]).timestamp() - now) <= 1.5


def test_the_date_header_can_be_turned_off_as_in_uvicorn() -> None:
    with _serving(RestingServer, date_header=False, headers=[("x-box", "lnk")]) as served:
        _, headers = _get(served[1])
    assert "date" not in headers and headers["x-box"] == "lnk"


def test_should_exit_set_from_another_thread_stops_it_at_once() -> None:
    with _serving(RestingServer) as (server, _path, _selector, thread):
        time.sleep(0.3)  # resting: nothing will wake it but the stop
        t0 = time.monotonic()
        server.should_exit = True
        thread.join(timeout=10)
        took = time.monotonic() - t0
    assert not thread.is_alive()
    assert took < STOP_BOUND_S, f"it took {took:.2f} s to stop"


def test_it_stops_at_uvicorns_request_limit() -> None:
    options = {"limit_max_requests": 2, "limit_max_requests_jitter": 0}
    with _serving(RestingServer, **options) as (_server, path, _selector, thread):
        assert _get(path)[0] == 200
        time.sleep(0.3)
        assert thread.is_alive(), "it stopped before the limit"
        t0 = time.monotonic()
        assert _get(path)[0] == 200
        thread.join(timeout=10)
        took = time.monotonic() - t0
    assert not thread.is_alive() and took < STOP_BOUND_S, f"{took:.2f} s after the last request"


_SIGTERM_CHILD = """
import signal, sys, uvicorn
signal.signal(signal.SIGTERM, lambda *_: None)  # as the controller: uvicorn raises it again
from fastapi import FastAPI
from lnk_controller.api_server import RestingServer
from lnk_shared.unix import bind_socket
sock = bind_socket(__import__("pathlib").Path(sys.argv[1]), mode=0o600, dir_mode=0o700)
config = uvicorn.Config(FastAPI(), lifespan="off", log_level="critical", loop=sys.argv[2])
server = RestingServer(config)
import threading, time
def say_ready():
    while not server.started:
        time.sleep(0.01)
    print("ready", flush=True)
threading.Thread(target=say_ready, daemon=True).start()
server.run(sockets=[sock])
print("stopped", flush=True)
"""


@pytest.mark.parametrize("loop", LOOPS)
def test_sigterm_stops_a_resting_server_at_once(loop: str) -> None:
    """The signal handler runs in the main thread while its loop sleeps in the kernel with no
    timeout: the handler must wake the loop itself, under asyncio's loop and uvloop's."""
    folder = Path(tempfile.mkdtemp(prefix="lnkr-"))
    child = subprocess.Popen(
        [sys.executable, "-c", _SIGTERM_CHILD, str(folder / "s.sock"), loop],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # resting
        t0 = time.monotonic()
        os.kill(child.pid, signal.SIGTERM)
        child.wait(timeout=10)
        took = time.monotonic() - t0
        said = child.stdout.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
        for entry in folder.iterdir():
            entry.unlink()
        folder.rmdir()
    assert "stopped" in said  # it ended its serve, not died of the signal
    assert took < STOP_BOUND_S, f"it took {took:.2f} s to stop after SIGTERM"
