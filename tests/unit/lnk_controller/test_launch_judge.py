"""The judging's own lookups, as any user: the program a request names, the interpreter a
script needs, and the approval's lines for what the box grants besides the spec."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lnk_controller.launch_judge import _box_grant_lines, _find_program, _interpreter
from lnk_shared.errors import ProgramNotFoundError
from lnk_shared.grants import ResolvedPath

BOX_BIN = Path("/opt/lnk/venv/bin")


def test_a_program_is_its_path_as_written_else_found_on_the_sandboxs_path() -> None:
    assert _find_program("./tool", "/home/o/project") == "/home/o/project/tool"
    assert _find_program("/usr/bin/../bin/env", "/") == "/usr/bin/env"
    assert _find_program("sh", "/") == "/usr/bin/sh"  # the sandbox's PATH, not the caller's


def test_lnk_is_the_boxs_client_only_where_the_sandbox_has_it() -> None:
    assert _find_program("lnk", "/", box_bin=BOX_BIN) == "/opt/lnk/venv/bin/lnk"
    with pytest.raises(ProgramNotFoundError, match="grant it with --command"):
        _find_program("lnk-no-such-tool", "/", box_bin=BOX_BIN)  # on no PATH, no [commands]


def test_a_commands_name_found_on_the_callers_path_is_its_real_program() -> None:
    tool = ResolvedPath("/home/o/.local/lib/tool-1.2/tool", "tool", found_on_path="/x/tool")
    written = ResolvedPath("/home/o/bin/other", "other")  # a path written: not a name
    assert _find_program("tool", "/", (written, tool)) == tool.real
    with pytest.raises(ProgramNotFoundError):
        _find_program("other", "/", (written, tool))


def test_a_scripts_interpreter_is_its_first_line(tmp_path: Path) -> None:
    script = tmp_path / "run"
    script.write_text("#!/usr/bin/python3 -I\nprint(1)\n")
    plain = tmp_path / "plain"
    plain.write_bytes(b"\x7fELF...")
    empty = tmp_path / "empty"
    empty.write_text("#!\n")
    assert _interpreter(str(script)) == "/usr/bin/python3"
    assert _interpreter(str(plain)) is None
    assert _interpreter(str(empty)) is None
    assert _interpreter(str(tmp_path / "missing")) is None
    assert _interpreter(os.path.realpath("/usr/bin/env")) is None


def test_the_boxs_client_brings_no_interpreter(tmp_path: Path) -> None:
    """The box's `lnk` (static C) as the program: nothing besides it is granted, not the
    Python in its folder (the controller once added that Python to what the sandbox executes)."""
    client = tmp_path / "venv" / "bin" / "lnk"
    client.parent.mkdir(parents=True)
    client.write_bytes(b"\x7fELF\x02\x01\x01")
    (client.parent / "python3").symlink_to("/usr/bin/python3")
    assert _interpreter(str(client)) is None


def test_the_approval_names_the_boxs_connector_and_client_apart() -> None:
    connector = ResolvedPath("/opt/lnk/venv/bin/lnk-connect", "lnk-connect")
    client = ResolvedPath("/opt/lnk/venv/bin/lnk", "lnk")
    lines = _box_grant_lines((connector, client))
    assert "granted by the box with a proxy" in lines[0] and "lnk-connect" in lines[0]
    assert any("its bridges' client" in line for line in lines[1:])
    assert _box_grant_lines((connector,)) == lines[:1]
