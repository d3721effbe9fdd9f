"""The refusal tests' owner (`box`): its folders and files made under tmp_path, the test run from
its home with an agent socket bound there (tests/unit/helpers/refusal_box.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from refusal_box import DIRS, FILES, SPEC_FILE, Box


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Box]:
    for d in DIRS:
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    for f in FILES:
        (tmp_path / f).write_text("x")
    (tmp_path / SPEC_FILE).write_text("")
    tool = tmp_path / "tmpbin/tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.chdir(tmp_path / "home")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("agent.sock")  # relative: keeps the bound path under the 108-byte limit
        yield Box(tmp_path)
