"""The one client of the controller's API socket that every `lnk` command uses.

Every failure is an `LnkError` with the exit status the README gives: the transport's (no
socket, nobody listening, not allowed, no answer, a reset or a cut answer: `StateError`, naming
the controller's log) and the controller's own (its answer's body names the error's class, which
`lnk_shared.api_errors` makes again here). Imported when a command calls, never at start.
"""

from __future__ import annotations

from typing import Any

from lnk_shared.api_client import API_TIMEOUT_S, api_request
from lnk_shared.api_errors import refused_answer
from lnk_shared.errors import StateError
from lnk_shared.paths import BoxPaths

__all__ = ["call", "request"]

NOT_FOUND = 404


def request(
    method: str,
    url: str,
    body: dict[str, Any] | None = None,
    *,
    timeout: float = API_TIMEOUT_S,
    box: BoxPaths | None = None,
) -> tuple[int, Any]:
    """One request to the controller: (HTTP status, decoded body); transport failures raise."""
    box = box or BoxPaths.from_env()
    return api_request(
        box.controller_socket, method, url, body, timeout=timeout, log=box.log_of("controller")
    )


def call(
    method: str,
    url: str,
    body: dict[str, Any] | None = None,
    *,
    not_found: str | None = None,
    timeout: float = API_TIMEOUT_S,
    box: BoxPaths | None = None,
) -> Any:
    """The controller's answer to one request, or the error it said (`not_found`: the words
    for a 404, which the controller gives alike for what is not there and what is not yours)."""
    status, doc = request(method, url, body, timeout=timeout, box=box)
    if status == NOT_FOUND and not_found is not None:
        raise StateError(not_found)
    if status >= 400:
        raise refused_answer(status, doc)
    return doc
