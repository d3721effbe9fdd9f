"""What a spec opens, told to a person: every name from the spec or the disk is shown as
escapes, so a hostile folder, link target or TOML key cannot redraw the question."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lnk_shared.discovery import context_for, resolve_spec
from lnk_shared.errors import RefusedError, SettingsGrantRefused, SpecError
from lnk_shared.grants import Grants
from lnk_shared.opens import connector_grant_lines, describe, describe_changes
from lnk_shared.paths import BoxPaths
from lnk_shared.refusals import judge
from lnk_shared.spec_file import load_spec_file

HOSTILE = "x\x1b[2J\x07\r\n\x7f\x9b31m\u202eevil\u2066\u200b\ufeff\u061cy"
HOSTILE_SHOWN = "x\\x1b[2J\\x07\\r\\n\\x7f\\x9b31m\\u202eevil\\u2066\\u200b\\ufeff\\u061cy"
# A spec may not write C0 or DEL in a path (refused as it is read): the rest, written in the spec.
WRITTEN = "w\x9b31m\u202eevil\u2066\u200b\ufeff\u061cz"
WRITTEN_SHOWN = "w\\x9b31m\\u202eevil\\u2066\\u200b\\ufeff\\u061cz"


def toml_string(text: str) -> str:
    out = "".join(c if " " <= c <= "~" and c not in '"\\' else f"\\u{ord(c):04x}" for c in text)
    return f'"{out}"'


def grants_of(spec: Path, home: Path) -> Grants:
    built = load_spec_file(spec).build()
    box = BoxPaths(home / "box/c", home / "box/s", home / "box/r")
    env = {"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(home / "xdg")}
    ctx = context_for(os.getuid(), env=env, box=box, spec_file=str(spec), home=str(home))
    return judge(resolve_spec(built, ctx, path_env="/usr/bin:/bin"), ctx)


def assert_printable(lines: list[str]) -> None:
    for line in lines:
        for part in line.split("\n"):  # describe's own line breaks, between a path and its links
            assert part.isprintable(), repr(part)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / HOSTILE).mkdir(parents=True)
    (home / WRITTEN).mkdir()
    (home / "to-hostile").symlink_to(home / HOSTILE)
    os.mkdir(os.fsencode(home) + b"/bad\xff")
    os.symlink(os.fsencode(home) + b"/bad\xff", os.fsencode(home / "to-bytes"))
    return home


def test_a_hostile_folder_link_and_target_are_shown_as_escapes(home: Path) -> None:
    spec = home / "spec.toml"
    paths = [home / WRITTEN, home / "to-hostile", home / "to-bytes"]
    spec.write_text(f"[folders]\nread = [{', '.join(toml_string(str(p)) for p in paths)}]\n")
    lines = describe(grants_of(spec, home))
    text = "\n".join(lines)
    assert_printable(lines)
    assert f"{home}/{WRITTEN_SHOWN}" in text
    assert text.count(HOSTILE_SHOWN) == 2  # the link's real path and its target
    assert f"{home}/bad\\udcff" in text


def test_what_changed_is_shown_as_escapes(home: Path) -> None:
    spec = home / "spec.toml"
    spec.write_text(f"[folders]\nread = [{toml_string(str(home / 'to-hostile'))}]\n")
    lines = describe_changes('{"version": 0}', grants_of(spec, home))
    assert_printable(lines)
    assert any(HOSTILE_SHOWN in line for line in lines)


def test_a_hostile_toml_key_is_named_as_escapes(home: Path) -> None:
    spec = home / "spec.toml"
    spec.write_text(f"[folders]\n{toml_string(HOSTILE)} = []\n")
    with pytest.raises(SpecError) as caught:
        load_spec_file(spec)
    assert HOSTILE_SHOWN in str(caught.value)
    assert str(caught.value).isprintable()


def test_a_hostile_spec_path_is_named_as_escapes(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec_file(tmp_path / HOSTILE)
    assert f"{tmp_path}/{HOSTILE_SHOWN}: cannot open" in str(caught.value)


def test_a_refusal_names_its_entry_as_escapes() -> None:
    refused: RefusedError = SettingsGrantRefused(f"folders.write {HOSTILE}", "opens the box")
    assert str(refused) == f"refused [box-settings]: folders.write {HOSTILE_SHOWN}: opens the box"


def test_the_connector_is_shown_as_the_boxs_grant() -> None:
    (line,) = connector_grant_lines(["/opt/lnk/venv/bin/lnk-connect"])
    assert "/opt/lnk/venv/bin/lnk-connect (granted by the box with a proxy" in line
    assert connector_grant_lines([]) == []
