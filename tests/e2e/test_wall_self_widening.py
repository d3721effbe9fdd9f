"""A spec's run may not rewrite the spec, judged by identity: a hard link of the spec in a folder
it writes, its folder reached through a bind mount, an agent's spec in the agent's own home.
Each attack tries to make the run rewrite the spec; the spec is checked unchanged outside."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.needs_root

RunningBox = Any  # tests/e2e/conftest.py
WIDENED = '[folders]\nwrite = ["~"]\n'


@dataclass
class Layout:
    specs: Path  # the spec's folder
    spec: Path
    out: Path  # the folder the spec writes
    text: str


def _own(box: RunningBox, *paths: Path) -> None:
    for path in paths:
        os.chown(path, box.owner.uid, box.owner.gid, follow_symlinks=False)


@pytest.fixture
def layout(running_box: RunningBox) -> Iterator[Layout]:
    home = running_box.owner.home
    tag = secrets.token_hex(4)
    specs, out = home / f"specs-{tag}", home / f"work-{tag}" / "out"
    specs.mkdir()
    out.mkdir(parents=True)
    spec = specs / "spec.toml"
    text = f'[folders]\nwrite = ["{out}"]\n'
    spec.write_text(text)
    _own(running_box, specs, out.parent, out, spec)
    try:
        yield Layout(specs, spec, out, text)
    finally:
        shutil.rmtree(specs, ignore_errors=True)
        shutil.rmtree(out.parent, ignore_errors=True)


def _rewrite(box: RunningBox, spec: Path, target: Path) -> subprocess.CompletedProcess[str]:
    """Run the spec with a program that tries to widen it through `target`."""
    script = f"printf '%s' '{WIDENED}' > {target}; echo ran"
    return box.as_owner("sandbox", "run", "--yes", f"--spec={spec}", "--", "/bin/sh", "-c", script)


def test_a_spec_hard_linked_into_its_write_folder_is_refused(
    running_box: RunningBox, layout: Layout
) -> None:
    link = layout.out / "notes.toml"
    os.link(layout.spec, link)
    result = _rewrite(running_box, layout.spec, link)
    assert result.returncode != 0, result.stdout
    assert "[widens-own-spec]" in result.stderr and "hard links" in result.stderr, result.stderr
    assert "ran" not in result.stdout
    assert layout.spec.read_text() == layout.text


def test_a_spec_with_one_link_runs_and_writes_its_folder(
    running_box: RunningBox, layout: Layout
) -> None:
    result = _rewrite(running_box, layout.spec, layout.out / "notes.toml")
    assert result.returncode == 0, result.stderr
    assert (layout.out / "notes.toml").read_text() == WIDENED
    assert layout.spec.read_text() == layout.text


@pytest.fixture
def bind_of_specs(layout: Layout) -> Iterator[Path]:
    """The spec's folder, also reached at /srv/lnk-bind-*: the same folder by another path."""
    Path("/srv").mkdir(mode=0o755, exist_ok=True)
    point = Path(f"/srv/lnk-bind-{secrets.token_hex(4)}")
    point.mkdir()
    subprocess.run(["mount", "--bind", str(layout.specs), str(point)], check=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)
        point.rmdir()


def test_a_write_of_the_specs_folder_by_another_path_is_refused(
    running_box: RunningBox, layout: Layout, bind_of_specs: Path
) -> None:
    layout.spec.write_text(f'[folders]\nwrite = ["{bind_of_specs}"]\n')
    text = layout.spec.read_text()
    result = _rewrite(running_box, layout.spec, bind_of_specs / "spec.toml")
    assert result.returncode != 0, result.stdout
    assert "[widens-own-spec]" in result.stderr, result.stderr
    assert "reached by another path" in result.stderr, result.stderr
    assert layout.spec.read_text() == text


@pytest.fixture
def agent_name(running_box: RunningBox) -> Iterator[str]:
    name = f"w-{secrets.token_hex(3)}"
    try:
        yield name
    finally:
        running_box.as_owner("agent", "remove", name)
        shutil.rmtree(running_box.owner.home / "Link" / "Agents" / name, ignore_errors=True)


def _agent_home(box: RunningBox, name: str) -> Path:
    folder = box.owner.home / "Link" / "Agents" / name
    for path in (box.owner.home / "Link", folder.parent, folder):
        if not path.exists():
            path.mkdir(mode=0o700)
            _own(box, path)
    return folder


@pytest.mark.parametrize("how", ["in its home", "hard-linked into its home"])
def test_an_agents_spec_its_own_home_holds_is_refused(
    running_box: RunningBox, agent_name: str, how: str
) -> None:
    box = running_box
    home = _agent_home(box, agent_name)
    text = "# an agent with no grants\n"
    if how == "in its home":
        spec = home / "spec.toml"
        spec.write_text(text)
        _own(box, spec)
    else:
        spec = box.owner.home / f"agent-spec-{agent_name}.toml"
        spec.write_text(text)
        _own(box, spec)
        os.link(spec, home / "spec.toml")
    try:
        created = box.as_owner("agent", "create", agent_name, "--spec", str(spec))
        assert created.returncode == 0, created.stderr
        script = f"printf '%s' '{WIDENED}' > $HOME/spec.toml; echo ran"
        result = box.as_owner("agent", "start", agent_name, "--yes", "--", "/bin/sh", "-c", script)
        assert result.returncode != 0, result.stdout
        assert "[widens-own-spec]" in result.stderr, result.stderr
        assert "the agent's home" in result.stderr, result.stderr
        assert spec.read_text() == text
    finally:
        if how != "in its home":
            spec.unlink(missing_ok=True)
