"""Looking up as the caller: a thread's file credentials, what they hide, and that they end."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_controller.as_caller import (
    CallerCredentials,
    caller_credentials,
    credentials_of,
    peer_credentials,
)
from lnk_shared.discovery import PathNotFound, resolve_path, viewer_uid

pytestmark = pytest.mark.needs_root

NOBODY = CallerCredentials(65534, 65534, ())


@pytest.fixture
def private() -> Iterator[Path]:
    """A root-only folder (0700) holding a file, a folder and a link, under a 0755 parent that
    anyone reaches (pytest's own tmp_path is in a 0700 folder)."""
    parent = Path(tempfile.mkdtemp(prefix="lnk-as-caller-", dir="/tmp"))
    parent.chmod(0o755)
    folder = parent / "private"
    (folder / "inner").mkdir(parents=True)
    (folder / "secret.txt").write_text("secret\n")
    (folder / "link").symlink_to("/etc/hostname-target-that-tells")
    folder.chmod(0o700)
    try:
        yield folder
    finally:
        shutil.rmtree(parent)


def _answer(path: str) -> str:
    try:
        resolve_path(path, base="/", home="/nonexistent")
    except PathNotFound as exc:
        return f"not found: {exc}"
    return "found"


def test_a_private_folder_is_unreachable_as_the_caller_and_reachable_after(private: Path) -> None:
    with caller_credentials(NOBODY):
        assert viewer_uid() == NOBODY.uid
        with pytest.raises(PermissionError):
            os.listdir(private)
    assert viewer_uid() == 0
    assert "secret.txt" in os.listdir(private)
    assert os.getgroups() == os.getgroups()


@pytest.mark.parametrize("name", ["secret.txt", "inner", "link", "link/x", "inner/x"])
def test_what_exists_in_a_private_folder_answers_as_what_does_not(private: Path, name: str) -> None:
    first = name.partition("/")[0]
    with caller_credentials(NOBODY):
        seen = _answer(str(private / name))
        absent = _answer(str(private / name).replace(first, "absent", 1))
    assert seen == f"not found: {private / first}"  # stopped in the folder
    assert seen.replace(first, "absent", 1) == absent
    assert "tells" not in seen  # nothing of the link's target
    assert _answer(str(private / "secret.txt")) == "found"  # root's own view is unchanged


def test_another_users_process_in_proc_answers_as_a_process_that_does_not_exist() -> None:
    missing = 4_194_304 + 1  # above pid_max's limit: never a process
    with caller_credentials(NOBODY):
        for tail in ("cwd", "root", "fd/0", "exe"):
            other = _answer(f"/proc/1/{tail}")
            assert other == "not found: /proc/1", other
            assert _answer(f"/proc/{missing}/{tail}") == f"not found: /proc/{missing}"
        assert _answer("/proc/self/cwd").startswith("not found")  # the controller's own


def test_the_callers_own_process_in_proc_is_followed() -> None:
    assert _answer(f"/proc/{os.getpid()}/cwd") == "found"  # root's own, looked up as root


def test_other_threads_keep_roots_credentials_meanwhile(private: Path) -> None:
    inside, done = threading.Event(), threading.Event()
    seen: list[object] = []

    def switched() -> None:
        with caller_credentials(NOBODY):
            inside.set()
            done.wait(10)

    thread = threading.Thread(target=switched)
    thread.start()
    try:
        assert inside.wait(10)
        seen.append(viewer_uid())
        seen.append("secret.txt" in os.listdir(private))
    finally:
        done.set()
        thread.join()
    assert seen == [0, True]


def test_credentials_come_back_after_an_error_inside(private: Path) -> None:
    groups = os.getgroups()
    with pytest.raises(RuntimeError), caller_credentials(CallerCredentials(65534, 65534, (4,))):
        raise RuntimeError("boom")
    assert viewer_uid() == 0
    assert os.getgroups() == groups
    assert "secret.txt" in os.listdir(private)


def test_the_callers_groups_open_what_its_group_may(private: Path) -> None:
    shared = private.parent / "group-only"
    shared.mkdir()
    os.chown(shared, 0, 4242)
    shared.chmod(0o770)
    with caller_credentials(CallerCredentials(65534, 65534, (4242,))):
        assert os.listdir(shared) == []
    with caller_credentials(NOBODY), pytest.raises(PermissionError):
        os.listdir(shared)


def test_peer_credentials_are_the_kernels_record_of_the_peer() -> None:
    left, right = socket.socketpair()
    with left, right:
        creds = peer_credentials(left, 0, 0)
    assert set(creds.groups) == set(os.getgroups())


def test_credentials_of_an_unknown_uid_is_a_clear_error() -> None:
    with pytest.raises(Exception, match="no entry in the password database"):
        credentials_of(2_999_999_999)
