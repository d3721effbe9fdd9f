"""The box's folder table is the one the Ansible role converges to: the same folders, owners
and modes (a folder the role makes that the table lacks, or a mode that differs, fails); and
each service's starter makes exactly its own, parents first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from lnk_shared.box_folders import FOLDERS, BoxFolder, folder_named, folders_for, path_of

ROOT = Path(__file__).resolve().parents[3]
ROLE_FOLDERS = ROOT / "deploy" / "ansible" / "roles" / "lnk_box" / "tasks" / "folders.yml"
ROLE_BASES = {"{{ lnk_box_state_dir }}": "state", "{{ lnk_box_run_dir }}": "run"}
ROLE_OWNERS = {
    "root": "root",
    "{{ lnk_box_proxy_user }}": "proxy",
    "{{ lnk_box_bridge_store_user }}": "bridge-store",
}
_PATH = re.compile(r"^(\{\{ \w+ \}\})(?:/(.+))?$")

Row = tuple[str, str, str, int]


def role_rows(text: str) -> set[Row]:
    """(base, name, owner, mode) of every folder the role's task file makes."""
    tasks = yaml.safe_load(text)
    rows: set[Row] = set()
    for task in tasks:
        made = task.get("ansible.builtin.file", {})
        if made.get("state") != "directory":
            continue
        assert made["owner"] == "{{ item.owner }}" and made["group"] == "{{ item.owner }}"
        for item in task["loop"]:
            found = _PATH.match(item["path"])
            assert found is not None, item["path"]
            rows.add(
                (
                    ROLE_BASES[found[1]],
                    found[2] or "",
                    ROLE_OWNERS[item["owner"]],
                    int(item["mode"], 8),
                )
            )
    return rows


def table_rows(folders: tuple[BoxFolder, ...] = FOLDERS) -> set[Row]:
    return {(f.base, f.name, f.owner, f.mode) for f in folders if f.by_role}


def test_the_roles_folders_are_the_tables() -> None:
    assert role_rows(ROLE_FOLDERS.read_text()) == table_rows()


def test_the_comparison_sees_a_mode_the_role_changed() -> None:
    """Not vacuous: one mode edited in the role's file is a difference."""
    text = ROLE_FOLDERS.read_text()
    edited = text.replace(
        '/homes", owner: root, mode: "0711"', '/homes", owner: root, mode: "0755"'
    )
    assert edited != text
    assert role_rows(edited) != table_rows()


def test_each_folder_is_in_the_table_once() -> None:
    places = [(f.base, f.name) for f in FOLDERS]
    assert len(places) == len(set(places))


@pytest.mark.parametrize(
    ("service", "names"),
    [
        ("controller", [("state", ""), ("state", "homes"), ("run", ""), ("run", "sandboxes")]),
        ("proxy", [("state", "wire"), ("run", "flags"), ("run", "proxy")]),
        ("bridge-store", [("state", "bridge-store"), ("run", "bridge-store")]),
        ("ssh-gate", []),
    ],
)
def test_each_service_makes_its_own_folders_parents_first(
    service: str, names: list[tuple[str, str]]
) -> None:
    assert [(f.base, f.name) for f in folders_for(service)] == names


def test_no_folder_but_roots_is_writable_by_others_and_the_homes_are_not_listable() -> None:
    assert all(f.mode & 0o022 == 0 for f in FOLDERS)
    assert folder_named("state", "homes").mode & 0o044 == 0  # sandbox uids traverse, never list
    assert folder_named("run", "sandboxes").mode & 0o044 == 0


def test_a_folder_is_placed_under_its_base() -> None:
    state, run = Path("/var/lib/lnk"), Path("/run/lnk")
    assert path_of(folder_named("state", ""), state_dir=state, run_dir=run) == state
    assert path_of(folder_named("run", "flags"), state_dir=state, run_dir=run) == run / "flags"
    with pytest.raises(KeyError, match="no folder 'logs'"):
        folder_named("state", "logs")
