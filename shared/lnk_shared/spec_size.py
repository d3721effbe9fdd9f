"""How large a spec may be, and the check both sides make before anything parses one.

Kept apart from `spec_file` (which imports tomllib and re) so that the quick path of
`lnk sandbox run` can refuse an oversized spec file before it sends it, importing only `os`.
The C client (`lnk_client.c`, SPEC_MAX_BYTES) makes the same check with the same words; the
controller reads the spec through `spec_file.read_spec_text`, which reads at most one byte past
the limit, so a client that skips this check still gets nothing parsed.
"""

from __future__ import annotations

import os
import stat

from lnk_shared.errors import SpecError

__all__ = ["MAX_SPEC_BYTES", "refuse_oversized_spec", "spec_too_large"]

# A spec is a few lines (the largest real ones are a few KiB); anything this large is not one,
# and parsing it (tomllib, then every path resolved) would be time and memory spent on an
# attacker's file before a single rule had read it.
MAX_SPEC_BYTES = 256 * 1024


def spec_too_large(size: int) -> str:
    """The problem, for a SpecError naming the file: `size` is what was seen (at least)."""
    return (
        f"the spec is larger than {MAX_SPEC_BYTES} bytes ({MAX_SPEC_BYTES // 1024} KiB; "
        f"this one has {size} or more): a spec is a few lines of TOML, so this is not one"
    )


def refuse_oversized_spec(fd: int, source: str) -> None:
    """SpecError if the regular file open on `fd` is over MAX_SPEC_BYTES (the client's check,
    before it passes the file: what is not a regular file the controller refuses itself)."""
    info = os.fstat(fd)
    if stat.S_ISREG(info.st_mode) and info.st_size > MAX_SPEC_BYTES:
        raise SpecError(spec_too_large(info.st_size), source=source)
