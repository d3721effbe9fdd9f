"""The controller's API served by real uvicorn on a real unix socket (the confiner and the
launcher, compiled once per session, are tests/unit/conftest.py's); and the host users' tests'
fresh uids, their homes folder and the processes they start, each cleaned up at teardown."""

from __future__ import annotations

import itertools
import secrets
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI
from host_user_kit import TEST_IDS_BASE, TEST_IDS_SPAN, NewUid, lines_naming, live_pids_of

from lnk_controller.api import PeerCredProtocol
from lnk_controller.api_server import RestingServer
from lnk_controller.host_users import HostUser, remove_user, user_name
from lnk_shared.errors import StateError
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


# -- host users (test_host_users*.py; tests/unit/helpers/host_user_kit.py) ----------------------


@pytest.fixture
def homes(tmp_path: Path) -> Path:
    homes = tmp_path / "homes"
    homes.mkdir()
    homes.chmod(0o711)
    return homes


@pytest.fixture
def uids(homes: Path) -> Iterator[NewUid]:
    """Hands out fresh test uids; at teardown removes each one's user, home and processes."""
    counter = itertools.count(TEST_IDS_BASE + secrets.randbelow(TEST_IDS_SPAN // 1000) * 1000)
    handed: list[int] = []

    def new_uid() -> int:
        handed.append(next(counter))
        return handed[-1]

    yield new_uid
    left = []
    for uid in handed:
        home = homes / user_name(uid)
        if home.is_symlink():
            home.unlink()
        try:
            remove_user(HostUser(user_name(uid), uid, uid, str(home)))
        except StateError as e:
            left.append(str(e))
        left += lines_naming(user_name(uid)) + [f"pid {p}" for p in live_pids_of(uid)]
    assert not left, f"test users left behind: {left}"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; each is killed and reaped at teardown."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()
