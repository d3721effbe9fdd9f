"""lnk_controller.placeholders in a held start (staging.stage_placeholders, make_held): before
the start only the first under each folder is made, and where it sealed the rest wait for the
held start; where the filesystem has no immutable flag (ramfs here) every one is made before
the start, as before, keeping the wall's bind; a held one that does not seal refuses the
launch."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

from lnk_controller import placeholders
from lnk_controller.placeholder_make import set_immutable
from lnk_controller.placeholder_plan import HeldPlaceholders, WriteGrant
from lnk_controller.placeholders import (
    make_held,
    placeholder_entries,
    remove_placeholder,
    settle,
    stage_placeholders,
)
from lnk_shared.errors import LaunchRefused
from lnk_shared.paths import PROJECT_RUN_DOT_ENTRIES

TOP_LEVEL = sorted({entry.split("/")[0] for entry in PROJECT_RUN_DOT_ENTRIES})
IN_GIT = sorted(e for e in PROJECT_RUN_DOT_ENTRIES if e.startswith(".git/"))

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="FS_IMMUTABLE_FL and mounts need root")


class Records:
    """The store's add_mounts, kept in memory."""

    def __init__(self) -> None:
        self.records: list[str] = []

    def add_mounts(self, sandbox_id: str, records: list[str]) -> None:
        self.records += records


def _unseal_all(path: Path) -> None:
    for entry in path.rglob("*"):
        if entry.is_mount():
            continue
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            set_immutable(fd, False)
        finally:
            os.close(fd)


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "project"
    path.mkdir()
    yield path
    _unseal_all(path)  # a failed test must not leave immutable entries behind


@pytest.fixture
def ramfs(tmp_path: Path) -> Iterator[Path]:
    """A folder on ramfs, which has no FS_IMMUTABLE_FL."""
    path = tmp_path / "ramfs"
    path.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "lnk-test", str(path)], check=True)
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def _stage(folder: Path, records: Records, *, hold: bool) -> tuple[list[tuple[str, bool]], Any]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    made, held = stage_placeholders(
        sandbox_id="sbx-test",
        store=records,  # type: ignore[arg-type]
        grant=WriteGrant(str(folder), fd, "", os.getuid(), os.getgid()),
        as_files=False,
        caller=None,
        hold=hold,
    )
    if held is None:
        os.close(fd)
    return made, held


def _make_held(held: HeldPlaceholders, records: Records) -> None:
    try:
        make_held((held,), sandbox_id="sbx-test", store=records, caller=None)  # type: ignore[arg-type]
    finally:
        os.close(held.grant.source_fd)


def test_a_held_start_makes_the_probe_first_and_every_one_before_the_release(
    folder: Path,
) -> None:
    records = Records()
    made, held = _stage(folder, records, hold=True)
    assert held is not None and held.making is not None, "the rest begun on a worker"
    assert sorted(os.path.basename(p) for p, _ in made) == TOP_LEVEL  # all listed...
    assert all(sealed for _, sealed in made)  # ...as sealed: the wall binds none of them
    assert TOP_LEVEL[0] in os.listdir(folder), "the probe is made before the start"
    assert [e for e, _ in held.entries] == TOP_LEVEL[1:]
    _make_held(held, records)
    assert sorted(os.listdir(folder)) == TOP_LEVEL
    with pytest.raises(PermissionError):
        (folder / TOP_LEVEL[-1]).rmdir()  # sealed: immutable
    assert len(records.records) == len(TOP_LEVEL)  # every one recorded, so clean-up finds it
    for record in records.records:
        remove_placeholder(record)
    assert os.listdir(folder) == []


def test_without_hold_every_placeholder_is_made_before_the_start(folder: Path) -> None:
    made, held = _stage(folder, Records(), hold=False)
    assert held is None
    assert sorted(os.listdir(folder)) == TOP_LEVEL
    assert all(sealed for _, sealed in made)


def test_where_the_flag_does_not_take_every_one_is_made_before_the_start_unsealed(
    ramfs: Path,
) -> None:
    records = Records()
    made, held = _stage(ramfs, records, hold=True)
    assert held is None, "a held start on a filesystem without the flag"
    assert sorted(os.listdir(ramfs)) == TOP_LEVEL
    assert not any(sealed for _, sealed in made), "unsealed ones must keep the wall's bind"
    for record in records.records:
        remove_placeholder(record)


