"""The box's folders from the environment: each variable when set, the box's default when unset
or empty (an empty LNK_RUN_DIR is not the current folder); the same three that BoxPaths gives;
and read on `os` alone, so `lnk sandbox run` may read its run dir without pathlib."""

from __future__ import annotations

import subprocess
import sys
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


def test_reading_the_run_dir_imports_neither_pathlib_nor_typing() -> None:
    code = "import sys, lnk_shared.box_env as b; b.box_run_dir(); print(' '.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": ":".join(sys.path)},
    ).stdout.split()
    assert "lnk_shared.box_env" in out
    assert [m for m in ("pathlib", "typing", "dataclasses") if m in out] == []
