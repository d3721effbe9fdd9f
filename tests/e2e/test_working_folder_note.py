"""A caller's folder the sandbox cannot see: the sandbox starts in its home, and the caller is
told so on stderr before anything the program prints (`sandbox_plan.cwd_note`, written by the
controller on the program's stderr before the program exists), whichever client launched it:
the C client's quick path (a copy alone in its folder, so no Python could have answered) and the
Python client's. From a granted folder, or below one, no note: it starts there."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_owner import build_alone, owner_tmp, run_as_owner

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]
RunningBox = Any  # tests/e2e/conftest.py
# The program speaks first thing, on stderr too: the note must still come before it.
SCRIPT = 'echo "program first" >&2; pwd'


@pytest.fixture(scope="module")
def c_client() -> Iterator[Path]:
    with owner_tmp("lnkn-e2e-") as root:
        yield build_alone(root)


def _clients(c_client: Path) -> dict[str, list[str]]:
    return {
        "c": [str(c_client)],
        "python": [str(install_prefix.PREFIX / "venv" / "bin" / "python3"), "-m", "lnk_cli"],
    }


# A flag the quick path does not take: the full CLI's launch (launch_dialogue.dialogue).
FULL = ("--processes", "64")


def _run(
    box: RunningBox, client: list[str], cwd: Path, *flags: str
) -> subprocess.CompletedProcess[str]:
    words = ["sandbox", "run", "--yes", *flags, "--", "/bin/sh", "-c", SCRIPT]
    return run_as_owner(box, [*client, *words], cwd=cwd)


@pytest.mark.parametrize("client", ["c", "python", "python-full"])
def test_a_folder_not_granted_is_said_first_and_the_sandbox_starts_in_its_home(
    running_box: RunningBox, c_client: Path, client: str
) -> None:
    project = running_box.owner.home / "project"
    full = client == "python-full"
    argv = _clients(c_client)["python" if full else client]
    ran = _run(running_box, argv, project, *(FULL if full else ()))
    assert ran.returncode == 0, ran.stderr
    home = ran.stdout.strip()
    assert home.startswith("/home/lnk-") and home != str(project)  # the sandbox's own home
    assert ran.stderr.splitlines() == [
        f"lnk: note: {project} is not granted to this sandbox; it starts in {home} "
        f"(grant it with --read {project} or --write {project})",
        "program first",
    ]


@pytest.mark.parametrize("client", ["c", "python"])
@pytest.mark.parametrize("below", ["", "sub"])
def test_a_granted_folder_gets_no_note_and_the_sandbox_starts_there(
    running_box: RunningBox, c_client: Path, client: str, below: str
) -> None:
    owner = running_box.owner
    project = owner.home / "project"
    cwd = project / below if below else project
    made = below and not cwd.exists()
    if made:
        cwd.mkdir()
        os.chown(cwd, owner.uid, owner.gid)
    spec = owner.home / f"note-{client}-{below or 'top'}.toml"  # the C quick path takes a spec
    spec.write_text(f'[folders]\nread = ["{project}"]\n')
    os.chown(spec, owner.uid, owner.gid)
    try:
        ran = _run(running_box, _clients(c_client)[client], cwd, f"--spec={spec}")
    finally:
        spec.unlink()
        if made:
            cwd.rmdir()
    assert ran.returncode == 0, ran.stderr
    assert (ran.stdout, ran.stderr) == (f"{cwd}\n", "program first\n")
