"""The native build compiles what its table lists, nothing else: a .c file dropped beside the
sources joins no program (least of all the confiner, which runs inside every sandbox), every
.c file in the folder is in some program's list, and every listed file exists."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lnk_controller.native import build as native
from lnk_controller.native.build import CLIENT, CONFINER, CONNECTOR, PROGRAMS, SOURCES, SPAWNER


def test_every_c_file_in_the_folder_is_in_a_programs_list() -> None:
    assert native.unlisted() == [], "add it to native/build.py's SOURCES (or remove it)"


def test_every_listed_source_exists_and_each_program_has_its_list() -> None:
    assert set(SOURCES) == set(PROGRAMS)
    for program in PROGRAMS:
        assert all(Path(p).is_file() for p in native.sources_of(program)), program


@pytest.mark.parametrize(
    ("program", "names"),
    [
        (CONFINER, ["lnk_sandbox.c", "relay.c"]),
        (SPAWNER, ["lnk_spawn.c"]),
        (
            CLIENT,
            [
                "lnk_client.c",
                "lnk_client_bridge.c",
                "lnk_client_dialogue.c",
                "lnk_client_json.c",
                "lnk_client_proof.c",
                "lnk_client_text.c",
                "lnk_client_values.c",
            ],
        ),
        (CONNECTOR, ["lnk_connect.c"]),
    ],
)
def test_each_program_is_built_from_its_own_files(program: str, names: list[str]) -> None:
    assert [Path(p).name for p in native.sources_of(program)] == names


def test_a_c_file_dropped_beside_the_sources_joins_no_program(tmp_path: Path) -> None:
    """The attack: a new .c file in the folder (a branch's, a stray copy) would have been
    globbed into the confiner. It joins nothing, and `unlisted` names it."""
    for name in (n for names in SOURCES.values() for n in names):
        shutil.copy(native.SOURCES_DIR / name, tmp_path / name)
    (tmp_path / "evil.c").write_text("int evil(void) { return 1; }\n")
    assert native.unlisted(tmp_path) == ["evil.c"]
    for program in PROGRAMS:
        assert str(tmp_path / "evil.c") not in native.sources_of(program, tmp_path)


def test_an_unknown_program_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no such program: lnk-evil"):
        native.sources_of("lnk-evil")


def test_a_listed_source_that_is_missing_fails_the_build_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(native.SOURCES, SPAWNER, ("lnk_spawn.c", "gone.c"))
    with pytest.raises(native.BuildError, match=r"gone\.c"):
        native.build(tmp_path / "out", program=SPAWNER)
    assert not (tmp_path / "out").exists()
