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

from lnk_shared.api_errors import USAGE_STATUSES, refusal_text, refused_answer
from lnk_shared.errors import StateError, UsageError
from lnk_shared.unix import MAX_FRAME

__all__ = [
    "API_TIMEOUT_S",
    "USAGE_STATUSES",
    "UnixHTTPConnection",
    "api_request",
    "path_segment",
    "refusal_text",
    "refused_answer",
]

API_TIMEOUT_S = 30.0  # a stop cleans a whole sandbox away before it answers; past this, stuck


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
    path: Path,
    method: str,
    url: str,
    body: dict[str, Any] | None = None,
    *,
    timeout: float = API_TIMEOUT_S,
    log: str = "its log",
) -> tuple[int, Any]:
    """One JSON request to a service's API socket: (status, decoded JSON body or None).

    Every way the exchange can fail is a StateError saying what happened and, where the
    service itself went wrong, `log` (where to read why): no socket or nobody listening (the
    box is not running), not allowed, no answer in `timeout` seconds, the connection reset or
    closed before a whole answer, an answer too large or not JSON."""
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
        except TimeoutError:
            raise StateError(f"{path} did not answer in {timeout:g} s; see {log}") from None
        except (OSError, http.client.HTTPException) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else _said(exc)
            raise StateError(f"the connection to {path} broke ({why}); see {log}") from None
        if len(raw) > MAX_FRAME:
            raise StateError(f"the answer from {path} was larger than {MAX_FRAME} bytes")
        if response.length:  # what its Content-Length promised and never came
            raise StateError(
                f"the connection to {path} broke (the answer was cut short); see {log}"
            )
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            raise StateError(
                f"{path} answered {response.status} with a body that is not JSON; see {log}"
            ) from None
        return response.status, decoded
    finally:
        conn.close()


def _said(exc: BaseException) -> str:
    """A transport failure's words: http.client's own are often empty or a whole raw line."""
    text = str(exc).strip()
    return type(exc).__name__ if not text else f"{type(exc).__name__}: {text[:80]!r}"


def path_segment(value: str, what: str) -> str:
    """`value` as one segment of an API path: never empty (that would name the collection, not
    an item) and quoted whole, so a name with `/`, `?`, spaces or controls stays one name and
    the controller answers "no such …" for it, as for any name it does not know."""
    if not value:
        raise UsageError(f"name the {what}: it cannot be empty")
    return urllib.parse.quote(value, safe="")
