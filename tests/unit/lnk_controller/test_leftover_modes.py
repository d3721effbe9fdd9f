"""The end-of-sandbox sweep: the decision as a table, then real files on this disk (statx's
birth time, links never followed, the owner's older files left as they were)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from lnk_controller.leftover_modes import Examined, examine, stripped_mode, sweep

START = 1_000_000_000_000
BEFORE, AFTER = START - 1, START + 1


def entry(mode: int, changed: int, born: int | None) -> Examined:
    return Examined(mode, changed, born, 1, (8, 1))


@pytest.mark.parametrize(
    ("mode", "changed", "born", "after"),
    [
        (stat.S_IFREG | 0o4755, AFTER, AFTER, 0o755),  # made set-uid during the run
        (stat.S_IFREG | 0o6775, AFTER, BEFORE, 0o775),  # the owner's file, changed: set-id only
        (stat.S_IFREG | 0o4755, BEFORE, BEFORE, None),  # the owner's own set-uid file
        (stat.S_IFREG | 0o666, AFTER, AFTER, 0o644),  # born 0666 (umask 0)
        (stat.S_IFREG | 0o664, AFTER, BEFORE, None),  # the owner's group-writable file
        (stat.S_IFDIR | 0o777, AFTER, AFTER, 0o755),
        (stat.S_IFDIR | 0o2775, AFTER, AFTER, 0o2755),  # set-gid folder: keeps set-gid
        (stat.S_IFDIR | 0o1777, AFTER, AFTER, 0o1755),
        (stat.S_IFREG | 0o644, AFTER, AFTER, None),
        (stat.S_IFLNK | 0o777, AFTER, AFTER, None),  # a link's mode means nothing
        (stat.S_IFREG | 0o666, AFTER, None, 0o644),  # no birth time: the ctime decides
        (stat.S_IFIFO | 0o666, AFTER, AFTER, 0o644),
        (stat.S_IFREG | 0o6777, START, START, 0o755),  # at the start counts as during
    ],
)
def test_what_is_stripped(mode: int, changed: int, born: int | None, after: int | None) -> None:
    assert stripped_mode(entry(mode, changed, born), START) == after


def _tick_past(folder: Path, moment: int) -> None:
    """Wait for the filesystem's clock (coarse, a few ms) to pass `moment`."""
    deadline = time.monotonic() + 5
    probe = folder / ".tick"
    while time.monotonic() < deadline:
        probe.write_text("")
        fd = os.open(folder, os.O_RDONLY)
        try:
            now = examine(fd, probe.name).changed_ns
        finally:
            os.close(fd)
        probe.unlink()
        if now > moment:
            return
    pytest.fail("the filesystem's clock did not move")


@pytest.mark.needs_root
def test_sweep_strips_what_the_run_left_and_nothing_of_the_owner(tmp_path: Path) -> None:
    grant = tmp_path / "grant"
    grant.mkdir()
    old_suid = grant / "owner-suid"
    old_suid.write_text("")
    old_suid.chmod(0o4755)
    old_shared = grant / "owner-shared"
    old_shared.write_text("")
    old_shared.chmod(0o664)
    since = max(os.lstat(p).st_ctime_ns for p in (grant, old_suid, old_shared))
    _tick_past(tmp_path, since)
    since += 1
    (grant / "deep" / "er").mkdir(parents=True)
    made = grant / "deep" / "er" / "made"
    made.write_text("")
    made.chmod(0o6777)
    (grant / "deep").chmod(0o777)
    old_shared.write_text("changed")  # changed during the run, not born: keeps g+w
    outside = tmp_path / "outside"
    outside.write_text("")
    outside.chmod(0o4777)
    (grant / "link").symlink_to(outside)
    assert sweep(grant, since) == 2
    assert stat.S_IMODE(os.lstat(made).st_mode) == 0o755
    assert stat.S_IMODE(os.lstat(grant / "deep").st_mode) == 0o755
    assert stat.S_IMODE(os.lstat(old_suid).st_mode) == 0o4755
    assert stat.S_IMODE(os.lstat(old_shared).st_mode) == 0o664
    assert stat.S_IMODE(os.lstat(outside).st_mode) == 0o4777  # the link was not followed


@pytest.mark.needs_root
def test_sweep_of_a_single_file_grant(tmp_path: Path) -> None:
    since = time.time_ns() - 10**9
    file = tmp_path / "one"
    file.write_text("")
    file.chmod(0o4766)
    assert sweep(file, since) == 1
    assert stat.S_IMODE(os.lstat(file).st_mode) == 0o744


@pytest.mark.needs_root
def test_sweep_examines_only_what_changed_since_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry older than the run is passed over on its lstat (its bits stay anyway); one the
    run changed is still examined and stripped, also deep below untouched folders."""
    grant = tmp_path / "grant"
    (grant / "old" / "older").mkdir(parents=True)
    for n in range(5):
        (grant / "old" / f"f{n}").write_text("")
    kept = grant / "old" / "older" / "owner-suid"
    kept.write_text("")
    kept.chmod(0o4755)
    since = max(os.lstat(p).st_ctime_ns for p in grant.rglob("*"))
    _tick_past(tmp_path, since)
    since += 1
    changed = grant / "old" / "older" / "f-made-set-uid"
    changed.write_text("")
    changed.chmod(0o4777)
    examined: list[str] = []
    real = examine

    def counting(dir_fd: int, name: str) -> Examined:
        examined.append(name)
        return real(dir_fd, name)

    monkeypatch.setattr("lnk_controller.leftover_modes.examine", counting)
    assert sweep(grant, since) == 1
    # the grant's top (examined first, as before) and the one changed: `older` itself changed
    # too (a name was made in it), the rest are the owner's older entries
    assert sorted(examined) == ["f-made-set-uid", "grant", "older"]
    assert stat.S_IMODE(os.lstat(changed).st_mode) == 0o755
    assert stat.S_IMODE(os.lstat(kept).st_mode) == 0o4755
