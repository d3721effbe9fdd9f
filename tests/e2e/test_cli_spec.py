"""The installed `lnk spec` commands, end to end: show, refuse, approve on a real terminal."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from as_user import as_user
from on_pty import answer_on_pty

Box = Any  # the `box` fixture of tests/e2e/conftest.py
RunningBox = Any  # the `running_box` fixture of tests/e2e/conftest.py
LNK = Path(os.environ.get("LNK_PREFIX", "/opt/lnk")) / "venv" / "bin" / "lnk"


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "out").mkdir(parents=True)
    spec = tmp_path / "specs" / "project.toml"
    spec.parent.mkdir()
    spec.write_text(
        "# a project\n"
        f'[folders]\nread = ["{project}"]\nwrite = ["{project}/out"]\n'
        '[internet]\nhosts = ["PyPI.org.", "*.pythonhosted.org"]\n'
        '[commands]\nallow = ["python3"]\n'
    )
    return spec


def _owned_project(running_box: RunningBox, name: str) -> Path:
    """A project and its spec in the owner's home, owned by the owner."""
    owner = running_box.owner
    base = owner.home / name
    project = base / "project"
    (project / "out").mkdir(parents=True)
    spec = base / "specs" / "project.toml"
    spec.parent.mkdir()
    spec.write_text(
        "# a project\n"
        f'[folders]\nread = ["{project}"]\nwrite = ["{project}/out"]\n'
        '[internet]\nhosts = ["PyPI.org.", "*.pythonhosted.org"]\n'
        '[commands]\nallow = ["python3"]\n'
    )
    subprocess.run(["chown", "-R", f"{owner.uid}:{owner.gid}", str(base)], check=True)
    return spec


def _approve_on_terminal(running_box: RunningBox, spec: Path, answer: str) -> tuple[int, str]:
    """Run `lnk spec approve` as the owner with a real pty as its terminal; answer its question."""
    owner = running_box.owner
    status, seen = answer_on_pty(
        as_user(owner.uid, owner.gid, str(LNK), "spec", "approve", "--spec", str(spec)),
        answer,
        env=running_box.owner_env(),
        cwd=owner.home,
    )
    return status, seen.decode(errors="replace")


def test_help_documents_exit_statuses(box: Box) -> None:
    result = box.lnk("--help")
    assert result.returncode == 0
    for line in ("0  ok", "2  usage error", "3  refused by a rule"):
        assert line in result.stdout


def test_show_prints_resolved_grants_and_hash(box: Box, tmp_path: Path) -> None:
    spec = _project(tmp_path)
    result = box.lnk("spec", "show", "--spec", str(spec), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["grants"]["internet"] == ["*.pythonhosted.org", "pypi.org"]
    assert len(doc["hash"]) == 64
    assert doc["grants"]["commands"] == [os.path.realpath("/usr/bin/python3")]


def test_refused_spec_exits_3_naming_rule_and_entry(box: Box, tmp_path: Path) -> None:
    dot_folder = Path(tempfile.mkdtemp(prefix=".lnk-e2e-", dir=Path.home()))
    try:
        result = box.lnk("spec", "show", "--write", str(dot_folder))
    finally:
        dot_folder.rmdir()
    assert result.returncode == 3
    assert "code-runs-outside" in result.stderr
    assert dot_folder.name in result.stderr


def test_bad_spec_exits_2_naming_file_line_and_key(box: Box, tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text('[folders]\nread = ["/srv"]\n\n[internet]\nhostz = ["a.example"]\n')
    result = box.lnk("spec", "show", "--spec", str(spec))
    assert result.returncode == 2
    assert f"{spec}:5: internet.hostz: unknown key" in result.stderr
    assert "Traceback" not in result.stderr


def test_approve_without_terminal_or_yes_is_refused(running_box: RunningBox) -> None:
    spec = _owned_project(running_box, "no-terminal")
    result = running_box.as_owner("spec", "approve", "--spec", str(spec), input="y\n")
    assert result.returncode == 1
    assert "no terminal" in result.stderr
    listed = running_box.as_owner("spec", "list", "--json")
    assert str(spec) not in listed.stdout


def test_approve_asks_once_and_again_only_when_grants_change(running_box: RunningBox) -> None:
    spec = _owned_project(running_box, "asks-once")

    status, screen = _approve_on_terminal(running_box, spec, "n")
    assert status == 1, screen
    assert "has not run here before" in screen

    status, screen = _approve_on_terminal(running_box, spec, "y")
    assert status == 0, screen
    assert "pypi.org" in screen

    # A comment and a reordering change nothing it opens: no question.
    text = spec.read_text().replace("# a project", "# renamed, with a comment")
    spec.write_text(
        text.replace('"PyPI.org.", "*.pythonhosted.org"', '"*.pythonhosted.org", "pypi.org"')
    )
    quiet = running_box.as_owner("spec", "approve", "--spec", str(spec))
    assert quiet.returncode == 0, quiet.stderr
    assert "already approved" in quiet.stdout

    # A new grant asks again, showing what changed.
    spec.write_text(spec.read_text().replace('"pypi.org"]', '"pypi.org", "files.example.org"]'))
    status, screen = _approve_on_terminal(running_box, spec, "y")
    assert status == 0, screen
    assert "opens something else" in screen
    assert "+ internet" in screen and "files.example.org" in screen
    listed = json.loads(running_box.as_owner("spec", "list", "--json").stdout)
    assert [r["spec"] for r in listed].count(str(spec)) == 1


def test_link_retargeted_under_granted_folder_asks_again(running_box: RunningBox) -> None:
    owner = running_box.owner
    data = owner.home / "retarget" / "data"
    (data / "a").mkdir(parents=True)
    (data / "b").mkdir()
    (data / "current").symlink_to(data / "a")  # made by root: a root-owned link is allowed
    spec = owner.home / "retarget" / "data.toml"
    spec.write_text(f'[folders]\nread = ["{data}/current"]\n')
    subprocess.run(
        ["chown", "-R", f"{owner.uid}:{owner.gid}", str(data / "a"), str(data / "b"), str(spec)],
        check=True,
    )
    approved = running_box.as_owner("spec", "approve", "--yes", "--spec", str(spec))
    assert approved.returncode == 0, approved.stderr
    assert "already approved" in running_box.as_owner("spec", "approve", "--spec", str(spec)).stdout

    (data / "current").unlink()
    (data / "current").symlink_to(data / "b")
    result = running_box.as_owner("spec", "approve", "--spec", str(spec))
    assert result.returncode == 1
    assert "+ read" in result.stderr and str(data / "b") in result.stderr


def test_forget_makes_a_spec_ask_again(running_box: RunningBox) -> None:
    spec = _owned_project(running_box, "forget")
    assert running_box.as_owner("spec", "approve", "--yes", "--spec", str(spec)).returncode == 0
    forgot = running_box.as_owner("spec", "forget", str(spec))
    assert forgot.returncode == 0 and "forgotten" in forgot.stdout
    again = running_box.as_owner("spec", "approve", "--spec", str(spec))
    assert again.returncode == 1 and "has not run here before" in again.stderr
