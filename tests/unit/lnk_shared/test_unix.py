"""Unix sockets: bounded JSON frames with descriptors, peer credentials and socket files, over
real socket pairs and real socket files. A frame is crafted by hand where the sender is hostile."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk_shared.errors import StateError
from lnk_shared.unix import (
    MAX_FDS,
    MAX_FRAME,
    bind_socket,
    checked_op,
    peer_cred,
    recv_frame,
    send_frame,
)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.settimeout(5)
    b.settimeout(5)
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        with contextlib.suppress(OSError):  # the test may have closed it
            os.close(fd)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder whose socket paths stay far below the 108-byte sun_path limit."""
    path = Path(tempfile.mkdtemp(prefix="lnk-unix-"))
    yield path
    shutil.rmtree(path)


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    old = os.umask(0)
    yield
    os.umask(old)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def raw_frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    "message",
    [
        {},
        {"type": "launch", "argv": ["python3", "-c", "print(1)"], "n": 3, "ok": True},
        {"nested": {"list": [1, 2.5, None, "é ☃ \u2028"]}},
    ],
)
def test_frame_round_trips_without_descriptors(
    pair: tuple[socket.socket, socket.socket], message: dict[str, Any]
) -> None:
    a, b = pair
    send_frame(a, message)
    send_frame(a, {"second": 1})
    assert recv_frame(b) == (message, [])
    assert recv_frame(b, want_fds=True) == ({"second": 1}, [])


def test_passed_descriptor_works_on_the_other_side(
    pair: tuple[socket.socket, socket.socket], pipe: tuple[int, int]
) -> None:
    a, b = pair
    r, w = pipe
    send_frame(a, {"stdout": 0}, [w])
    message, fds = recv_frame(b, want_fds=True)
    assert message == {"stdout": 0}
    assert len(fds) == 1 and fds[0] != w
    os.write(fds[0], b"through the socket")
    os.close(fds[0])
    assert os.read(r, 100) == b"through the socket"


def test_several_descriptors_arrive_in_order(
    pair: tuple[socket.socket, socket.socket], pipe: tuple[int, int]
) -> None:
    a, b = pair
    r, w = pipe
    send_frame(a, {}, [r, w, r])
    _, fds = recv_frame(b, want_fds=True)
    try:
        assert [os.fstat(fd).st_ino for fd in fds] == [os.fstat(fd).st_ino for fd in (r, w, r)]
        assert stat.S_ISFIFO(os.fstat(fds[1]).st_mode)
    finally:
        for fd in fds:
            os.close(fd)


def test_descriptors_a_receiver_did_not_ask_for_are_not_installed(
    pair: tuple[socket.socket, socket.socket], pipe: tuple[int, int]
) -> None:
    a, b = pair
    before = open_fds()
    send_frame(a, {"x": 1}, [pipe[0], pipe[1]])
    assert recv_frame(b) == ({"x": 1}, [])
    assert open_fds() == before


def test_descriptors_smuggled_after_the_header_are_not_installed(
    pair: tuple[socket.socket, socket.socket], pipe: tuple[int, int]
) -> None:
    a, b = pair
    body = b'{"x":1}'
    a.sendall(struct.pack(">I", len(body)))
    socket.send_fds(a, [body], [pipe[0], pipe[1]])
    before = open_fds()
    assert recv_frame(b, want_fds=True) == ({"x": 1}, [])
    assert open_fds() == before


