"""The controller's side of the store bridge's admin socket: deliver a message to an agent's
inbox, open and close an agent's socket, and forget an agent (everything the store keeps for it).

The bridge runs as its own system user and answers only the controller's uid (SO_PEERCRED).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from lnk_shared.admin_socket import admin_socket_in, call_admin
from lnk_shared.errors import StateError
from lnk_shared.proofs import AGENT_ID

__all__ = [
    "bridge_admin_socket",
    "close_agent",
    "forget_agent",
    "open_agent",
    "open_agents",
    "send_message",
]

ADMIN_TIMEOUT_S = 10.0  # the bridge answers at once, after one SQLite write at most


def bridge_admin_socket(run_dir: Path) -> Path:
    return admin_socket_in(run_dir, "bridge-store")


def _call(run_dir: Path, message: dict[str, Any]) -> dict[str, Any]:
    answer, fds = call_admin(
        bridge_admin_socket(run_dir), message, service="store bridge", timeout=ADMIN_TIMEOUT_S
    )
    for fd in fds:
        os.close(fd)
    if answer.get("ok") is not True:
        raise StateError(f"the store bridge refused: {answer.get('error')}")
    return answer


def store_driver(run_dir: Path) -> str:
    """The database driver the box's store bridge keeps agents' stores with ("sqlite", ...)."""
    driver = _call(run_dir, {"op": "ping"}).get("driver")
    if not isinstance(driver, str) or not driver:
        raise StateError("the store bridge did not say which database driver it runs")
    return driver


def open_agents(run_dir: Path) -> list[str]:
    """The agents whose sockets the bridge holds open now."""
    untrusted = _call(run_dir, {"op": "ping"}).get("open")
    if not isinstance(untrusted, list) or not all(
        isinstance(a, str) and AGENT_ID.fullmatch(a) for a in untrusted
    ):
        raise StateError("the store bridge did not say which agents' sockets are open")
    return list(untrusted)


def send_message(run_dir: Path, agent_id: str, sender: str, message: str) -> int:
    """Queue `message` in the agent's inbox; its id there."""
    answer = _call(run_dir, {"op": "send", "agent": agent_id, "sender": sender, "message": message})
    sent = answer.get("id")
    if type(sent) is not int:
        raise StateError("the store bridge answered without a message id")
    return sent


def open_agent(run_dir: Path, agent_id: str, public_key: str, host_uid: int) -> Path:
    """Ask the bridge for the agent's socket, for calls from `host_uid` only; its path."""
    answer = _call(
        run_dir,
        {"op": "open", "agent": agent_id, "public_key": public_key, "host_uid": host_uid},
    )
    path = answer.get("socket")
    if not isinstance(path, str) or not Path(path).is_relative_to(run_dir / "bridge-store"):
        raise StateError(f"the store bridge answered an unexpected socket {path!r}")
    return Path(path)


def close_agent(run_dir: Path, agent_id: str) -> None:
    """Close the agent's socket; closing one that is not open is not an error, nor is a bridge
    that is not running (its sockets died with it): the file is removed either way."""
    try:
        _call(run_dir, {"op": "close", "agent": agent_id})
    except StateError as exc:
        if "does not answer" not in str(exc):
            raise
    folder = run_dir / "bridge-store" / "agents" / agent_id
    with contextlib.suppress(FileNotFoundError):
        (folder / "bridge.sock").unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()


def forget_agent(run_dir: Path, agent_id: str) -> int:
    """Close the agent's socket and remove its conversations, lease, nonces and inbox from the
    store; the rows removed. A bridge that does not answer is a StateError: an agent is not
    forgotten by halves (its store would wait for a new agent of the same name)."""
    removed = _call(run_dir, {"op": "forget", "agent": agent_id}).get("removed")
    if type(removed) is not int:
        raise StateError("the store bridge answered a forget without the rows it removed")
    return removed
