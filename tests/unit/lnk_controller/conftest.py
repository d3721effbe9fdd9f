"""The confiner and the launcher, compiled once per session from this checkout's sources
(native/build.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lnk_controller.native.build import CONFINER, SPAWNER, build_all


@pytest.fixture(scope="session")
def native_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("native")
    build_all(folder)
    return folder


@pytest.fixture(scope="session")
def lnk_sandbox(native_dir: Path) -> Path:
    return native_dir / CONFINER


@pytest.fixture(scope="session")
def lnk_spawn(native_dir: Path) -> Path:
    return native_dir / SPAWNER