def test_frame_exactly_at_the_limit_passes(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    message = {"x": "a" * (MAX_FRAME - len('{"x":""}'))}
    sender = threading.Thread(target=send_frame, args=(a, message))
    sender.start()
    received, _ = recv_frame(b)
    sender.join()
    assert received == message


def test_frame_over_the_limit_is_refused_on_send(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    with pytest.raises(ValueError, match="over the limit"):
        send_frame(a, {"x": "a" * MAX_FRAME})
    b.setblocking(False)
    with pytest.raises(BlockingIOError):
        b.recv(1)  # nothing was sent


@pytest.mark.parametrize("length", [MAX_FRAME + 1, 2**32 - 1])
def test_frame_header_over_the_limit_is_refused_on_receive(
    pair: tuple[socket.socket, socket.socket], length: int
) -> None:
    a, b = pair
    a.sendall(struct.pack(">I", length) + b"{}")
    with pytest.raises(ValueError, match="over the limit"):
        recv_frame(b)


def test_too_many_descriptors_are_refused_on_send(
    pair: tuple[socket.socket, socket.socket], pipe: tuple[int, int]
) -> None:
    with pytest.raises(ValueError, match="descriptors"):
        send_frame(pair[0], {}, [pipe[0]] * (MAX_FDS + 1))


BAD_BODIES = [
    pytest.param(b'{"argv":["a"],"argv":["b"]}', "duplicate", id="duplicate-key"),
    pytest.param(b'{"fds":{"stdin":0,"stdin":5}}', "duplicate", id="nested-duplicate-key"),
    pytest.param(b"[]", "object", id="list"),
    pytest.param(b'"launch"', "object", id="string"),
    pytest.param(b"1", "object", id="number"),
    pytest.param(b"null", "object", id="null"),
    pytest.param(b'{"a":"\xff"}', "utf-8", id="bad-utf8"),
    pytest.param(b'{"a":"\xed\xa0\x80"}', "utf-8", id="utf8-encoded-surrogate"),
    pytest.param(b'{"a":', "", id="truncated-json"),
    pytest.param(b"", "", id="empty"),
]


@pytest.mark.parametrize(("body", "why"), BAD_BODIES)
def test_bad_frame_is_refused(
    pair: tuple[socket.socket, socket.socket], body: bytes, why: str
) -> None:
    a, b = pair
    a.sendall(raw_frame(body))
    with pytest.raises(ValueError, match=f"(?i){why}"):
        recv_frame(b)


@pytest.mark.parametrize(("body", "why"), BAD_BODIES)
def test_descriptors_of_a_bad_frame_are_closed(
    pair: tuple[socket.socket, socket.socket], pipe: tuple[int, int], body: bytes, why: str
) -> None:
    a, b = pair
    socket.send_fds(a, [raw_frame(body)], [pipe[0], pipe[1], pipe[1]])
    before = open_fds()
    with pytest.raises(ValueError, match=f"(?i){why}"):
        recv_frame(b, want_fds=True)
    assert open_fds() == before


def test_descriptors_of_an_oversized_frame_are_closed(
    pair: tuple[socket.socket, socket.socket], pipe: tuple[int, int]
) -> None:
    a, b = pair
    socket.send_fds(a, [struct.pack(">I", MAX_FRAME + 1)], [pipe[0], pipe[1]])
    before = open_fds()
    with pytest.raises(ValueError, match="over the limit"):
        recv_frame(b, want_fds=True)
    assert open_fds() == before


def test_descriptor_flood_is_refused_and_closed(
    pair: tuple[socket.socket, socket.socket], pipe: tuple[int, int]
) -> None:
    a, b = pair
    socket.send_fds(a, [raw_frame(b"{}")], [pipe[1]] * (MAX_FDS + 10))
    before = open_fds()
    with pytest.raises(ValueError, match="too many descriptors"):
        recv_frame(b, want_fds=True)
    assert open_fds() == before


def test_descriptors_of_a_truncated_frame_are_closed(
    pair: tuple[socket.socket, socket.socket], pipe: tuple[int, int]
) -> None:
    a, b = pair
    socket.send_fds(a, [struct.pack(">I", 100) + b'{"a"'], [pipe[0]])
    a.shutdown(socket.SHUT_WR)
    before = open_fds()
    with pytest.raises(EOFError):
        recv_frame(b, want_fds=True)
    assert open_fds() == before


def test_peer_cred_is_the_kernels_word_on_the_peer(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    cred = peer_cred(pair[1])
    assert (cred.pid, cred.uid, cred.gid) == (os.getpid(), os.getuid(), os.getgid())


@pytest.mark.parametrize(
    ("mode", "dir_mode"), [(0o600, 0o700), (0o660, 0o750), (0o666, 0o755), (0o600, 0o711)]
)
def test_socket_and_folder_modes_are_exactly_as_asked(
    short_dir: Path, permissive_umask: None, mode: int, dir_mode: int
) -> None:
    path = short_dir / "run" / "c.sock"
    sock = bind_socket(path, mode=mode, dir_mode=dir_mode)
    try:
        assert stat.S_IMODE(path.lstat().st_mode) == mode
        assert stat.S_ISSOCK(path.lstat().st_mode)
        assert stat.S_IMODE(path.parent.lstat().st_mode) == dir_mode
    finally:
        sock.close()


def test_an_existing_open_folder_is_narrowed(short_dir: Path) -> None:
    folder = short_dir / "run"
    folder.mkdir()
    folder.chmod(0o777)
    sock = bind_socket(folder / "c.sock", mode=0o600, dir_mode=0o700)
    sock.close()
    assert stat.S_IMODE(folder.lstat().st_mode) == 0o700


def test_bound_socket_accepts_connections(short_dir: Path) -> None:
    path = short_dir / "c.sock"
    server = bind_socket(path, mode=0o600)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(path))
        conn, _ = server.accept()
        send_frame(client, {"hello": 1})
        assert recv_frame(conn) == ({"hello": 1}, [])
        conn.close()
    finally:
        client.close()
        server.close()


def test_stale_socket_is_replaced(short_dir: Path) -> None:
    path = short_dir / "c.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with pytest.raises(ConnectionRefusedError):
        probe.connect(str(path))
    probe.close()
    sock = bind_socket(path, mode=0o600)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(path))  # the path now leads to the new, listening socket
    finally:
        client.close()
        sock.close()


def test_regular_file_at_the_socket_path_is_refused_and_kept(short_dir: Path) -> None:
    path = short_dir / "c.sock"
    path.write_text("someone's data")
    with pytest.raises(StateError, match="not a socket"):
        bind_socket(path, mode=0o600)
    assert path.read_text() == "someone's data"


def test_folder_at_the_socket_path_is_refused(short_dir: Path) -> None:
    path = short_dir / "c.sock"
    path.mkdir()
    with pytest.raises(StateError, match="not a socket"):
        bind_socket(path, mode=0o600)
    assert path.is_dir()


def test_link_to_a_socket_at_the_socket_path_is_refused(short_dir: Path) -> None:
    victim = short_dir / "victim.sock"
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(victim))
    try:
        path = short_dir / "c.sock"
        path.symlink_to(victim)
        with pytest.raises(StateError, match="not a socket"):
            bind_socket(path, mode=0o666)
        assert stat.S_ISSOCK(victim.lstat().st_mode), "the link's target must be left alone"
    finally:
        other.close()


def test_linked_socket_folder_is_refused(short_dir: Path) -> None:
    real = short_dir / "elsewhere"
    real.mkdir(mode=0o700)
    (short_dir / "run").symlink_to(real)
    with pytest.raises(StateError, match="not a directory"):
        bind_socket(short_dir / "run" / "c.sock", mode=0o666, dir_mode=0o755)
    assert stat.S_IMODE(real.lstat().st_mode) == 0o700, "the link's target must keep its mode"


_OPS = {"ping": frozenset({"op"}), "close": frozenset({"op", "id"})}


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        ({}, "op must be one of"),
        ({"op": "drop"}, "op must be one of"),
        ({"op": ["ping"]}, "op must be one of"),
        ({"op": "close"}, r"missing keys \['id'\]"),
        ({"op": "ping", "id": "x"}, r"unknown keys \['id'\]"),
    ],
)
def test_checked_op_refuses_unknown_ops_and_other_keys(frame: dict[str, object], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        checked_op(frame, _OPS)


def test_checked_op_names_a_well_formed_frames_op() -> None:
    assert checked_op({"op": "close", "id": "x"}, _OPS) == "close"
