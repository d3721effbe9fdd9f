"""The relay's bulk directions (lnk_inside/native/relay_direction.c, relay_own_thread.c, and the
hand-off in relay.c), run for real: `lnk-sandbox --relay SOCKET PORT` against unix-socket
servers here, its threads and descriptors read from /proc.

A direction that read BULK_BYTES from its source (in reads that were not short) leaves the one
epoll thread for a thread of its own (named BULK_THREAD_NAME, which it sets before it moves a
byte): so once a peer has received well past BULK_BYTES of a stream sent at once through one
direction, that thread exists until the direction ends. Each test holds
the direction open while it looks, then checks that the bytes arrived whole, the end was passed
on, and the thread and every descriptor of the connection (two sockets, two pipes) are gone.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from lnk_shared.native_build import native_folder

TIMEOUT_S = 20.0
HEADER = native_folder("lnk_inside") / "relay_direction.h"


def header_value(name: str) -> str:
    for line in HEADER.read_text().splitlines():
        if line.startswith(f"#define {name} "):
            return line.split(None, 2)[2].split("/*")[0].strip()
    raise AssertionError(f"{name} is not in {HEADER}")


def shifted(text: str) -> int:
    """`(8 << 20)`, as the header writes it, as a number."""
    value, shift = text.strip("()").split("<<")
    return int(value) << int(shift)


BULK_BYTES = shifted(header_value("BULK_BYTES"))
BULK_THREAD = header_value("BULK_THREAD_NAME").strip('"')
PAYLOAD = 3 * BULK_BYTES  # through one direction: bulk well before its end
LOOKED_AT = 2 * BULK_BYTES  # received when the test looks: the thread must be there


Handler = Callable[[socket.socket], None]


@contextmanager
def unix_server(path: Path, handler: Handler) -> Iterator[list[BaseException]]:
    """Each connection to `handler` on its own thread; its errors are collected."""
    errors: list[BaseException] = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(16)
    threads: list[threading.Thread] = []

    def run(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(TIMEOUT_S)
            try:
                handler(conn)
            except BaseException as exc:  # reported by the test, not lost in a thread
                errors.append(exc)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            thread = threading.Thread(target=run, args=(conn,), daemon=True)
            threads.append(thread)
            thread.start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield errors
    finally:
        with suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        acceptor.join(TIMEOUT_S)
        for thread in threads:
            thread.join(TIMEOUT_S)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for a state of the relay that follows from what the test did (not a timing)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@contextmanager
def relay(binary: Path, socket_path: Path) -> Iterator[tuple[int, int]]:
    port = free_port()
    process = subprocess.Popen(
        [str(binary), "--relay", str(socket_path), str(port)], stdin=subprocess.DEVNULL
    )
    entry = f"0100007F:{port:04X} 00000000:0000 0A"  # LISTEN, read from /proc: no probe client
    try:
        until(lambda: entry in Path("/proc/net/tcp").read_text(), "the relay never listened")
        yield port, process.pid
    finally:
        process.kill()
        process.wait(TIMEOUT_S)


def thread_names(pid: int) -> list[str]:
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(FileNotFoundError):  # a thread that just ended
            names.append((task / "comm").read_text().strip())
    return names


def bulk_threads(pid: int) -> int:
    return thread_names(pid).count(BULK_THREAD)


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def receive_exactly(sock: socket.socket, count: int) -> bytes:
    parts, got = [], 0
    while got < count:
        part = sock.recv(min(1 << 20, count - got))
        assert part, f"closed after {got} of {count} bytes"
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def receive_all(sock: socket.socket) -> bytes:
    parts = []
    while part := sock.recv(1 << 20):
        parts.append(part)
    return b"".join(parts)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def at_rest(lnk_sandbox: Path, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    yield lnk_sandbox, tmp_path / "proxy.sock"


def settled_back(pid: int, fds: int, threads: int) -> None:
    """The connection is over in the relay: its thread and its descriptors are gone."""
    until(lambda: bulk_threads(pid) == 0, "the bulk thread outlived its direction")
    until(lambda: descriptors(pid) == fds, "a socket or pipe of the connection was kept")
    until(lambda: len(thread_names(pid)) == threads, "a thread of the connection was kept")


@pytest.mark.parametrize("connections", [1, 3])
def test_a_bulk_download_gets_its_own_thread_which_ends_with_it(
    at_rest: tuple[Path, Path], connections: int
) -> None:
    binary, path = at_rest
    payload = os.urandom(PAYLOAD)
    release = threading.Event()  # the server holds its end of stream until the test looked

    def download(conn: socket.socket) -> None:
        conn.sendall(payload)
        assert release.wait(TIMEOUT_S)
        conn.shutdown(socket.SHUT_WR)
        assert receive_all(conn) == b""  # the client's end, passed on

    with unix_server(path, download) as errors, relay(binary, path) as (port, pid):
        fds, threads = descriptors(pid), len(thread_names(pid))
        address = ("127.0.0.1", port)
        clients = [socket.create_connection(address, TIMEOUT_S) for _ in range(connections)]
        try:
            heads = [receive_exactly(client, LOOKED_AT) for client in clients]
            assert bulk_threads(pid) == connections  # one per bulk direction, none for the rest
            release.set()
            for client, head in zip(clients, heads, strict=True):
                assert digest(head + receive_all(client)) == digest(payload)
                client.shutdown(socket.SHUT_WR)
        finally:
            release.set()
            for client in clients:
                client.close()
        settled_back(pid, fds, threads)
    assert errors == []


def test_a_bulk_upload_passes_its_end_on_and_the_answer_still_comes_back(
    at_rest: tuple[Path, Path],
) -> None:
    binary, path = at_rest
    payload = os.urandom(PAYLOAD)
    seen: list[int] = []

    def upload(conn: socket.socket) -> None:
        head = receive_exactly(conn, LOOKED_AT)  # the relay cannot be far ahead of this read
        seen.append(bulk_threads(relay_pid[0]))
        received = head + receive_all(conn)  # to the client's end, passed on by the thread
        conn.sendall(digest(received).encode())
        conn.shutdown(socket.SHUT_WR)

    relay_pid: list[int] = []
    with unix_server(path, upload) as errors, relay(binary, path) as (port, pid):
        relay_pid.append(pid)
        fds, threads = descriptors(pid), len(thread_names(pid))
        with socket.create_connection(("127.0.0.1", port), TIMEOUT_S) as client:
            client.sendall(payload)
            client.shutdown(socket.SHUT_WR)  # half-close: the answer must still come back
            assert receive_all(client).decode() == digest(payload)
        settled_back(pid, fds, threads)
    assert errors == []
    assert seen == [1]


def test_small_round_trips_stay_on_the_epoll_thread(at_rest: tuple[Path, Path]) -> None:
    """A keep-alive connection's requests and answers never cost a thread, however many: mixed
    sizes, then 4 KiB round trips well past BULK_BYTES each way (every read short)."""
    binary, path = at_rest

    def echo(conn: socket.socket) -> None:
        while data := conn.recv(65536):
            conn.sendall(data)

    with unix_server(path, echo) as errors, relay(binary, path) as (port, pid):
        threads = len(thread_names(pid))
        with socket.create_connection(("127.0.0.1", port), TIMEOUT_S) as client:
            for size in (1, 90, 160, 4096, 65536, 200_000) * 8:
                message = os.urandom(size)
                client.sendall(message)
                assert receive_exactly(client, size) == message
            message = os.urandom(4096)
            for _ in range(BULK_BYTES * 5 // 4 // len(message)):
                client.sendall(message)
                assert receive_exactly(client, len(message)) == message
            # the connection's dialing thread ends after its hand-over; no other comes
            until(lambda: len(thread_names(pid)) == threads, "a thread was kept or started")
            assert bulk_threads(pid) == 0
    assert errors == []
