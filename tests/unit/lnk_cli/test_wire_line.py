"""`lnk sandbox wire` for a person: a count line says how many refusals it stands for."""

from __future__ import annotations

import json

from lnk_cli.sandbox_commands import _wire_line

LINE = {
    "time": "2030-01-02T03:04:05.678+00:00",
    "decision": "refused",
    "rule": "not-listed",
    "method": "CONNECT",
    "target": "x.example:443",
    "address": "",
    "up": 0,
    "down": 0,
}


def test_a_count_line_shows_its_repeats() -> None:
    assert "x383 (repeats, counted)" in _wire_line(json.dumps({**LINE, "repeated": 383}))
    assert "repeats" not in _wire_line(json.dumps(LINE))
