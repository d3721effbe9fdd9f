"""The native build compiles what its table lists, nothing else: a .c file dropped beside the
sources joins no program (least of all the confiner, which runs inside every sandbox), every
.c file in a room's folder is in the list of a program of that room, every listed file exists,
and each program is built from its own room's folder only."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from lnk_shared import native_build as native
from lnk_shared.native_build import (
    CLIENT,
    CONFINER,
    CONNECTOR,
    PROGRAMS,
    ROOMS,
    SOURCES,
    SPAWNER,
    native_folder,
)

MAIN = re.compile(r"^int main\(", re.MULTILINE)


def test_every_c_file_in_a_rooms_folder_is_in_a_programs_list() -> None:
    assert native.unlisted() == [], "add it to lnk_shared/native_build.py's SOURCES (or remove it)"


def test_every_listed_source_exists_and_each_program_has_its_list_and_room() -> None:
    assert set(SOURCES) == set(PROGRAMS) == set(ROOMS)
    for program in PROGRAMS:
        assert all(Path(p).is_file() for p in native.sources_of(program)), program


@pytest.mark.parametrize("program", PROGRAMS)
def test_each_program_is_built_from_its_own_rooms_folder_only(program: str) -> None:
    folder = native_folder(ROOMS[program])
    assert {Path(p).parent for p in native.sources_of(program)} == {folder}


@pytest.mark.parametrize("program", PROGRAMS)
def test_each_program_has_exactly_one_main_among_its_sources(program: str) -> None:
    """A list that lost its main file, or gained another program's, fails here (not by
    restating the list)."""
    mains = [p for p in native.sources_of(program) if MAIN.search(Path(p).read_text())]
    assert len(mains) == 1, (program, mains)


def test_what_runs_inside_a_sandbox_is_built_from_the_inside_room() -> None:
    """The confiner and the connector run in every sandbox: their sources are the in-sandbox
    room's, never the controller's (root's) nor the caller's."""
    assert {ROOMS[CONFINER], ROOMS[CONNECTOR]} == {"lnk_inside"}
    assert ROOMS[SPAWNER] == "lnk_controller"
    assert ROOMS[CLIENT] == "lnk_cli"


def test_a_c_file_dropped_beside_the_sources_joins_no_program(tmp_path: Path) -> None:
    """The attack: a new .c file in the folder (a branch's, a stray copy) would have been
    globbed into the confiner. It joins nothing, and `unlisted` names it."""
    for program in PROGRAMS:
        for path in native.sources_of(program):
            shutil.copy(path, tmp_path / Path(path).name)
    (tmp_path / "evil.c").write_text("int evil(void) { return 1; }\n")
    assert native.unlisted(tmp_path) == ["evil.c"]
    for program in PROGRAMS:
        assert str(tmp_path / "evil.c") not in native.sources_of(program, tmp_path)


def test_a_file_no_program_of_its_room_lists_is_named_with_its_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept = tuple(name for name in SOURCES[CLIENT] if name != "lnk_client_text.c")
    monkeypatch.setitem(native.SOURCES, CLIENT, kept)
    assert native.unlisted() == ["lnk_cli/lnk_client_text.c"]


def test_an_unknown_program_or_room_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no such program: lnk-evil"):
        native.sources_of("lnk-evil")
    with pytest.raises(ValueError, match="no such room: lnk_proxy"):
        native_folder("lnk_proxy")


def test_a_listed_source_that_is_missing_fails_the_build_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(native.SOURCES, SPAWNER, ("lnk_spawn.c", "gone.c"))
    with pytest.raises(native.BuildError, match=r"gone\.c"):
        native.build(tmp_path / "out", program=SPAWNER)
    assert not (tmp_path / "out").exists()
