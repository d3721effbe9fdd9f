"""Helpers for the store bridge's e2e tests: talk to its admin socket as the controller (root),
and run a call in a forked child under another uid, as an agent's sandbox would (so SO_PEERCRED
is that uid's)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnk_shared.unix import recv_frame, send_frame

__all__ = ["as_uid", "bridge_admin"]


def bridge_admin(run_dir: Path, message: dict[str, Any]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(run_dir / "bridge-store" / "admin.sock"))
        send_frame(sock, message)
        return recv_frame(sock)[0]


def as_uid(uid: int, work: Callable[[], Any]) -> Any:
    """`work()` in a forked child with uid and gid `uid` and no groups: its JSON result, or
    {"exception": text} when it raised."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            try:
                result = work()
            except Exception as exc:
                result = {"exception": f"{type(exc).__name__}: {exc}"}
            os.write(write_end, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data or b"null")
