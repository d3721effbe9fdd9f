"""Tables for people (lnk_cli.tables) and `lnk sandbox list`'s, with and without owners."""

from __future__ import annotations

import pytest

from lnk_cli import sandbox_commands
from lnk_cli.tables import CELL_CAP, table


@pytest.mark.parametrize(
    ("header", "rows", "lines"),
    [
        (["A"], [], ["A"]),
        (["A", "B"], [["x", "y"]], ["A  B", "x  y"]),
        (
            ["ID", "STATE"],
            [["s1", "running"], ["s22", "ended"]],
            ["ID   STATE", "s1   running", "s22  ended"],
        ),
        (["ID", "CMD"], [["long-id", ""]], ["ID       CMD", "long-id  "]),
    ],
)
def test_columns_are_padded_to_their_widest_cell(
    header: list[str], rows: list[list[str]], lines: list[str]
) -> None:
    assert table(header, rows) == lines


def test_a_long_cell_is_cut_with_an_ellipsis_but_the_last_stays_whole() -> None:
    lines = table(["A", "B"], [["x" * 500, "/a/long/path/" + "y" * 500]])
    assert lines[1] == "x" * (CELL_CAP - 1) + "…" + "  " + "/a/long/path/" + "y" * 500
    assert lines[0] == "A".ljust(CELL_CAP) + "  B"  # no trailing spaces


def test_a_row_of_another_length_is_refused() -> None:
    with pytest.raises(ValueError, match="one cell per column"):
        table(["A", "B"], [["only one"]])


ROWS = [
    {
        "id": "s1",
        "state": "running",
        "paused": True,
        "host_uid": 2001000001,
        "owner_uid": 0,
        "created_at": "2026-12-01T18:00:00.123+00:00",
        "command": ["python3", "build.py"],
    },
    {
        "id": "s2",
        "state": "ended",
        "paused": False,
        "host_uid": 2001000002,
        "owner_uid": 2**31 - 7,  # an account gone since: its number
        "created_at": "2026-12-01T18:01:00+00:00",
        "command": None,  # another owner's command, not shown to this caller
        "limit_met": "memory",
    },
]


def test_sandbox_list_has_a_header_and_for_root_an_owner_column() -> None:
    plain = sandbox_commands.list_lines(ROWS, owners=False)
    assert plain[0].split() == ["ID", "STATE", "UID", "STARTED", "COMMAND"]
    assert "running (paused)" in plain[1] and "python3 build.py" in plain[1]
    assert "2026-12-01 18:00:00" in plain[1]
    assert "ended " in plain[2] and plain[2].endswith("(not yours to see)  (memory)")
    rooted = sandbox_commands.list_lines(ROWS, owners=True)
    assert rooted[0].split() == ["ID", "STATE", "UID", "OWNER", "STARTED", "COMMAND"]
    assert " root " in rooted[1]
    assert f" {2**31 - 7} " in rooted[2]
