"""The controller's side of the proxy's admin socket: open and close a sandbox's listener, and
the stop and pause flags the proxy reads on every request.

The proxy (its own system user) binds each listener; the controller binds that socket into the
sandbox, where the relay serves it on 127.0.0.1. Flags are marker files the controller writes in
a root-owned folder and the proxy only reads, uncached, on every request and tunnel.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from pathlib import Path
from typing import Any

from lnk_controller.config import ControllerConfig
from lnk_shared.errors import LaunchRefused, StateError
from lnk_shared.grants import Grants
from lnk_shared.unix import recv_frame, send_frame

__all__ = [
    "PROXY_PORT",
    "PROXY_SOCKET_INSIDE",
    "clear_flags",
    "close_listener",
    "open_listener",
    "proxy_env",
    "relay_port",
    "set_flag",
]

PROXY_SOCKET_INSIDE = "/run/lnk-proxy.sock"  # where the listener is bound inside the sandbox
PROXY_PORT = 3128  # the relay's port on the sandbox's own loopback (squid's, by habit)
ADMIN_TIMEOUT_S = 5.0  # the proxy answers at once; longer means it is stuck
SECRET_BYTES = 32  # the per-sandbox proxy secret (for the page-opening endpoint, later)


def _call(cfg: ControllerConfig, message: dict[str, Any]) -> dict[str, Any]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(ADMIN_TIMEOUT_S)
    try:
        sock.connect(str(cfg.proxy_admin_socket))
        send_frame(sock, message)
        answer, fds = recv_frame(sock)
        for fd in fds:
            os.close(fd)
    except (OSError, EOFError, ValueError) as exc:
        # A service of the box that does not answer is the box's state (exit 1), as the store
        # bridge's is (bridge_link): not a rule's refusal.
        raise StateError(
            f"the filtering proxy does not answer at {cfg.proxy_admin_socket} ({exc}); "
            "`lnk box up` starts it"
        ) from None
    finally:
        sock.close()
    return answer


def open_listener(cfg: ControllerConfig, sandbox_id: str, grants: Grants) -> Path:
    """Ask the proxy for this sandbox's listener; return the socket's path on the host."""
    spec = grants.spec
    path = cfg.proxy_dir / f"{sandbox_id}.sock"
    answer = _call(
        cfg,
        {
            "op": "open",
            "sandbox": sandbox_id,
            "socket": str(path),
            "grants": {
                "internet_any": spec.internet_any,
                "internet": [str(h) for h in spec.internet],
                "lan_any": spec.lan_any,
                "lan": [str(e) for e in spec.lan],
                "localhost_ports": list(spec.ports),
            },
            "secret": secrets.token_hex(SECRET_BYTES),
        },
    )
    if answer.get("ok") is not True:
        raise LaunchRefused(
            "the filtering proxy", f"it refused the listener: {answer.get('error')}"
        )
    return path


def close_listener(cfg: ControllerConfig, sandbox_id: str) -> None:
    """Close the listener and every tunnel of the sandbox; remove its socket even if the proxy
    is gone."""
    problem = None
    try:
        answer = _call(cfg, {"op": "close", "sandbox": sandbox_id})
        if answer.get("ok") is not True:
            problem = str(answer.get("error"))
    except (LaunchRefused, StateError) as exc:
        problem = str(exc)
    with contextlib.suppress(FileNotFoundError):
        (cfg.proxy_dir / f"{sandbox_id}.sock").unlink()
    if problem and "does not answer" not in problem:
        raise StateError(f"the proxy did not close the listener of {sandbox_id}: {problem}")


def set_flag(cfg: ControllerConfig, sandbox_id: str, flag: str, on: bool) -> None:
    """`stop` or `pause`: a marker file the proxy checks on every request."""
    if flag not in ("stop", "pause"):
        raise ValueError(f"unknown flag {flag!r}")
    path = cfg.flags_dir / f"{sandbox_id}.{flag}"
    if on:
        cfg.flags_dir.mkdir(mode=0o755, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        os.close(fd)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def clear_flags(cfg: ControllerConfig, sandbox_id: str) -> None:
    for flag in ("stop", "pause"):
        set_flag(cfg, sandbox_id, flag, False)


def relay_port(localhost_ports: tuple[int, ...]) -> int:
    """The relay's port: PROXY_PORT unless a `[localhost]` port takes it, then the next free."""
    port = PROXY_PORT
    while port in localhost_ports:
        port += 1
    return port


def proxy_env(port: int = PROXY_PORT) -> dict[str, str]:
    """What common clients read to use a proxy (curl, pip, git, Python, Node, gRPC)."""
    url = f"http://127.0.0.1:{port}"
    names = (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "GRPC_PROXY",
        "grpc_proxy",
    )
    env = dict.fromkeys(names, url)
    env.update({"NO_PROXY": "", "no_proxy": "", "NODE_USE_ENV_PROXY": "1"})
    return env