def test_a_git_folder_on_another_filesystem_has_its_own_probe(folder: Path) -> None:
    """`.git` on ramfs inside a grant on ext4: the top's placeholders wait for the held start,
    `.git`'s are all made before it (unsealed, each bound by the wall)."""
    git = folder / ".git"
    git.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "lnk-test", str(git)], check=True)
    try:
        records = Records()
        made, held = _stage(folder, records, hold=True)
        assert held is not None
        in_git = {os.path.relpath(p, folder): s for p, s in made if "/.git/" in p}
        assert sorted(in_git) == IN_GIT and not any(in_git.values())
        assert sorted(os.listdir(git)) == sorted(e.split("/")[1] for e in IN_GIT)
        assert all("/" not in e for e, _ in held.entries), "a .git entry left for the start"
        _make_held(held, records)
        for record in records.records:
            remove_placeholder(record)
        assert os.listdir(git) == []
    finally:
        subprocess.run(["umount", "-l", str(git)], check=False)


def test_a_held_placeholder_that_does_not_seal_refuses_the_launch(ramfs: Path) -> None:
    records = Records()
    fd = os.open(ramfs, os.O_RDONLY | os.O_DIRECTORY)
    entries = tuple(placeholder_entries(fd, as_files=False)[:2])
    held = HeldPlaceholders(WriteGrant(str(ramfs), fd, "", os.getuid(), os.getgid()), entries)
    with pytest.raises(LaunchRefused, match="could not be made immutable as the sandbox started"):
        _make_held(held, records)
    assert len(records.records) == 2, "made, so recorded for the clean-up"
    for record in records.records:
        remove_placeholder(record)
    assert os.listdir(ramfs) == []


@pytest.fixture
def one_busy_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The placeholders' workers as one, held busy until the event is set: a held start's
    making waits in its queue while the test acts."""
    pool = futures.ThreadPoolExecutor(1)
    go = threading.Event()
    pool.submit(go.wait)
    monkeypatch.setattr(placeholders, "_MAKERS", pool)
    yield go
    go.set()
    pool.shutdown(wait=True)


def _reuse_number(folder: Path, number: int) -> int:
    """`folder` opened at the closed descriptor `number`, as the next open would usually land
    (in the whole suite a lower number may be free, so the plain open is not sure to reuse it)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    if fd == number:
        return fd
    try:
        return os.dup2(fd, number, inheritable=False)
    finally:
        os.close(fd)


def test_a_failed_launch_s_clean_up_waits_for_the_making_and_finds_every_one(
    folder: Path, tmp_path: Path, one_busy_worker: threading.Event
) -> None:
    """The launch fails before `make_held` and closes the owner's descriptor at once; its
    number is reused for another folder before the worker starts. The worker makes every
    placeholder in the grant (its own descriptor), nothing in the other folder, and `settle`
    returns only once all of them are in the record the clean-up reads."""
    records = Records()
    _, held = _stage(folder, records, hold=True)
    assert held is not None
    os.close(held.grant.source_fd)
    other = tmp_path / "other"
    other.mkdir()
    reused = _reuse_number(other, held.grant.source_fd)
    try:
        assert reused == held.grant.source_fd, "the test needs the number reused"
        waiting = threading.Thread(target=settle, args=("sbx-test",))
        waiting.start()
        waiting.join(0.2)
        assert waiting.is_alive(), "settle returned before the making was done"
        one_busy_worker.set()
        waiting.join()
    finally:
        os.close(reused)
    assert os.listdir(other) == []
    assert sorted(os.listdir(folder)) == TOP_LEVEL
    assert len(records.records) == len(TOP_LEVEL)
    for record in records.records:
        remove_placeholder(record)
    assert os.listdir(folder) == []


def test_a_staging_begun_on_a_worker_is_settled_with_the_making_it_began(
    folder: Path, tmp_path: Path, one_busy_worker: threading.Event
) -> None:
    """`begin_staging` (the probes and the held making begun from the worker) for a launch
    that fails before it waits: its descriptor is closed and the number reused for another
    folder before the worker starts. `settle` returns only once the held making the worker
    began is done too, with every placeholder in the record; nothing is made in the other
    folder."""
    records = Records()
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    grant = WriteGrant(str(folder), fd, "", os.getuid(), os.getgid())
    begun = placeholders.begin_staging(
        sandbox_id="sbx-test", store=records, grant=grant, as_files=False, caller=None
    )
    os.close(fd)
    other = tmp_path / "other"
    other.mkdir()
    reused = _reuse_number(other, fd)
    try:
        assert reused == fd, "the test needs the number reused"
        waiting = threading.Thread(target=settle, args=("sbx-test",))
        waiting.start()
        one_busy_worker.set()
        waiting.join()
        made, held = begun.result()
        assert held is not None and held.making is not None
        assert held.making.done(), "settle returned before the held making was done"
    finally:
        os.close(reused)
    assert os.listdir(other) == []
    assert sorted(os.listdir(folder)) == TOP_LEVEL
    assert len(records.records) == len(TOP_LEVEL) == len(made)
    for record in records.records:
        remove_placeholder(record)
    assert os.listdir(folder) == []
