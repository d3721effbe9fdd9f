"""The box's folders from the environment: each variable when set, the box's default when unset
or empty (an empty LNK_RUN_DIR is not the current folder); the same three that BoxPaths gives.
That it reads them on `os` alone is held by tests/unit/lnk_cli/test_app_startup.py: the launch
path imports it, and imports neither pathlib nor typing."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from lnk_shared.box_env import box_config_dir, box_run_dir, box_state_dir
from lnk_shared.paths import BoxPaths

READERS = [
    (box_config_dir, "LNK_CONFIG_DIR", "/etc/lnk"),
    (box_state_dir, "LNK_STATE_DIR", "/var/lib/lnk"),
    (box_run_dir, "LNK_RUN_DIR", "/run/lnk"),
]


@pytest.mark.parametrize(("read", "var", "default"), READERS)
def test_each_folder_is_its_variable_or_the_box_s_default(
    read: Callable[[Mapping[str, str]], str], var: str, default: str
) -> None:
    assert read({var: "/tmp/box"}) == "/tmp/box"
    assert read({}) == default
    assert read({var: ""}) == default  # empty is unset: never "" (the current folder)
    assert read({"LNK_OTHER": "/x"}) == default


def test_the_process_environment_is_read_when_none_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LNK_RUN_DIR", "/tmp/from-env")
    assert box_run_dir() == "/tmp/from-env"
    monkeypatch.delenv("LNK_RUN_DIR")
    assert box_run_dir() == "/run/lnk"


def test_box_paths_is_the_typed_view_of_the_same_three() -> None:
    env = {"LNK_CONFIG_DIR": "/c", "LNK_STATE_DIR": "", "LNK_RUN_DIR": "/r"}
    box = BoxPaths.from_env(env)
    assert box.all() == (Path("/c"), Path("/var/lib/lnk"), Path("/r"))
    assert str(box.run_dir) == box_run_dir(env)
