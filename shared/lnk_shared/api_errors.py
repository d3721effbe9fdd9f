"""An API's error answers, both ways: the body a service sends for an `LnkError` and the error a
client makes of it again, so a command exits as the error would have in the service's process.

The body is `{"detail": message, "error": [its class and each base up to LnkError], "exit": N,
"run_exit": R}`. The client takes the first name it knows among `lnk_shared.errors`' classes (a
service's own subclass is known by its base there), so the error class, and with it both exit
statuses, crosses the socket; a body without one (FastAPI's own answers, `HTTPException`) is
judged by its `"exit"`, else by the HTTP status. Pure: no sockets, no I/O.
"""

from __future__ import annotations

from typing import Any

from lnk_shared import errors
from lnk_shared.errors import (
    EXIT_ERROR,
    EXIT_REFUSED,
    EXIT_USAGE,
    LnkError,
    RefusedError,
    StateError,
    UsageError,
)

__all__ = [
    "ERROR_STATUSES",
    "USAGE_STATUSES",
    "error_answer",
    "known_error",
    "refusal_text",
    "refused_answer",
]

# The answers that say the caller's own words are wrong (a name the API's model refuses, a
# number out of range, a body too large): a usage error, exit 2, like argparse's. Every other
# refusal (not yours, not found, not in that state) is the box's answer about its state: exit 1.
USAGE_STATUSES = frozenset({400, 413, 422})
# The HTTP status of an LnkError's answer, by its exit status: the caller's words (422), a
# rule's refusal (403), anything else the box's state (409). The body says the rest.
ERROR_STATUSES = {EXIT_USAGE: 422, EXIT_REFUSED: 403}
STATE_STATUS = 409
# A body's "exit" without a class it names: the base error of that status.
BY_EXIT: dict[int, type[LnkError]] = {
    EXIT_ERROR: StateError,
    EXIT_USAGE: UsageError,
    EXIT_REFUSED: RefusedError,
}
MAX_NAMES = 16  # class names in one body: deeper than any tree of ours, so more is not ours
# A launch refusal's words, shown already and with statuses of its own instance: never made
# from an API body (its words would skip the CLI's `shown_lines`).
NOT_HEARD = frozenset({"RemoteError"})
SAID = "the controller refused"  # how the client's message starts: whose words follow


def error_answer(exc: LnkError) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body that carry `exc` to a client (`refused_answer` reads it)."""
    names = [k.__name__ for k in type(exc).__mro__ if issubclass(k, LnkError)]
    body = {
        "detail": str(exc),
        "error": names,
        "exit": exc.exit_code,
        "run_exit": exc.run_exit_code,
    }
    return ERROR_STATUSES.get(exc.exit_code, STATE_STATUS), body


def known_error(names: object) -> type[LnkError] | None:
    """The first of `names` (an answer's "error" list) that is one of lnk_shared.errors'
    classes, or None: any other value, or a name that is not an error class there."""
    if not isinstance(names, list):
        return None
    for name in names[:MAX_NAMES]:
        if not isinstance(name, str) or name not in errors.__all__ or name in NOT_HEARD:
            continue
        found = getattr(errors, name)
        if isinstance(found, type) and issubclass(found, LnkError):
            return found
    return None


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


def refused_answer(status: int, doc: Any) -> LnkError:
    """The error for a service's refusal (`status` >= 400, its JSON body `doc`), one line: the
    class the body names, else the base error of its `"exit"`, else by the HTTP status."""
    detail = doc.get("detail") if isinstance(doc, dict) else doc
    said = f"{SAID}: {refusal_text(detail) if detail not in (None, '') else status}"
    if isinstance(doc, dict):
        named = known_error(doc.get("error"))
        if named is not None:
            return named.said(said)
        code = doc.get("exit")
        if type(code) is int and code in BY_EXIT:
            return BY_EXIT[code].said(said)
    return UsageError(said) if status in USAGE_STATUSES else StateError(said)
