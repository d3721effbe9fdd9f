"""`lnk sandbox check` races the controller with a swap between judging and binding: its write
grant replaced by a link to a bait folder, its read grant exchanged (RENAME_EXCHANGE) with
another. On the closed wall both are `refused` ("changed after it was judged") and nothing of
the race is left in the home; on a private box with `unsafe_skip_identity_check` (grants bound
by path, following links) check fails naming both as `leaked`: the bait outside held the file
the sandbox wrote, and the read bait's secret came back from inside."""

from __future__ import annotations

import os
from typing import Any

import install_prefix
import pytest
from check_run import run_check

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

LNK = str(install_prefix.LNK)
CHECK_TIMEOUT_S = 120
CHANGED = "changed after it was judged"


def _check(box: RunningBox, private: Any | None = None) -> tuple[int, dict[str, dict[str, str]]]:
    code, doc, _ = run_check(box, private=private, timeout=CHECK_TIMEOUT_S)
    return code, {p["id"]: p for p in doc["probes"]}


def _left(box: RunningBox) -> list[str]:
    return [n for n in os.listdir(box.owner.home) if n.startswith("lnk-check-")]


def test_a_swap_after_judging_is_refused_on_the_closed_wall(running_box: RunningBox) -> None:
    status, probes = _check(running_box)
    assert status == 0, probes
    for ident in ("swap:write", "swap:read"):
        assert probes[ident]["verdict"] == "refused", probes[ident]
        assert CHANGED in probes[ident]["observed"], probes[ident]
    assert _left(running_box) == []


def test_binding_by_path_makes_check_report_the_swap_leaked(
    running_box: RunningBox, private_box: Any
) -> None:
    with private_box("unsafe_skip_identity_check = true") as box:
        status, probes = _check(running_box, private=box)
        log = (box.state_dir / "logs" / "controller.log").read_text()
    assert status == 1
    assert probes["swap:write"]["verdict"] == "leaked", probes["swap:write"]
    assert "in the folder outside" in probes["swap:write"]["observed"]
    assert probes["swap:read"]["verdict"] == "leaked", probes["swap:read"]
    assert "secret was read" in probes["swap:read"]["observed"]
    assert "unsafe_skip_identity_check" in log
    assert _left(running_box) == []
