"""The box's C programs (the confiner, the launcher, the connector, the client), compiled once
per session from this checkout's sources (lnk_shared/native_build.py), for the unit tests of
every room that runs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from lnk_shared.native_build import CONFINER, SPAWNER, build_all

# The helpers' asserts (tests/unit/helpers, on pytest's pythonpath) say what differed, as a test's
# do: rewritten, which must be asked for before anything imports them.
pytest.register_assert_rewrite("bridge_clients", "host_user_kit", "native_launch", "refusal_box")


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
