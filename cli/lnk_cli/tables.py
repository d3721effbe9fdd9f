"""Plain text tables for people: a header, then columns padded to their widest cell.

Cells are text already made safe to show (`lnk_shared.display.shown`): this module only lays
them out. The last column is neither padded (no trailing spaces) nor cut (nothing follows it
to push apart: a path there stays whole); a cell of another column longer than the cap is cut
with an ellipsis, so one long value does not push every row apart.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["CELL_CAP", "GAP", "table"]

GAP = "  "  # between columns: two spaces, as `ps` and `docker ps` separate theirs
CELL_CAP = 60  # characters a cell shows at most: a long command must not wrap every row


def _cut(cell: str, cap: int) -> str:
    return cell if len(cell) <= cap else cell[: cap - 1] + "…"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], cap: int = CELL_CAP) -> list[str]:
    """The lines of a table of `rows` under `header` (every row as long as the header)."""
    cells = [[*(_cut(c, cap) for c in row[:-1]), *row[-1:]] for row in [header, *rows]]
    if any(len(row) != len(header) for row in cells):
        raise ValueError("every row of a table has one cell per column")
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        GAP.join(c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True))
        + (GAP if len(row) > 1 else "")
        + row[-1]
        for row in cells
    ]
