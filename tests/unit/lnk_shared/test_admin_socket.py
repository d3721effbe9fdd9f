"""A service's admin socket, both ends, over real sockets: only the controller's uid is
answered, a frame the handler refuses is an error reply with its descriptors closed, a broken
frame ends the connection unanswered, the thread server binds 0600 in a 0700 folder and
removes its socket, and a caller is told a service that does not answer is the box's state."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk_shared.admin_socket import (
    ADMIN_SOCKET_MODE,
    SERVICE_DIR_MODE,
    admin_answers,
    admin_socket_in,
    call_admin,
    serve_admin_async,
    serve_admin_threads,
    serve_connection,
    serve_connection_async,
)
from lnk_shared.errors import StateError
from lnk_shared.unix import MAX_FRAME, recv_frame, send_frame
from lnk_shared.waking_event import WakingEvent

WAIT_S = 5.0  # a real answer comes at once; this is the bound of a hung test, not a sleep
# A connection closed unanswered: EOF, or a reset or broken pipe when the server closed it
# before it read all we sent.
NO_ANSWER = (EOFError, ConnectionResetError, BrokenPipeError)


@pytest.fixture
def run_dir() -> Iterator[Path]:
    # Short: a unix socket's path holds 107 bytes, and pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="lnkas", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Handled:
    """A handler that answers `ping` and refuses the rest, keeping what it was given."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    def __call__(
        self, untrusted: dict[str, Any], fds: list[int]
    ) -> tuple[dict[str, Any], list[int]]:
        self.frames.append(untrusted)
        if untrusted.get("op") != "ping":
            raise ValueError(f"op must be ping, not {untrusted.get('op')!r}")
        return {"ok": True}, []

    async def async_call(
        self, untrusted: dict[str, Any], fds: list[int]
    ) -> tuple[dict[str, Any], list[int]]:
        return self(untrusted, fds)


def served(controller_uid: int, handle: Handled) -> tuple[socket.socket, threading.Thread]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.settimeout(WAIT_S)
    thread = threading.Thread(
        target=serve_connection, args=(theirs, controller_uid, handle), kwargs={"want_fds": True}
    )
    thread.start()
    return ours, thread


def test_the_controller_is_answered_frame_by_frame() -> None:
    ours, thread = served(os.getuid(), Handled())
    try:
        # a refused frame does not end the connection
        assert replies_to(ours, [{"op": "ping"}, {"op": "open"}, {"op": "ping"}]) == [
            {"ok": True},
            {"ok": False, "error": "op must be ping, not 'open'"},
            {"ok": True},
        ]
    finally:
        ours.close()
        thread.join(WAIT_S)
    assert not thread.is_alive()  # the controller's close ends the connection


