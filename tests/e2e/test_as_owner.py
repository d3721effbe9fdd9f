"""The owner-running helpers (`as_owner.py`) against the session's real box and owner: a program
runs as the owner (uid, gid, groups; not root), from the folder asked for, with an empty stdin
unless given one, in the owner's environment pointed at a private box's folders and nothing
else of it."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from as_owner import owner_env, owner_tmp, run_as_owner, start_as_owner

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

ID = ["/bin/sh", "-c", 'echo "$(id -u) $(id -g) $(id -G)"; pwd; cat; echo "$LNK_RUN_DIR"']


def test_a_program_runs_as_the_owner_from_the_folder_asked_for(running_box: RunningBox) -> None:
    owner = running_box.owner
    groups = sorted(os.getgrouplist(owner.name, owner.gid))
    with owner_tmp("lnko-e2e-") as folder:
        from_home = run_as_owner(running_box, ID)
        from_folder = run_as_owner(running_box, ID, cwd=folder, input="said\n")
    for ran in (from_home, from_folder):
        assert ran.returncode == 0, ran.stderr
        ids = ran.stdout.splitlines()[0].split()
        assert [int(i) for i in ids[:2]] == [owner.uid, owner.gid]
        assert sorted(int(g) for g in ids[2:]) == groups
    assert from_home.stdout.splitlines()[1:] == [str(owner.home), str(running_box.run_dir)]
    assert from_folder.stdout.splitlines()[1:] == [str(folder), "said", str(running_box.run_dir)]
    assert not folder.exists()  # owner_tmp removed it


def test_the_owners_environment_takes_only_a_boxs_lnk_folders(running_box: RunningBox) -> None:
    box = SimpleNamespace(env={"LNK_RUN_DIR": "/run/other", "PATH": "/nowhere", "HOME": "/"})
    env = owner_env(running_box, box, EXTRA="1")
    assert env == {**running_box.owner_env(), "LNK_RUN_DIR": "/run/other", "EXTRA": "1"}
    started = start_as_owner(running_box, ID, box=box)
    out, err = started.communicate(timeout=60)  # closes its stdin: `cat` ends
    assert started.returncode == 0, err
    assert out.splitlines()[-1] == "/run/other"


def test_a_folder_of_owner_tmp_is_removed_even_when_the_block_fails() -> None:
    with pytest.raises(RuntimeError), owner_tmp("lnko-e2e-") as folder:
        (folder / "left").write_text("x")
        assert folder.stat().st_mode & 0o777 == 0o755  # the owner can enter it
        raise RuntimeError("the test's own failure")
    assert not Path(folder).exists()
