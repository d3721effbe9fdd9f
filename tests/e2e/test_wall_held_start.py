"""A write grant's placeholders are made while bwrap starts (a held start: the confiner waits
for the controller's release): the sandbox's program must not run before every one is made
and sealed. The attack races the start: the program's very first acts plant the protected
names made last (shell built-ins, no exec before them), on every try; each must be refused
and nothing of it may land in the owner's folder."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk_shared.protected_names import PROTECTED_NAMES

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = pytest.mark.needs_root

TOP_LEVEL = sorted({n.path for n in PROTECTED_NAMES if "/" not in n.path} | {".git"})
# The placeholders are made in this order, so the last ones are those a racing program would
# win first; and the first one (the probe) is made before the start.
RACED = TOP_LEVEL[::-1][:8]
TRIES = 5
# Write grants per try: their placeholders are made one grant after another, so the last
# grant's last names are made well after bwrap could have started its program (about 50 ms of
# making on a quiet machine): a release sent too early loses this race, not only in theory.
GRANTS = 12


@pytest.fixture
def folders(running_box: RunningBox) -> Iterator[list[Path]]:
    """GRANTS fresh folders of the owner's, each holding one file and no protected name."""
    owner = running_box.owner
    top = owner.home / f"held-{secrets.token_hex(4)}"
    made = [top / f"w{n:02}" for n in range(GRANTS)]
    for path in made:
        path.mkdir(parents=True)
        (path / "readme.txt").write_text("hello\n")
    for path in (top, *made, *(p / "readme.txt" for p in made)):
        os.chown(path, owner.uid, owner.gid)
    yield made
    subprocess.run(["chattr", "-R", "-i", str(top)], capture_output=True, check=False)
    shutil.rmtree(top, ignore_errors=True)


def test_the_programs_first_act_cannot_plant_a_name_before_its_placeholder(
    running_box: RunningBox, folders: list[Path]
) -> None:
    folder = folders[-1]  # its placeholders are made last
    plants = "".join(
        f"(: > '{n}') 2>/dev/null && echo 'LEAK:{n}'; "
        f"(echo pwn >> '{n}') 2>/dev/null && echo 'LEAK:{n}:append'; "
        for n in RACED
    )
    for attempt in range(TRIES):
        result = running_box.run(
            *(f"--write={f}" for f in folders),
            cmd=["/bin/sh", "-c", f"cd '{folder}' && {{ {plants} echo raced; }}"],
        )
        left = {f.name: sorted(os.listdir(f)) for f in folders}
        assert left == {f.name: ["readme.txt"] for f in folders}, f"try {attempt}: {left}"
        assert [line for line in result.stdout.splitlines() if "LEAK" in line] == [], attempt
        assert result.returncode == 0 and result.stdout.endswith("raced\n"), result.stderr


def test_a_held_start_still_runs_the_program_and_its_writes_land(
    running_box: RunningBox, folders: list[Path]
) -> None:
    folder = folders[0]
    result = running_box.sh(f"cd '{folder}' && echo made > made.txt && ls -a", f"--write={folder}")
    assert result.returncode == 0, result.stderr
    assert set(TOP_LEVEL) <= set(result.stdout.split()), "a placeholder missing inside"
    assert (folder / "made.txt").read_text() == "made\n"
    assert sorted(os.listdir(folder)) == ["made.txt", "readme.txt"]
