"""What a frame on the box's unix sockets may be: its bounds, and JSON objects without
duplicate keys. `lnk_shared.unix` reads and writes frames with these; the quick path of
`lnk sandbox run` speaks them without importing json or socket, so this module imports nothing.
"""

from __future__ import annotations

# typing.TYPE_CHECKING without importing typing, which `lnk sandbox run` never needs.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

__all__ = ["HEADER_BYTES", "MAX_FDS", "MAX_FRAME", "no_duplicate_keys"]

MAX_FRAME = 1 << 20  # a launch request or reply is a few KiB; a larger frame is an attack
MAX_FDS = 64  # stdio, a terminal, a spec file and the granted folders: far below this
HEADER_BYTES = 4  # a frame's length, big-endian, before its JSON


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's `object_pairs_hook`: a key given twice is refused, not "last one wins"
    (two readers could otherwise see two different objects)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out
