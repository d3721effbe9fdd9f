"""The plan's probes of files and folders (plan_files.py): what read, write and `--with-fd` grants
make of them, each granted object probed for the one judged, and the placeholders first."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lnk_cli.check.plan import ALLOWED, KNOWN_GAP, REFUSED
from lnk_shared.paths import PROJECT_RUN_DOT_ENTRIES

PlanKit = Any  # conftest.PlanKit: a temp home with bait, its grants and its plan


def test_a_read_grant_of_the_home_allows_its_files_but_not_the_hidden_ones(plan: PlanKit) -> None:
    wanted = plan.expected(plan.probes(plan.grants(f"--read={plan.home}")))
    assert wanted["read.home"] == ALLOWED
    assert wanted["read.hidden:~/.ssh"] == ALLOWED
    assert wanted["list.ssh"] == ALLOWED
    assert wanted["read.settings"] == REFUSED  # ~/.lnk is hidden inside any grant
    assert wanted["read.agents:Link/Agents"] == REFUSED
    assert wanted["write.home"] == REFUSED


def test_a_write_folder_must_take_a_write_and_keep_its_dot_entries(plan: PlanKit) -> None:
    out = plan.home / "project" / "out"
    probes = plan.probes(plan.grants(f"--write={out}"))
    wanted = plan.expected(probes)
    assert wanted[f"write.folder:{out}"] == ALLOWED
    assert wanted[f"write.deep-dot:{out}"] == KNOWN_GAP
    for entry in PROJECT_RUN_DOT_ENTRIES:
        assert wanted[f"write.dot:{out}/{entry}"] == REFUSED
    steps = {p.id: p.step for p in probes if p.step is not None}
    # An existing file is opened for writing (nothing written), a missing one created.
    assert steps[f"write.dot:{out}/.envrc"]["kind"] == "open_write"
    assert steps[f"write.dot:{out}/.git/hooks"]["kind"] == "create"
    assert steps[f"write.dot:{out}/.git/hooks"]["dirs"] == [f"{out}/.git", f"{out}/.git/hooks"]
    assert os.path.dirname(steps[f"write.dot:{out}/.git/hooks"]["path"]) == f"{out}/.git/hooks"
    assert steps[f"write.dot:{out}/.git/config"]["path"] == f"{out}/.git/config"
    leftovers = {p.id: p.leftovers for p in probes}
    assert leftovers[f"write.dot:{out}/.git/hooks"] == (f"{out}/.git",)
    assert wanted[f"exec:write-copy:{out}"] == REFUSED  # written there, never run from there
    (copy,) = leftovers[f"exec:write-copy:{out}"]
    assert os.path.dirname(copy) == str(out)


def test_a_folder_passed_with_with_fd_is_probed_as_a_write_folder(
    plan: PlanKit, tmp_path: Path
) -> None:
    passed = tmp_path / "passed"
    passed.mkdir()
    fd = os.open(passed, os.O_RDONLY | os.O_DIRECTORY)
    try:
        wanted = plan.expected(plan.probes(plan.grants(f"--with-fd={fd}:write")))
    finally:
        os.close(fd)
    assert wanted[f"write.folder:{passed}"] == ALLOWED
    assert wanted[f"write.dot:{passed}/.envrc"] == REFUSED


def test_a_folder_granted_for_reading_must_refuse_a_write(plan: PlanKit) -> None:
    project, out = plan.home / "project", plan.home / "project" / "out"
    probes = plan.probes(plan.grants(f"--read={project}", f"--write={out}", f"--read={plan.home}"))
    wanted = plan.expected(probes)
    assert wanted[f"write.read-folder:{project}"] == REFUSED
    assert f"write.read-folder:{plan.home}" not in wanted  # the home has its own probe
    assert f"write.read-folder:{out}" not in wanted  # written, not only read
    leftovers = {p.id: p.leftovers for p in probes}
    (made,) = leftovers[f"write.read-folder:{project}"]
    assert os.path.dirname(made) == str(project)


def test_every_granted_folder_is_probed_for_the_object_judged(plan: PlanKit) -> None:
    grants = plan.grants(f"--read={plan.home / '.config'}", f"--write={plan.home / 'project/out'}")
    probes = {p.id: p for p in plan.probes(grants)}
    found = {p.step["path"]: p for p in probes.values() if p.id.startswith("identity-") and p.step}
    assert set(found) == {str(plan.home / ".config"), str(plan.home / "project/out")}
    info = os.stat(plan.home / "project/out")
    (evidence,) = found[str(plan.home / "project/out")].evidence
    assert evidence.value == [info.st_dev, info.st_ino, 0o040000]
    assert all(p.expected == REFUSED for p in found.values())


def test_a_write_folder_gets_a_placeholder_probe_for_the_names_missing_outside(
    plan: PlanKit,
) -> None:
    out = plan.home / "project" / "out"
    (out / ".envrc").write_text("")
    probes = plan.probes(plan.grants(f"--write={out}"))
    steps = {p.id: p.step for p in probes if p.step is not None}
    step = steps[f"placeholder.git:{out}"]
    assert step["kind"] == "git_visible" and step["path"] == str(out)
    assert ".vscode" in step["names"] and ".envrc" not in step["names"]
    assert probes[0].id == f"placeholder.git:{out}"  # before any probe writes there
