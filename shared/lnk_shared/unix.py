"""Local unix sockets: who is calling (SO_PEERCRED), passing descriptors (SCM_RIGHTS), bounded
JSON frames. (The HTTP client for a service's API socket is `api_client`, kept apart so
commands that do not call an API never import http.client.)

Every frame read here comes from another process, maybe a sandbox's: it is size-bounded, must be
a JSON object with no duplicate keys, and is returned as `untrusted_…` data for a validator.
What this does NOT do: authenticate beyond the kernel's peer credentials, or encrypt anything.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
from collections import namedtuple

from lnk_shared.errors import StateError
from lnk_shared.frames import MAX_FDS, MAX_FRAME, no_duplicate_keys

# typing.TYPE_CHECKING without importing typing, which `lnk sandbox run` never needs.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path
    from typing import Any, NamedTuple

__all__ = [
    "MAX_FDS",
    "MAX_FRAME",
    "PeerCred",
    "bind_socket",
    "checked_op",
    "peer_cred",
    "recv_frame",
    "send_frame",
]

_HEADER = struct.Struct(">I")  # HEADER_BYTES
_CRED = struct.Struct("3i")


if TYPE_CHECKING:

    class PeerCred(NamedTuple):
        pid: int
        uid: int
        gid: int

else:  # the same, without importing typing (or dataclasses) into `lnk sandbox run`
    PeerCred = namedtuple("PeerCred", "pid uid gid")


def peer_cred(sock: socket.socket) -> PeerCred:
    """The kernel's word on who is at the other end (as of connect), never the peer's claim."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    pid, uid, gid = _CRED.unpack(raw)
    return PeerCred(pid=pid, uid=uid, gid=gid)


def bind_socket(
    path: Path, *, mode: int, dir_mode: int = 0o755, backlog: int = 64
) -> socket.socket:
    """Bind a listening stream socket at `path`, its directory and file modes set explicitly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    info = path.parent.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise StateError(f"{path.parent} is not a directory; remove it and start again")
    os.chmod(path.parent, dir_mode)
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
        else:
            raise StateError(f"{path} exists and is not a socket; remove it and start again")
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, mode)
    sock.listen(backlog)
    return sock


def send_frame(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message, separators=(",", ":")).encode("utf-8")
    if len(data) > MAX_FRAME:
        raise ValueError(f"frame of {len(data)} bytes is over the limit of {MAX_FRAME}")
    payload = _HEADER.pack(len(data)) + data
    if fds:
        if len(fds) > MAX_FDS:
            raise ValueError(f"{len(fds)} descriptors is over the limit of {MAX_FDS}")
        socket.send_fds(sock, [payload[:1]], fds)
        payload = payload[1:]
    sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int, fds: list[int], want_fds: bool) -> bytes:
    chunks = b""
    while len(chunks) < n:
        if want_fds and not chunks:
            data, got, flags, _ = socket.recv_fds(sock, n, MAX_FDS)
            fds.extend(got)
            if flags & socket.MSG_CTRUNC:
                raise ValueError("too many descriptors in one frame")
        else:
            data = sock.recv(n - len(chunks))
        if not data:
            raise EOFError("the peer closed the connection")
        chunks += data
    return chunks


def recv_frame(sock: socket.socket, *, want_fds: bool = False) -> tuple[dict[str, Any], list[int]]:
    """Read one frame: (untrusted message, descriptors received). Closes fds on a bad frame."""
    fds: list[int] = []
    try:
        header = _recv_exact(sock, _HEADER.size, fds, want_fds)
        (length,) = _HEADER.unpack(header)
        if length > MAX_FRAME:
            raise ValueError(f"frame of {length} bytes is over the limit of {MAX_FRAME}")
        body = _recv_exact(sock, length, fds, False)
        message = json.loads(body.decode("utf-8"), object_pairs_hook=no_duplicate_keys)
        if not isinstance(message, dict):
            raise ValueError("a frame must be a JSON object")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return message, fds


def checked_op(untrusted: dict[str, Any], keys_by_op: Mapping[str, frozenset[str]]) -> str:
    """The frame's "op", once it is a known one and the frame has exactly that op's keys;
    ValueError saying what is wrong (an admin socket's commands are checked this way)."""
    op = untrusted.get("op")
    if not isinstance(op, str) or op not in keys_by_op:
        raise ValueError(f"op must be one of {sorted(keys_by_op)}")
    keys = set(untrusted)
    if keys != keys_by_op[op]:
        missing, extra = sorted(keys_by_op[op] - keys), sorted(keys - keys_by_op[op])
        raise ValueError(f"{op}: missing keys {missing}, unknown keys {extra}")
    return op
