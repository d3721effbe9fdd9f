"""The test boxes' teardown (box_teardown.end_box): a process of the box that `lnk box down`
missed (no pidfile, SIGTERM ignored) is killed and waited for, and the mount it made under the
run dir is gone after, as are the mounts a plain `umount <run dir>/sandboxes` leaves (one made
beside it, one stacked under it). Another box's process and mount are left alone."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from box_teardown import box_pids, end_box, mounts_under

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

# Mounts a tmpfs on $1, says so, then ignores SIGTERM and waits forever: a controller that
# `box down` could not stop and nobody waited for.
HOLDER = 'trap "" TERM; mount -t tmpfs lnk-test-holder "$1" && echo mounted && exec sleep 1000'


def _holder(run_dir: Path, point: Path) -> subprocess.Popen[str]:
    point.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        ["/bin/sh", "-c", HOLDER, "sh", str(point)],
        env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LNK_RUN_DIR": str(run_dir)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "mounted\n"
    return holder


@pytest.fixture
def run_dirs() -> Iterator[tuple[Path, Path]]:
    tag = secrets.token_hex(4)
    dirs = (Path(f"/run/lnk-test-td-{tag}"), Path(f"/run/lnk-test-td-{tag}-other"))
    try:
        yield dirs
    finally:
        for run_dir in dirs:
            for pid in box_pids(run_dir):
                os.kill(pid, 9)
            for point in mounts_under(run_dir):
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
            shutil.rmtree(run_dir, ignore_errors=True)


def test_a_process_box_down_missed_is_ended_before_its_mounts_are_removed(
    run_dirs: tuple[Path, Path],
) -> None:
    ours, other = run_dirs
    late = _holder(ours, ours / "sandboxes")
    beside = _holder(ours, ours / "flags" / "held")
    theirs = _holder(other, other / "sandboxes")
    try:
        # What the teardown did before: one lazy unmount of <run dir>/sandboxes.
        subprocess.run(["umount", "-l", str(ours / "sandboxes")], check=True)
        assert mounts_under(ours) == [str(ours / "flags" / "held")], "the old teardown leaves it"
        subprocess.run(
            ["mount", "-t", "tmpfs", "lnk-test-late", str(ours / "sandboxes")], check=True
        )

        assert end_box(ours) == []

        assert late.wait(timeout=30) == -9 and beside.wait(timeout=30) == -9
        assert mounts_under(ours) == []
        assert box_pids(ours) == []
        assert theirs.poll() is None, "another box's process is not ours to end"
        assert mounts_under(other) == [str(other / "sandboxes")]
    finally:
        for process in (late, beside, theirs):
            process.kill()
            process.wait(timeout=30)
            if process.stdout is not None:
                process.stdout.close()
