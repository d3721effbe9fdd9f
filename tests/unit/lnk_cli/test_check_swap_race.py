"""The check's swap race: its folders and swap on a real file system, its plan, and its
verdicts as a table (the outside's evidence decides; a refusal alone is not enough)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lnk_cli.check.plan import LEAKED, REFUSED
from lnk_cli.check.swap_race import (
    CHANGED,
    PLANTED_NAME,
    READ_ID,
    SECRET_NAME,
    WRITE_ID,
    Swaps,
    SwapSeen,
    swap_verdicts,
)

SECRET = "5" * 64


def test_the_swap_links_the_write_folder_out_and_exchanges_the_read_folder(tmp_path: Path) -> None:
    swaps = Swaps(str(tmp_path), SECRET)
    swaps.make()
    judged_read = os.stat(swaps.read)
    swaps.swap()
    assert os.readlink(swaps.write) == swaps.write_bait
    assert (Path(swaps.read) / SECRET_NAME).read_text() == f"{SECRET}\n"
    assert os.stat(swaps.read_bait).st_ino == judged_read.st_ino  # the judged one, moved
    assert (Path(swaps.read_bait) / SECRET_NAME).read_text() == "the folder judged\n"
    for folder in (swaps.write_bait, swaps.read, swaps.read_bait):
        assert os.stat(folder).st_mode & 0o077 == 0


def test_the_plan_writes_into_the_write_grant_and_reads_the_read_grant(tmp_path: Path) -> None:
    swaps = Swaps(str(tmp_path), SECRET)
    steps = {s["id"]: s for s in json.loads(swaps.plan())}
    assert steps[WRITE_ID]["kind"] == "create"
    assert steps[WRITE_ID]["path"] == os.path.join(swaps.write, PLANTED_NAME)
    assert steps[READ_ID] == {
        "id": READ_ID,
        "kind": "read",
        "path": os.path.join(swaps.read, SECRET_NAME),
    }
    assert SECRET not in swaps.plan()


REFUSAL = f"refused [launch]: ~/lnk-check-swap-1/read: it {CHANGED}: run again"


@pytest.mark.parametrize(
    ("seen", "write", "read"),
    [
        (SwapSeen(REFUSAL, planted=False, secret_read=False), REFUSED, REFUSED),
        (SwapSeen(None, planted=False, secret_read=False), REFUSED, REFUSED),
        (SwapSeen(None, planted=True, secret_read=True), LEAKED, LEAKED),
        (SwapSeen(None, planted=True, secret_read=False), LEAKED, REFUSED),
        (SwapSeen(None, planted=False, secret_read=True), REFUSED, LEAKED),
        # a refusal said, yet the bait was reached: the outside decides
        (SwapSeen(REFUSAL, planted=True, secret_read=True), LEAKED, LEAKED),
    ],
)
def test_verdicts(seen: SwapSeen, write: str, read: str) -> None:
    found = {f.id: f for f in swap_verdicts(seen)}
    assert (found[WRITE_ID].verdict, found[READ_ID].verdict) == (write, read)
    for finding in found.values():
        assert finding.expected == REFUSED
        if finding.verdict == REFUSED and seen.refusal:
            assert CHANGED in finding.observed


def test_a_refusal_with_control_characters_is_shown_escaped() -> None:
    (write, _read) = swap_verdicts(SwapSeen("changed \x1b[2J\u202e", False, False))
    assert "\x1b" not in write.observed and "\u202e" not in write.observed


def test_a_refusal_for_another_rule_says_the_race_was_not_tried() -> None:
    (write, read) = swap_verdicts(
        SwapSeen("refused [settings]: ~/x: it opens ~/.lnk", False, False)
    )
    assert write.observed.startswith("not tried: ") and read.observed.startswith("not tried: ")
