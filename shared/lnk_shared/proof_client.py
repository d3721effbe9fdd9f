"""The agent's side of a bridge call: sign it with the agent's own key, send it over the
bridge's unix socket, read the one reply.

A call is one frame (`lnk_shared.unix`) holding the signed wire object of `lnk_shared.proofs`,
whose body is the call's arguments as compact JSON; the reply is `{"ok": true, "result": ...}`
or `{"ok": false, "error": "..."}`, raised here as `BridgeError`.

What this does NOT do: keep the key from anyone who can read the key file (that is the
sandbox's wall), or retry a call (a retried append could land twice; the store's expected
sequence number makes that a conflict, not a duplicate).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from lnk_shared.errors import LnkError, StateError
from lnk_shared.proofs import DEFAULT_MAX_LIFETIME_S, sign_call
from lnk_shared.unix import recv_frame, send_frame

__all__ = [
    "BridgeError",
    "ProofSigner",
    "bridge_address",
    "call_bridge",
    "encode_body",
    "load_private_key",
]

KEY_FILE_MAX_BYTES = 4096  # an Ed25519 key in PEM is 119 bytes: bounds the read
CALL_TIMEOUT_S = 30.0  # a store call waits at most for SQLite's busy budget
LOOPBACK = "127.0.0.1"  # inside an agent's sandbox a relay serves its bridge there

Address = Path | tuple[str, int]


class BridgeError(LnkError):
    """The bridge answered with a refusal or an error; the message is the bridge's."""


def encode_body(args: dict[str, Any]) -> bytes:
    return json.dumps(args, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The agent's private key from its PEM (PKCS#8) file; `StateError` naming the file.

    The file must be a regular file of the caller's own that nobody else may read (no group
    or other bits: the box writes it 0400), at most `KEY_FILE_MAX_BYTES`: a key another user
    could read or replace is not this agent's alone. The C client
    (lnk_cli/native/lnk_client_proof.c) refuses the same, with the same messages."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        raise StateError(f"cannot read the agent's key {path}: {exc}") from None
    try:
        pem = _key_file_bytes(fd, path)
    finally:
        os.close(fd)
    try:
        key = load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise StateError(f"cannot read the agent's key {path}: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise StateError(f"{path} is not an Ed25519 private key")
    return key


def _key_file_bytes(fd: int, path: Path) -> bytes:
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "it is not a regular file"
    elif info.st_uid != os.geteuid():
        problem = f"it is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
    elif info.st_mode & 0o077:
        mode = stat.S_IMODE(info.st_mode)
        problem = f"its mode {mode:04o} lets others read it (an agent's key is 0400 or 0600)"
    if problem is None:
        pem = os.read(fd, KEY_FILE_MAX_BYTES + 1)
        if len(pem) <= KEY_FILE_MAX_BYTES:
            return pem
        problem = f"it is larger than {KEY_FILE_MAX_BYTES} bytes: not an agent's key"
    raise StateError(f"cannot read the agent's key {path}: {problem}")


@dataclass(frozen=True)
class ProofSigner:
    agent: str
    key: Ed25519PrivateKey
    audience: str
    lifetime_s: int = DEFAULT_MAX_LIFETIME_S

    def sign(self, action: str, body: bytes, now: float | None = None) -> dict[str, Any]:
        return sign_call(
            self.key,
            agent=self.agent,
            audience=self.audience,
            action=action,
            body=body,
            now=time.time() if now is None else now,
            lifetime_s=self.lifetime_s,
        )


def bridge_address(text: str) -> Address:
    """A bridge's socket path, or `127.0.0.1:PORT` (the relay inside an agent's sandbox)."""
    if text.startswith("/"):
        return Path(text)
    host, _, port = text.rpartition(":")
    if host != LOOPBACK or not port.isdigit() or not 0 < int(port) < 65536:
        raise StateError(f"{text!r} is neither a socket path nor {LOOPBACK}:PORT")
    return (host, int(port))


def call_bridge(
    path: Address,
    signer: ProofSigner,
    action: str,
    args: dict[str, Any],
    *,
    timeout: float = CALL_TIMEOUT_S,
) -> Any:
    """One signed call; the bridge's result, or `BridgeError` with its message."""
    frame = signer.sign(action, encode_body(args))
    try:
        family = socket.AF_UNIX if isinstance(path, Path) else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path) if isinstance(path, Path) else path)
            send_frame(sock, frame)
            reply, _ = recv_frame(sock)
    except (OSError, EOFError, ValueError) as exc:
        raise StateError(f"cannot reach the bridge at {path}: {exc}") from None
    if reply.get("ok") is True:
        return reply.get("result")
    error = reply.get("error")
    raise BridgeError(error if isinstance(error, str) else "the bridge answered with an error")
