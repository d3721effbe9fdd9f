"""lnk_controller._placeholder_calls (ext/placeholder_calls.c), the placeholder syscalls in
batches with the GIL released, attacked call by call: a link swapped in on the way, a name that
exists, a step that leaves the grant, a folder the owner may not write (the C runs under the
calling thread's file ids), a filled placeholder and a replaced inode at clean-up."""

from __future__ import annotations

import errno
import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_controller import _placeholder_calls as calls
from lnk_controller.as_caller import credentials_of
from lnk_controller.placeholder_make import make_all_as_owner, make_batch_as_owner, set_immutable
from lnk_controller.placeholders import GIT_PLACEHOLDER_CONTENT, MAX_PLACEHOLDER_BYTES

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="FS_IMMUTABLE_FL and fs ids need root")
CONTENTS = (b"", *GIT_PLACEHOLDER_CONTENT.values())
NOBODY = pwd.getpwnam("nobody").pw_uid


@pytest.fixture
def grant(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    path = tmp_path / "grant"
    (path / ".git").mkdir(parents=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    yield path, fd
    os.close(fd)
    for entry in path.rglob("*"):
        if not entry.is_symlink():
            opened = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            set_immutable(opened, False)
            os.close(opened)


def _close(made: list[tuple[int, int, int, int, int, int]]) -> None:
    for fd, parent, *_ in made:
        os.close(fd)
        os.close(parent)


def _made(path: Path) -> tuple[bytes | None, bytes, int, int]:
    info = os.lstat(path)
    return None, os.fsencode(path), info.st_dev, info.st_ino


def test_the_limits_are_placeholders_own() -> None:
    assert calls.MAX_CONTENT == MAX_PLACEHOLDER_BYTES
    assert all(len(content) <= calls.MAX_CONTENT for content in CONTENTS)


def test_a_batch_is_made_in_order_and_each_answer_is_its_inode(grant: tuple[Path, int]) -> None:
    path, fd = grant
    entries = (((), b".claude", None), ((b".git",), b"commondir", b".\n"))
    made, err = calls.make(fd, entries)
    try:
        assert err == 0 and len(made) == 2
        for (_, parent, dev, ino, uid, gid), name in zip(
            made, [".claude", ".git/commondir"], strict=False
        ):
            info = os.lstat(path / name)
            assert (dev, ino, uid, gid) == (info.st_dev, info.st_ino, 0, 0)
            assert os.fstat(parent).st_ino == os.lstat((path / name).parent).st_ino
        assert stat.S_IMODE(os.lstat(path / ".claude").st_mode) == 0o555
        assert stat.S_IMODE(os.lstat(path / ".git/commondir").st_mode) == 0o444
        assert (path / ".git/commondir").read_bytes() == b".\n"
    finally:
        _close(made)


@pytest.mark.parametrize(
    ("parts", "name", "code"),
    [
        pytest.param((b"..",), b"escaped", errno.EINVAL, id="dotdot-step-leaves-the-grant"),
        pytest.param((), b"..", errno.EINVAL, id="dotdot-name"),
        pytest.param((b"a/b",), b"x", errno.EINVAL, id="two-steps-in-one"),
        pytest.param((), b"", errno.EINVAL, id="empty-name"),
        pytest.param((b".link",), b"info", errno.ENOTDIR, id="link-on-the-way"),
        pytest.param((), b".existing", errno.EEXIST, id="folder-name-exists"),
        pytest.param((), b".link", errno.EEXIST, id="name-is-a-link"),
    ],
)
def test_a_hostile_entry_stops_the_batch_and_makes_nothing_elsewhere(
    grant: tuple[Path, int], tmp_path: Path, parts: tuple[bytes, ...], name: bytes, code: int
) -> None:
    path, fd = grant
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (path / ".link").symlink_to(elsewhere)
    (path / ".existing").mkdir()
    made, err = calls.make(fd, (((), b".first", None), (parts, name, None), ((), b".after", None)))
    _close(made)
    assert err in (code, errno.ELOOP) if code == errno.ENOTDIR else err == code
    assert len(made) == 1  # the first made, nothing after the refused one tried
    assert not (path / ".after").exists() and not (tmp_path / "escaped").exists()
    assert list(elsewhere.iterdir()) == [] and list((path / ".existing").iterdir()) == []


def test_a_file_already_there_is_not_taken_over(grant: tuple[Path, int]) -> None:
    path, fd = grant
    (path / ".envrc").write_text("mine")
    made, err = calls.make(fd, (((), b".envrc", b""),))
    assert (made, err) == ([], errno.EEXIST)
    assert (path / ".envrc").read_text() == "mine"


def test_a_folder_the_owner_may_not_write_is_refused_as_the_owner(
    grant: tuple[Path, int],
) -> None:
    """The C runs on the calling thread, under caller_credentials' file ids: root's own folder
    is not nobody's to write (EACCES), and root's fallback makes nothing in another's folder."""
    path, fd = grant
    making = make_batch_as_owner(
        fd, [(".claude", None)], caller=credentials_of(NOBODY), owner_uid=NOBODY
    )
    assert making.failed is None and making.made == [(".claude", None)]
    assert not (path / ".claude").exists()


def test_what_is_made_as_the_owner_is_the_owner_s(grant: tuple[Path, int]) -> None:
    path, fd = grant
    os.chown(path, NOBODY, -1)
    making = make_batch_as_owner(
        fd, [(".claude", None)], caller=credentials_of(NOBODY), owner_uid=NOBODY
    )
    try:
        ((_entry, opened),) = making.made
        assert making.failed is None and opened is not None
        assert opened.uid == NOBODY == os.lstat(path / ".claude").st_uid  # fsuid, not root
    finally:
        if opened is not None:
            os.close(opened.fd)
            os.close(opened.parent_fd)


def test_a_seal_sets_the_flag_and_a_name_swapped_before_it_is_not_sealed(
    grant: tuple[Path, int],
) -> None:
    path, fd = grant
    made, err = calls.make(fd, (((), b".one", None), ((), b".two", None)))
    try:
        assert err == 0
        os.rename(path / ".two", path / ".moved")  # the name is another's (none) now
        items = tuple(
            (m[0], m[1], name, *m[2:]) for m, name in zip(made, [b".one", b".two"], strict=False)
        )
        sealed, err = calls.seal(items, NOBODY, NOBODY)
        assert (sealed, err) == ([True, False], 0)
        assert os.lstat(path / ".one").st_uid == NOBODY  # made the owner's before the flag
        with pytest.raises(PermissionError):
            os.rmdir(path / ".one")
    finally:
        _close(made)


def test_a_seal_refuses_the_ids_that_mean_leave_it() -> None:
    with pytest.raises(ValueError, match="real ids"):
        calls.seal((), 2**32 - 1, 0)


def test_removal_removes_only_what_is_still_the_placeholder(
    grant: tuple[Path, int], tmp_path: Path
) -> None:
    path, fd = grant
    entries = (
        *tuple(
            ((), name, content)
            for name, content in [
                (b".kept", None),
                (b".filled", b""),
                (b".replaced", None),
                (b".gone", None),
                (b".git-dir", None),
            ]
        ),
        ((b".git",), b"commondir", b".\n"),
    )
    made, err = calls.make(fd, entries)
    _close(made)
    assert err == 0
    records = [_made(path / os.fsdecode(e[1])) for e in entries[:-1]]
    records.append(_made(path / ".git/commondir"))
    (path / ".filled").write_bytes(b"attacker's")  # someone filled it: theirs now
    os.rename(path / ".replaced", path / ".old")
    (path / ".replaced").mkdir()  # another inode by the same name (the old one still held)
    os.rmdir(path / ".old")
    os.rmdir(path / ".gone")
    (path / ".git-dir" / "inside").mkdir()  # a folder someone filled
    results = calls.remove(tuple(records), CONTENTS)
    statuses = [status for status, _, _ in results]
    assert statuses == [
        calls.REMOVED,
        calls.KEPT,
        calls.NOT_THERE,
        calls.NOT_THERE,
        calls.KEPT,
        calls.REMOVED,
    ]
    for status, value, _ in results:
        if status == calls.REMOVED:
            os.close(value)
    assert not (path / ".kept").exists() and not (path / ".git/commondir").exists()
    assert (path / ".filled").read_bytes() == b"attacker's"
    assert (path / ".replaced").is_dir() and (path / ".git-dir" / "inside").is_dir()


def test_removal_tries_the_staged_path_first_then_the_host_s(grant: tuple[Path, int]) -> None:
    path, fd = grant
    made, _err = calls.make(fd, (((), b".vscode", None),))
    _close(made)
    _, host, dev, ino = _made(path / ".vscode")
    moved = os.fsencode(path / "nowhere" / ".vscode")  # the staged mount gone: not there
    ((status, value, which),) = calls.remove(((moved, host, dev, ino),), CONTENTS)
    assert (status, which) == (calls.REMOVED, 1)
    os.close(value)
    assert not (path / ".vscode").exists()


def test_a_link_in_a_placeholder_s_place_is_not_followed_at_removal(
    grant: tuple[Path, int], tmp_path: Path
) -> None:
    path, _fd = grant
    target = tmp_path / "target"
    target.mkdir()
    info = os.lstat(target)
    (path / ".idea").symlink_to(target)  # the target's own inode, through a link
    ((status, _, _),) = calls.remove(
        ((None, os.fsencode(path / ".idea"), info.st_dev, info.st_ino),), CONTENTS
    )
    assert status == calls.NOT_THERE and target.is_dir()


def test_an_error_is_reported_for_its_item_and_the_others_are_still_removed(
    grant: tuple[Path, int],
) -> None:
    path, fd = grant
    made, _err = calls.make(fd, (((), b".a", None), ((), b".b", None)))
    _close(made)
    records = (_made(path / ".a"), _made(path / ".b"))
    folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert set_immutable(folder, True)  # even root's rmdir in it: EPERM
        results = calls.remove(records, CONTENTS)
    finally:
        set_immutable(folder, False)
        os.close(folder)
    assert [(s, v, w) for s, v, w in results] == [(calls.ERROR, errno.EPERM, 1)] * 2
    again = calls.remove(records, CONTENTS)  # both were left as they were: a retry removes them
    assert [s for s, _, _ in again] == [calls.REMOVED] * 2
    for _, value, _ in again:
        os.close(value)
    assert not (path / ".a").exists() and not (path / ".b").exists()


@pytest.mark.parametrize(
    "entries",
    [
        pytest.param([(((), b".x", None))], id="not-a-tuple"),
        pytest.param((([b".git"], b"x", None),), id="parts-a-list"),
        pytest.param((((), b".x", "text"),), id="content-text"),
        pytest.param((((), b".x", b"x" * 17),), id="content-too-long"),
        pytest.param((((), b".x\0y", None),), id="nul-in-name"),
        pytest.param((((b"a\0b",), b".x", None),), id="nul-in-part"),
    ],
)
def test_malformed_arguments_are_refused_before_any_syscall(
    grant: tuple[Path, int], entries: object
) -> None:
    path, fd = grant
    with pytest.raises((TypeError, ValueError)):
        calls.make(fd, entries)  # type: ignore[arg-type]
    assert not (path / ".x").exists()


def test_an_entry_stepping_out_of_the_grant_makes_nothing_outside(
    grant: tuple[Path, int], tmp_path: Path
) -> None:
    """Through placeholder_make's own call: a step of `..` (O_NOFOLLOW does not stop it) would
    have made the placeholder in the grant's parent, as root."""
    _, fd = grant
    with pytest.raises(OSError) as refused:
        list(make_all_as_owner(fd, [("../escaped", None)], caller=None, owner_uid=0))
    assert refused.value.errno == errno.EINVAL
    assert not (tmp_path / "escaped").exists()
