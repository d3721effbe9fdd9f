"""The controller's API served by real uvicorn on a real unix socket (the confiner and the
launcher, compiled once per session, are tests/unit/conftest.py's)."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI

from lnk_controller.api import PeerCredProtocol
from lnk_controller.api_server import RestingServer
from lnk_shared.unix import bind_socket


@pytest.fixture
def serve_api() -> Iterator[Callable[[FastAPI], Path]]:
    """`serve_api(app)`: its socket's path, served with the kernel's peer credentials until
    the test ends."""
    served: list[tuple[uvicorn.Server, threading.Thread, Path]] = []

    def serve(app: FastAPI) -> Path:
        folder = Path(tempfile.mkdtemp(prefix="lnks-"))  # short: a socket's path is at most 108
        path = folder / "api.sock"
        sock = bind_socket(path, mode=0o666, dir_mode=0o711)
        server = RestingServer(  # the controller's own server
            uvicorn.Config(app, http=PeerCredProtocol, lifespan="off", log_level="critical")
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        served.append((server, thread, path))
        while not server.started:
            if not thread.is_alive():
                pytest.fail("the API did not start")
            threading.Event().wait(0.01)
        return path

    try:
        yield serve
    finally:
        for server, thread, path in served:
            server.should_exit = True
            thread.join(timeout=10)
            path.unlink(missing_ok=True)
            path.parent.rmdir()
