"""Placeholders held by the kernel's immutable flag, not by a mount: a launch with a write grant
binds no read-only mount over them (a mount each was most of a write grant's start), and every
way to plant one of the protected names from inside is still refused, nothing landing outside.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user
from install_prefix import LNK

from lnk_shared.protected_names import PROTECTED_NAMES

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = pytest.mark.needs_root

TOP_LEVEL = sorted({n.path for n in PROTECTED_NAMES if "/" not in n.path})
STARTED = "lnk-sealed-test: started"


@pytest.fixture
def folder(running_box: RunningBox) -> Iterator[Path]:
    """A fresh folder of the owner's with no protected entry, and one existing dot entry."""
    owner = running_box.owner
    path = owner.home / f"sealed-{secrets.token_hex(4)}"
    path.mkdir()
    (path / "readme.txt").write_text("hello\n")
    for made in (path, path / "readme.txt"):
        os.chown(made, owner.uid, owner.gid)
    yield path
    subprocess.run(["chattr", "-R", "-i", str(path)], capture_output=True, check=False)
    shutil.rmtree(path, ignore_errors=True)


def _mount_points(mountinfo: str) -> set[str]:
    return {line.split(" ")[4] for line in mountinfo.splitlines() if line.count(" ") > 4}


def test_no_mount_over_a_placeholder_and_every_plant_refused(
    running_box: RunningBox, folder: Path
) -> None:
    plants = "".join(
        f"(echo pwn > '{n}') 2>/dev/null && echo 'LEAK:{n}:write'; "
        f"(mkdir -p '{n}/x') 2>/dev/null && echo 'LEAK:{n}:mkdir'; "
        f"(rm -rf '{n}' && echo pwn > '{n}') 2>/dev/null && echo 'LEAK:{n}:rm'; "
        f"(mv '{n}' '{n}.aside' && echo pwn > '{n}') 2>/dev/null && echo 'LEAK:{n}:mv'; "
        for n in TOP_LEVEL
    )
    result = running_box.sh(
        f"echo {STARTED}; cat /proc/self/mountinfo; echo ==; cd {folder} && {{ {plants} true; }}"
        "; echo made > made.txt",
        f"--write={folder}",
    )
    first, _, rest = result.stdout.partition("\n")
    assert first == STARTED, f"the sandbox did not start: {result.stderr}"
    mountinfo, _, attack = rest.partition("==\n")
    points = _mount_points(mountinfo)
    assert str(folder) in points, "the write grant itself is a mount: the listing is real"
    covered = sorted(p for p in points if p.startswith(f"{folder}/"))
    assert covered == [], f"read-only binds over placeholders: {covered}"
    assert [line for line in attack.splitlines() if line.startswith("LEAK")] == []
    assert sorted(os.listdir(folder)) == ["made.txt", "readme.txt"]
    assert (folder / "made.txt").read_text() == "made\n", "the granted write did not land"


def test_a_folder_moved_on_the_host_while_the_sandbox_runs_keeps_no_placeholder(
    running_box: RunningBox, folder: Path
) -> None:
    """The owner renames the write folder while its sandbox runs (as a looping swapper or a
    tidy-up would): the placeholders went with it, and the clean-up must still find and remove
    every one (it looks through the grant's staged mount, which holds the folder itself). Left
    there, they would be immutable folders in the owner's project that even the owner cannot
    remove."""
    box = running_box
    moved = folder.with_name(folder.name + "-moved")
    argv = as_user(box.owner.uid, box.owner.gid, str(LNK), "sandbox", "run", "--yes")
    launch = [*argv, f"--write={folder}", "--", "/bin/sh", "-c", f"echo {STARTED}; read go"]
    with subprocess.Popen(
        launch,
        env=box.owner_env(),
        cwd=str(box.owner.home),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as sandbox:
        try:
            assert sandbox.stdout is not None and sandbox.stdin is not None
            assert sandbox.stdout.readline().strip() == STARTED, sandbox.stderr
            assert set(TOP_LEVEL) <= set(os.listdir(folder)), "no placeholder to move"
            folder.rename(moved)
            sandbox.stdin.write("go\n")
            sandbox.stdin.close()
            assert sandbox.wait(timeout=60) == 0, sandbox.stderr
        finally:
            if sandbox.poll() is None:
                sandbox.kill()
    try:
        assert sorted(os.listdir(moved)) == ["readme.txt"], "placeholders left behind"
    finally:
        subprocess.run(["chattr", "-R", "-i", str(moved)], capture_output=True, check=False)
        shutil.rmtree(moved, ignore_errors=True)
