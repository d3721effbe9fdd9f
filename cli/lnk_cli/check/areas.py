"""Which area of the wall a probe tries, from its id: what the check's table groups by.

A probe's id starts with its kind (`read.home`, `server:127.0.0.1`, `kernel:bpf`): the kind up to
the first `.` or `:` (a trailing `-N` dropped) names its area through `AREAS`; a kind the table
does not know is its own area, so a probe added later is shown, grouped with its kind, without
a change here. The areas are a reading aid only: the verdicts and the JSON report do not use
them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["AREAS", "area_of", "in_order"]

# kind -> area. Each area a question a reader asks: what could it read, write, run, which
# kernel interfaces, which network, through the proxy, which services, what of this machine it
# sees, what of the caller's side reaches it, the judging race, its limits.
AREAS = {
    "read": "read",
    "list": "read",
    "write": "write",
    "link": "write",
    "placeholder": "write",
    "mode": "write",
    "login-path": "write",
    "dev": "write",
    "exec": "exec",
    "kernel": "kernel",
    "privilege": "kernel",
    "confiner": "kernel",
    "server": "network",
    "port": "network",
    "abstract-socket": "network",
    "internet": "network",
    "internet-host": "network",
    "lan-host": "network",
    "proxy": "proxy",
    "service": "services",
    "services": "services",
    "model": "services",
    "host": "machine",
    "identity": "machine",
    "environ": "caller",
    "terminal": "caller",
    "stdout": "caller",
    "stderr": "caller",
    "stdin": "caller",
    "cmdline": "caller",
    "staging": "caller",
    "swap": "judging",
    "limits": "limits",
}
_KIND = re.compile(r"[^.:]*")
_NUMBERED = re.compile(r"-\d+$")
UNNAMED = "other"  # an id that names no kind at all


def area_of(probe_id: str) -> str:
    """The area a probe's id names (its kind's, or the kind itself when the table lacks it)."""
    match = _KIND.match(probe_id)
    kind = _NUMBERED.sub("", match.group(0) if match else "")
    return AREAS.get(kind, kind or UNNAMED)


def in_order(ids: Iterable[str]) -> list[str]:
    """The areas of `ids`, each once, in the order they first come (the plan's order)."""
    seen: dict[str, None] = {}
    for probe_id in ids:
        seen.setdefault(area_of(probe_id), None)
    return list(seen)