def replies_to(ours: socket.socket, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The answers to `frames` until the connection ends; ours is closed after."""
    answers = []
    try:
        for frame in frames:
            send_frame(ours, frame)
            answers.append(recv_frame(ours)[0])
    except (*NO_ANSWER, OSError):
        pass
    ours.close()
    return answers


def _oversized(sock: socket.socket) -> None:
    sock.sendall(struct.pack(">I", MAX_FRAME + 1))


def _ping(sock: socket.socket) -> None:
    send_frame(sock, {"op": "ping"})


@pytest.mark.parametrize(
    ("uid_offset", "send"),
    [(1, _ping), (0, _oversized)],
    ids=["another uid's ping", "the controller's frame over the limit"],
)
def test_the_connection_ends_unanswered_and_reaches_no_handler(
    uid_offset: int, send: Callable[[socket.socket], None]
) -> None:
    handle = Handled()
    ours, thread = served(os.getuid() + uid_offset, handle)
    try:
        with pytest.raises(NO_ANSWER):
            send(ours)
            recv_frame(ours)
    finally:
        ours.close()
        thread.join(WAIT_S)
    assert handle.frames == []


def test_a_refused_frame_s_descriptors_are_closed_by_the_server() -> None:
    """A descriptor sent with a frame the handler refused is not left open in the service: the
    pipe's far end sees EOF once the sender's own copy is closed too."""
    ours, thread = served(os.getuid(), Handled())
    read_end, write_end = os.pipe()
    try:
        send_frame(ours, {"op": "adopt"}, [write_end])
        assert recv_frame(ours)[0]["ok"] is False
        os.close(write_end)
        write_end = -1
        os.set_blocking(read_end, False)
        assert os.read(read_end, 1) == b""  # no writer left anywhere: the server closed its copy
    finally:
        ours.close()
        thread.join(WAIT_S)
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def test_the_loop_served_connection_answers_the_controller_only() -> None:
    async def exchange(controller_uid: int) -> list[dict[str, Any]]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.settimeout(WAIT_S)
        handle = Handled()
        task = asyncio.create_task(
            serve_connection_async(theirs, controller_uid, handle.async_call, want_fds=True)
        )

        try:
            return await asyncio.to_thread(replies_to, ours, [{"op": "ping"}, {"op": "close"}])
        finally:
            await task

    assert asyncio.run(exchange(os.getuid())) == [
        {"ok": True},
        {"ok": False, "error": "op must be ping, not 'close'"},
    ]
    assert asyncio.run(exchange(os.getuid() + 1)) == []


def test_the_thread_server_binds_0600_in_a_0700_folder_and_removes_its_socket(
    run_dir: Path,
) -> None:
    path = admin_socket_in(run_dir, "svc")
    assert path == run_dir / "svc" / "admin.sock"
    stop = WakingEvent()
    server = threading.Thread(target=serve_admin_threads, args=(path, os.getuid(), Handled(), stop))
    server.start()
    try:
        answered = False
        while not answered and server.is_alive():  # bound once it answers: no sleep
            answered = admin_answers(path, timeout=WAIT_S)
        assert answered
        assert stat.S_IMODE(path.stat().st_mode) == ADMIN_SOCKET_MODE
        assert stat.S_IMODE(path.parent.stat().st_mode) == SERVICE_DIR_MODE
        reply, fds = call_admin(path, {"op": "list"}, service="test service")
        assert reply["ok"] is False and fds == []
    finally:
        stop.set()
        server.join(WAIT_S)
    assert not server.is_alive()
    assert not path.exists()


def test_the_loop_server_answers_until_cancelled_then_removes_its_socket(run_dir: Path) -> None:
    path = admin_socket_in(run_dir, "svc")
    handle = Handled()

    async def run() -> tuple[bool, int, int]:
        server = asyncio.create_task(
            serve_admin_async(
                path,
                lambda sock, executor: serve_connection_async(
                    sock, os.getuid(), handle.async_call, executor
                ),
                threads=2,
                thread_name="test-admin",
            )
        )
        try:
            answered = False
            while not answered and not server.done():  # bound once it answers: no sleep
                answered = await asyncio.to_thread(admin_answers, path, WAIT_S)
            modes = stat.S_IMODE(path.stat().st_mode), stat.S_IMODE(path.parent.stat().st_mode)
        finally:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
        return answered, *modes

    assert asyncio.run(run()) == (True, ADMIN_SOCKET_MODE, SERVICE_DIR_MODE)
    assert handle.frames and not path.exists()


def test_a_service_that_does_not_answer_is_the_box_s_state(run_dir: Path) -> None:
    path = admin_socket_in(run_dir, "svc")
    with pytest.raises(StateError) as raised:
        call_admin(path, {"op": "ping"}, service="store bridge")
    said = str(raised.value)
    assert said.startswith(f"the store bridge does not answer at {path} (")
    assert said.endswith("`lnk box up` starts it")
    assert admin_answers(path, timeout=WAIT_S) is False


def _wakes(thread: threading.Thread) -> int:
    """How often `thread` has slept and been woken (the kernel's count of its voluntary
    context switches): a loop polling on a timeout adds one per poll."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def test_the_thread_server_sleeps_at_rest_and_stops_at_once(run_dir: Path) -> None:
    """No poll for its stop: a second at rest wakes it not once (a 0.2 s accept timeout woke
    it five times), and a stop set meanwhile ends it at once."""
    path = admin_socket_in(run_dir, "svc")
    stop = WakingEvent()
    server = threading.Thread(target=serve_admin_threads, args=(path, os.getuid(), Handled(), stop))
    server.start()
    try:
        while not admin_answers(path, timeout=WAIT_S) and server.is_alive():
            pass
        time.sleep(0.2)  # the answer's own wake-ups end
        before = _wakes(server)
        time.sleep(1.0)  # at rest: nothing is asked of it
        woken = _wakes(server) - before
        t0 = time.monotonic()
    finally:
        stop.set()
        server.join(WAIT_S)
        stop.close()
    took = time.monotonic() - t0
    assert woken == 0, f"the idle accept loop woke {woken} times in a second"
    assert not server.is_alive() and took < 1.0, f"it took {took:.2f} s to stop"
