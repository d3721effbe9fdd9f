"""lnk_controller.placeholder_pool and its C (ext/placeholder_pool.c): a write grant's empty
folders renamed in from the owner's pool and back at clean-up, attacked the ways a clean-up can
be fooled: a placeholder filled or swapped for another inode, a link on its path, another owner's
pool, two clean-ups racing past the cap, a grant on another mount, a folder the owner may not
write, a killed controller's pool left behind."""

from __future__ import annotations

import errno
import logging
import os
import pwd
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_controller import _placeholder_pool as calls
from lnk_controller import late_close, placeholder_pool
from lnk_controller.as_caller import credentials_of
from lnk_controller.placeholder_make import make_batch_as_owner, seal_all, set_immutable
from lnk_controller.placeholders import PLACEHOLDER, remove_placeholders
from lnk_shared.errors import StateError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="FS_IMMUTABLE_FL and fs ids need root")
NOBODY = pwd.getpwnam("nobody").pw_uid
NOBODY_GID = pwd.getpwnam("nobody").pw_gid
OTHER = 64_999  # another owner: a uid with no account, as a pool folder's owner it is only a number


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "pool"
    placeholder_pool.configure(root)
    yield root
    placeholder_pool.unconfigure()


def _grant(path: Path) -> int:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, NOBODY, NOBODY_GID)
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


@pytest.fixture
def grant(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    path = tmp_path / "grant"
    fd = _grant(path)
    yield path, fd
    os.close(fd)
    _unseal(tmp_path)


def _unseal(top: Path) -> None:
    for entry in top.rglob("*"):
        if entry.is_dir() and not entry.is_symlink() and not os.path.ismount(entry):
            opened = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY)
            set_immutable(opened, False)
            os.close(opened)


def _make(fd: int, path: Path, names: list[str], owner: int = NOBODY) -> list[str]:
    """Placeholders made and sealed as `owner` (as a launch does): their clean-up records."""
    making = make_batch_as_owner(
        fd, [(name, None) for name in names], caller=credentials_of(owner), owner_uid=owner
    )
    assert making.failed is None
    made = [
        (opened, os.fsencode(name.rpartition("/")[2])) for name, opened in making.made if opened
    ]
    try:
        sealed, err = seal_all(made, owner, NOBODY_GID)
        assert err is None and all(sealed)
    finally:
        for opened, _ in made:
            os.close(opened.fd)
            os.close(opened.parent_fd)
    named = [name for name, opened in making.made if opened]
    return [
        f"{PLACEHOLDER}{o.dev}:{o.ino}:{path / name}"
        for (o, _), name in zip(made, named, strict=True)
    ]


def _inodes(records: list[str]) -> set[int]:
    return {int(record[len(PLACEHOLDER) :].split(":")[1]) for record in records}


def _pooled(root: Path, uid: int = NOBODY) -> list[str]:
    return sorted(os.listdir(root / str(uid))) if (root / str(uid)).exists() else []


def _pool_inodes(root: Path, uid: int = NOBODY) -> set[int]:
    return {int(name.split("-")[1]) for name in _pooled(root, uid) if "-" in name}


def _names(n: int) -> list[str]:
    return [f".tool{i}" for i in range(n)]


