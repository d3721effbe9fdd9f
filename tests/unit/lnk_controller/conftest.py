"""The confiner binary, compiled once per session from this checkout's sources (native/build.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lnk_controller.native.build import build


@pytest.fixture(scope="session")
def lnk_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("native") / "lnk-sandbox")
