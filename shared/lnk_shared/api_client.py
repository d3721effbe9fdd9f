"""A small JSON-over-HTTP client for a service's API socket (a unix socket).

Kept out of `unix` so that commands which never call an API do not pay for importing
http.client (and ssl, which it imports) at every start.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
from pathlib import Path
from typing import Any

from lnk_shared.errors import (
    EXIT_ERROR,
    EXIT_REFUSED,
    EXIT_RUN_ERROR,
    EXIT_RUN_REFUSED,
    EXIT_USAGE,
    LnkError,
    StateError,
    UsageError,
)
from lnk_shared.unix import MAX_FRAME

__all__ = [
    "USAGE_STATUSES",
    "ServiceRefusal",
    "UnixHTTPConnection",
    "api_request",
    "path_segment",
    "refusal_text",
    "refused_answer",
]

# The answers that say the caller's own words are wrong (a name the API's model refuses, a
# number out of range, a body too large): a usage error, exit 2, like argparse's. Every other
# refusal (not yours, not found, not in that state) is the box's answer about its state: exit 1.
USAGE_STATUSES = frozenset({400, 413, 422})


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a unix socket path (the host name is only for the Host header)."""

    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def api_request(
    path: Path, method: str, url: str, body: dict[str, Any] | None = None, *, timeout: float = 30.0
) -> tuple[int, Any]:
    """One JSON request to a service's API socket: (status, decoded JSON body or None)."""
    conn = UnixHTTPConnection(path, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        data = json.dumps(body).encode() if body is not None else None
        try:
            conn.request(method, url, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read(MAX_FRAME + 1)
        except (FileNotFoundError, ConnectionRefusedError):
            raise StateError(
                f"the box is not running (no service at {path}); start it with `lnk box up`"
            ) from None
        except PermissionError:
            raise StateError(f"not allowed to use {path}") from None
        if len(raw) > MAX_FRAME:
            raise StateError(f"the answer from {path} was larger than {MAX_FRAME} bytes")
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            raise StateError(
                f"{path} answered {response.status} with a body that is not JSON; see its log"
            ) from None
        return response.status, decoded
    finally:
        conn.close()


def path_segment(value: str, what: str) -> str:
    """`value` as one segment of an API path: never empty (that would name the collection, not
    an item) and quoted whole, so a name with `/`, `?`, spaces or controls stays one name and
    the controller answers "no such …" for it, as for any name it does not know."""
    if not value:
        raise UsageError(f"name the {what}: it cannot be empty")
    return urllib.parse.quote(value, safe="")


def refusal_text(detail: Any) -> str:
    """A controller's refusal as one line: FastAPI's validation list (`[{"loc": [...], "msg":
    ...}]`) as `field: message; ...`, anything else as text."""
    if isinstance(detail, list) and all(isinstance(d, dict) for d in detail):
        parts = []
        for item in detail:
            loc = [str(p) for p in item.get("loc", []) if p not in ("body", "query", "path")]
            parts.append(f"{'.'.join(loc) or 'the request'}: {item.get('msg', 'is not valid')}")
        return "; ".join(parts)
    return str(detail)


class ServiceRefusal(LnkError):
    """A service's own error, said by its API with the exit status it has there (1, 2 or 3)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.exit_code = code
        self.run_exit_code = EXIT_RUN_REFUSED if code == EXIT_REFUSED else EXIT_RUN_ERROR


def refused_answer(status: int, doc: Any) -> LnkError:
    """The error for a service's refusal (`status` >= 400, its JSON body `doc`), one line: the
    status the service's own error has (`"exit"` in the body), else by the HTTP status."""
    detail = doc.get("detail") if isinstance(doc, dict) else doc
    said = f"the controller refused: {refusal_text(detail) if detail not in (None, '') else status}"
    code = doc.get("exit") if isinstance(doc, dict) else None
    if type(code) is int and code in (EXIT_ERROR, EXIT_USAGE, EXIT_REFUSED):
        return ServiceRefusal(said, code)
    return UsageError(said) if status in USAGE_STATUSES else StateError(said)