def test_a_pool_root_not_root_s_and_0700_refuses_the_start(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    with pytest.raises(StateError, match="chmod 0700"):
        placeholder_pool.configure(root)
    os.chmod(root, 0o700)
    os.chown(root, NOBODY, -1)
    with pytest.raises(StateError, match="chown root"):
        placeholder_pool.configure(root)
    assert placeholder_pool.lend(NOBODY, os.stat(tmp_path).st_dev, 1) is None


def test_the_start_empties_what_a_killed_controller_left_and_keeps_anything_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "pool"
    (root / str(NOBODY) / "1-2").mkdir(parents=True)
    (root / str(NOBODY) / "1-3" / "inside").mkdir(parents=True)  # filled: not the pool's to free
    (root / "stray").write_text("x")
    os.chmod(root, 0o700)
    with caplog.at_level(logging.WARNING, logger="lnk_controller.placeholder_pool"):
        placeholder_pool.configure(root)
    try:
        assert _pooled(root) == ["1-3"] and (root / "stray").read_text() == "x"
        assert "1-3" in caplog.text and "stray" in caplog.text
        # Nothing a previous run left is trusted: no name of it is lent.
        assert placeholder_pool.lend(NOBODY, os.stat(root).st_dev, 5) is None
    finally:
        placeholder_pool.unconfigure()


def test_nothing_is_lent_without_a_pool_on_another_filesystem_or_from_an_empty_one(
    pool: Path,
) -> None:
    dev = os.stat(pool).st_dev
    assert placeholder_pool.lend(NOBODY, dev, 3) is None  # empty
    placeholder_pool.give_back(NOBODY, [b"1-1"])
    assert placeholder_pool.lend(NOBODY, dev + 1, 3) is None
    assert placeholder_pool.lend(NOBODY, dev, 0) is None
    placeholder_pool.unconfigure()
    assert placeholder_pool.lend(NOBODY, dev, 3) is None


def test_a_clean_up_pools_the_folders_and_the_next_launch_takes_those_very_inodes(
    pool: Path, grant: tuple[Path, int]
) -> None:
    path, fd = grant
    names = [".claude", ".vscode", ".cursor"]
    first = _make(fd, path, names)
    assert remove_placeholders(first, owner_uid=NOBODY) == []
    assert [n for n in names if (path / n).exists()] == []
    owner_pool = os.stat(pool / str(NOBODY))
    assert (owner_pool.st_uid, stat.S_IMODE(owner_pool.st_mode)) == (NOBODY, 0o700)
    dev = os.stat(path).st_dev
    assert _pooled(pool) == sorted(f"{dev}-{ino}" for ino in _inodes(first))

    second = _make(fd, path, names)
    assert _inodes(second) == _inodes(first) and _pooled(pool) == []
    for name in names:
        info = os.lstat(path / name)
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (NOBODY, 0o555)
        with pytest.raises(PermissionError):  # sealed as a made one is
            os.rmdir(path / name)
    assert remove_placeholders(second, owner_uid=NOBODY) == []
    assert len(_pooled(pool)) == 3


def test_a_placeholder_filled_before_it_went_back_is_left_where_it_is(
    pool: Path, grant: tuple[Path, int]
) -> None:
    path, fd = grant
    records = _make(fd, path, [".claude", ".idea"])
    opened = os.open(path / ".claude", os.O_RDONLY | os.O_DIRECTORY)
    set_immutable(opened, False)
    os.close(opened)
    os.chmod(path / ".claude", 0o755)
    (path / ".claude" / "settings.json").write_text("the owner's")
    assert remove_placeholders(records, owner_uid=NOBODY) == []
    assert (path / ".claude" / "settings.json").read_text() == "the owner's"
    assert len(_pooled(pool)) == 1 and not (path / ".idea").exists()
    ((name,),) = [_pooled(pool)]
    assert os.listdir(pool / str(NOBODY) / name) == []


def test_another_inode_under_the_name_is_not_pooled_and_stays(
    pool: Path, grant: tuple[Path, int]
) -> None:
    path, fd = grant
    records = _make(fd, path, [".claude"])
    opened = os.open(path / ".claude", os.O_RDONLY | os.O_DIRECTORY)
    set_immutable(opened, False)
    os.close(opened)
    os.rename(path / ".claude", path / ".old")
    (path / ".claude").mkdir()
    os.chown(path / ".claude", NOBODY, -1)  # the owner's, empty: all but the inode alike
    os.chmod(path / ".claude", 0o755)
    os.rmdir(path / ".old")
    assert remove_placeholders(records, owner_uid=NOBODY) == []
    assert (path / ".claude").is_dir() and _pooled(pool) == []
    assert stat.S_IMODE(os.lstat(path / ".claude").st_mode) == 0o755  # not even touched


def test_a_link_on_the_path_is_not_followed_into_the_pool(
    pool: Path, grant: tuple[Path, int], tmp_path: Path
) -> None:
    """The owner moves the folder holding a placeholder and links its old name to it: root
    renames nothing through the link (the placeholder, still the very inode, is not pooled)."""
    path, fd = grant
    (path / "sub").mkdir()
    os.chown(path / "sub", NOBODY, -1)
    records = _make(fd, path, ["sub/.claude"])
    os.rename(path / "sub", tmp_path / "moved")
    (path / "sub").symlink_to(tmp_path / "moved")
    remove_placeholders(records, owner_uid=NOBODY)
    assert _pooled(pool) == []
    assert (tmp_path / "moved").is_dir() and not (tmp_path / "moved").is_symlink()


def test_an_owner_s_pool_never_takes_another_owner_s_placeholder(
    pool: Path, grant: tuple[Path, int]
) -> None:
    path, fd = grant
    records = _make(fd, path, [".claude", ".vscode"])
    assert remove_placeholders(records, owner_uid=OTHER) == []  # removed as before
    assert _pooled(pool, OTHER) == [] and not (path / ".claude").exists()
    assert placeholder_pool.lend(OTHER, os.stat(path).st_dev, 2) is None


def test_an_owner_s_pool_keeps_at_most_cap_and_the_rest_are_removed(
    pool: Path, grant: tuple[Path, int]
) -> None:
    path, fd = grant
    names = _names(placeholder_pool.CAP + 5)  # past one C batch (MAX_BATCH) too
    records = _make(fd, path, names)
    assert remove_placeholders(records, owner_uid=NOBODY) == []
    assert len(_pooled(pool)) == placeholder_pool.CAP
    assert [n for n in names if (path / n).exists()] == []
    pooled = _pool_inodes(pool)
    again = _make(fd, path, names)  # the pool's CAP taken, the rest made
    assert pooled <= _inodes(again)
    assert _pooled(pool) == []
    remove_placeholders(again, owner_uid=NOBODY)


def test_two_clean_ups_at_once_never_pool_past_the_cap(pool: Path, tmp_path: Path) -> None:
    count = placeholder_pool.CAP - 8
    grants = [tmp_path / "one", tmp_path / "two"]
    records = []
    for path in grants:
        fd = _grant(path)
        records.append(_make(fd, path, _names(count)))
        os.close(fd)
    problems: list[list[str]] = []
    start = threading.Barrier(2)

    def clean(these: list[str]) -> None:
        start.wait()
        problems.append(remove_placeholders(these, owner_uid=NOBODY))

    threads = [threading.Thread(target=clean, args=(r,)) for r in records]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert problems == [[], []]
    assert len(_pooled(pool)) == placeholder_pool.CAP
    assert all(list(path.iterdir()) == [] for path in grants)
    # What the pool lists free is what is in it: the next launch takes each.
    pooled = _pool_inodes(pool)
    fd = _grant(tmp_path / "three")
    taken = _make(fd, tmp_path / "three", _names(placeholder_pool.CAP + 1))
    os.close(fd)
    assert pooled <= _inodes(taken) and _pooled(pool) == []
    remove_placeholders(taken, owner_uid=NOBODY)


def test_a_forgotten_account_s_pool_is_emptied_and_never_lent(
    pool: Path, grant: tuple[Path, int]
) -> None:
    path, fd = grant
    remove_placeholders(_make(fd, path, [".claude", ".idea"]), owner_uid=NOBODY)
    assert len(_pooled(pool)) == 2
    placeholder_pool.forget(NOBODY)
    assert not (pool / str(NOBODY)).exists()
    assert placeholder_pool.lend(NOBODY, os.stat(path).st_dev, 2) is None


def test_a_grant_on_another_mount_is_made_and_removed_as_before(
    pool: Path, grant: tuple[Path, int], tmp_path: Path
) -> None:
    """A bind mount of the same filesystem: the pool lends (same dev), the rename answers
    EXDEV, the folder is made as before and the lent names stay the pool's."""
    path, fd = grant
    remove_placeholders(_make(fd, path, [".a", ".b"]), owner_uid=NOBODY)
    before, pooled = _pooled(pool), _pool_inodes(pool)
    bound = tmp_path / "bound"
    bound.mkdir()
    subprocess.run(["mount", "--bind", str(path), str(bound)], check=True)
    try:
        bound_fd = os.open(bound, os.O_RDONLY | os.O_DIRECTORY)
        try:
            records = _make(bound_fd, bound, [".claude", ".vscode"])
        finally:
            os.close(bound_fd)
        assert _pooled(pool) == before and (bound / ".claude").is_dir()
        assert not _inodes(records) & _pool_inodes(pool)
        assert remove_placeholders(records, owner_uid=NOBODY) == []
        assert not (path / ".claude").exists() and _pooled(pool) == before
    finally:
        late_close.wait_closed()  # the removed placeholders' descriptors hold the mount
        subprocess.run(["umount", str(bound)], check=False)
        subprocess.run(["umount", "-l", str(bound)], capture_output=True, check=False)
    assert not os.path.ismount(bound)
    # and what the pool lent and got back is lent again
    assert _inodes(_make(fd, path, [".x", ".y"])) == pooled


def test_a_name_lent_to_a_folder_the_owner_may_not_write_stays_the_pool_s(
    pool: Path, grant: tuple[Path, int]
) -> None:
    path, fd = grant
    remove_placeholders(_make(fd, path, [".a", ".b", ".c"]), owner_uid=NOBODY)
    (path / "root-owned").mkdir()
    os.chown(path / "root-owned", 0, 0)  # not the owner's: no placeholder made in it at all
    making = make_batch_as_owner(
        fd,
        [(".x", None), ("root-owned/.y", None), (".z", None)],
        caller=credentials_of(NOBODY),
        owner_uid=NOBODY,
    )
    for _, opened in making.made:
        if opened is not None:
            os.close(opened.fd)
            os.close(opened.parent_fd)
    assert making.failed is None
    assert [opened is None for _, opened in making.made] == [False, False, True]
    assert os.listdir(path / "root-owned") == [] and len(_pooled(pool)) == 1
    loan = placeholder_pool.lend(NOBODY, os.stat(path).st_dev, 3)
    assert loan is not None and [os.fsdecode(n) for n in loan.names] == _pooled(pool)
    os.close(loan.fd)


def test_an_empty_folder_someone_left_in_a_pool_is_not_taken_unlisted(
    pool: Path, grant: tuple[Path, int]
) -> None:
    """Only names the pool itself put back are lent: a folder appearing in it is not."""
    path, fd = grant
    (pool / str(NOBODY)).mkdir(mode=0o700)
    (pool / str(NOBODY) / "1-1").mkdir()
    records = _make(fd, path, [".claude"])
    assert not _inodes(records) & {os.stat(pool / str(NOBODY) / "1-1").st_ino}
    remove_placeholders(records, owner_uid=NOBODY)


def test_a_folder_its_owner_filled_in_the_pool_is_not_renamed_into_a_grant(
    pool: Path, grant: tuple[Path, int], tmp_path: Path
) -> None:
    """The owner keeps a descriptor on a placeholder while it goes back to the pool, then
    fills it through the descriptor (and puts a link beside it, reached by its `..`): the
    next launch's folder is a new, empty one, the filled one stays in the pool, not lent."""
    path, fd = grant
    records = _make(fd, path, [".claude", ".idea"])
    kept = os.open(path / ".claude", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert remove_placeholders(records, owner_uid=NOBODY) == []
        filled = os.fstat(kept).st_ino
        pid = os.fork()
        if pid == 0:  # the owner, with its descriptor
            try:
                os.setgid(NOBODY_GID)
                os.setuid(NOBODY)
                os.mkdir("planted", dir_fd=kept)
                up = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=kept)
                os.symlink(str(tmp_path), "beside", dir_fd=up)
                os._exit(0)
            except BaseException:
                os._exit(1)
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        os.close(kept)
    again = _make(fd, path, [".claude", ".idea"])
    assert filled not in _inodes(again)
    assert os.listdir(path / ".claude") == [] and os.listdir(path / ".idea") == []
    assert _pool_inodes(pool) == {filled}, "the filled folder left in the pool, alone"
    assert placeholder_pool.lend(NOBODY, os.stat(path).st_dev, 2) is None
    remove_placeholders(again, owner_uid=NOBODY)


@pytest.mark.parametrize(
    "items",
    [
        pytest.param(((b"/tmp/x", 1, 2, b"a/b"),), id="pool-name-with-a-slash"),
        pytest.param(((b"/tmp/x", 1, 2, b"a\0b"),), id="pool-name-with-a-nul"),
        pytest.param(((b"/tmp/\0x", 1, 2, b"1-2"),), id="path-with-a-nul"),
        pytest.param(((b"/tmp/x", 1, 2),), id="item-too-short"),
        pytest.param([(b"/tmp/x", 1, 2, b"1-2")], id="not-a-tuple"),
        pytest.param(((b"/tmp/x", 1, 2, b"1-2"),) * 129, id="past-one-batch"),
    ],
)
def test_malformed_put_backs_are_refused_before_any_syscall(pool: Path, items: object) -> None:
    fd = os.open(pool, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises((TypeError, ValueError)):
            calls.put_back(fd, NOBODY, items)  # type: ignore[arg-type]
    finally:
        os.close(fd)


def test_a_take_stepping_out_of_the_grant_renames_nothing(
    pool: Path, grant: tuple[Path, int], tmp_path: Path
) -> None:
    path, fd = grant
    remove_placeholders(_make(fd, path, [".a"]), owner_uid=NOBODY)
    (name,) = _pooled(pool)
    pool_fd = os.open(pool / str(NOBODY), os.O_RDONLY | os.O_DIRECTORY)
    try:
        made, err, taken = calls.take(fd, pool_fd, (((b"..",), b"escaped", None, name.encode()),))
    finally:
        os.close(pool_fd)
    assert (made, err, taken) == ([], errno.EINVAL, [])
    assert not (tmp_path / "escaped").exists() and _pooled(pool) == [name]
