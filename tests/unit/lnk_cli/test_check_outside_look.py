"""The check's look from outside: a staging folder another user can traverse is reported, one
only root and the sandbox reach is not (as root, the look is made as nobody)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_cli.check.outside_look import _staging

pytestmark = pytest.mark.needs_root


@pytest.fixture
def run_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lnk-look-", dir="/tmp"))
    path.chmod(0o755)
    (path / "sandboxes" / "sbx-1" / "home").mkdir(parents=True)
    (path / "sandboxes").chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.mark.parametrize(("mode", "reached"), [(0o711, True), (0o710, False), (0o700, False)])
def test_a_staging_folder_others_traverse_is_reported(
    run_dir: Path, mode: int, reached: bool
) -> None:
    staging = run_dir / "sandboxes" / "sbx-1"
    staging.chmod(mode)
    os.chown(staging, 0, 2_000_000_123)  # the sandbox's group: not nobody's
    said = _staging(str(staging))
    assert (said is not None) is reached, said
    if reached:
        assert said is not None and "home is reachable by uid 65534" in said
