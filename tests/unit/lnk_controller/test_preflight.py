"""The box's capabilities checked before a launch is judged: each missing piece refuses,
named, with what to do (as any user: only files in a temporary folder)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lnk_controller.config import ControllerConfig
from lnk_controller.preflight import preflight
from lnk_shared.errors import LaunchRefused

BWRAP = shutil.which("bwrap") or "/usr/bin/bwrap"


def _program(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def _config(tmp_path: Path, **changes: object) -> ControllerConfig:
    prefix = tmp_path / "prefix"
    values: dict[str, object] = {
        "prefix": prefix,
        "bwrap": Path(BWRAP),
        "confiner": _program(prefix / "native" / "lnk-sandbox"),
        "spawner": _program(prefix / "native" / "lnk-spawn"),
        **changes,
    }
    return ControllerConfig.model_validate(values)


@pytest.mark.parametrize(
    ("changes", "named", "says"),
    [
        ({"bwrap": Path("/nonexistent/bwrap")}, "bubblewrap", "install bubblewrap"),
        ({"confiner": Path("/nonexistent/lnk-sandbox")}, "the confiner", "reinstall lnk"),
        ({"spawner": Path("/nonexistent/lnk-spawn")}, "the launcher", "reinstall lnk"),
    ],
)
def test_a_missing_program_refuses_naming_it(
    tmp_path: Path, changes: dict[str, object], named: str, says: str
) -> None:
    with pytest.raises(LaunchRefused, match=says) as refused:
        preflight(_config(tmp_path, **changes))
    assert named in str(refused.value)


def test_a_confiner_outside_the_prefix_refuses(tmp_path: Path) -> None:
    outside = _program(tmp_path / "elsewhere" / "lnk-sandbox")
    with pytest.raises(LaunchRefused, match="so a sandbox cannot see it"):
        preflight(_config(tmp_path, confiner=outside))


def test_a_landlock_abi_below_the_walls_refuses(tmp_path: Path) -> None:
    with pytest.raises(LaunchRefused, match="Landlock ABI 6"):
        preflight(_config(tmp_path, unsafe_pretend_landlock_abi=5))


def test_an_installed_box_passes(tmp_path: Path) -> None:
    preflight(_config(tmp_path))  # this machine's kernel has the ABI the suite needs
