"""The placeholders' pool: empty folders of each owner's, renamed into a write grant as its
placeholders and back at its clean-up, so a launch allocates and frees no inode for them.

Why: a write grant makes and frees ~49 empty folders a launch. On ext4 without a journal (this
host's root) each new inode is searched for past every inode freed in its group in the last
30 s, and on a disk mounted `discard` each freed folder's block waits for the device, so a busy
box's launches slow each other down (bench/README, session 14). A rename does neither.

Where: `<state dir>/placeholder-pool/<uid>/`, the pool's top root's and mode 0700 (no one else
enters it, no sandbox has it mounted), each owner's folder that owner's and 0700 (take renames
as the owner, under the owner's file ids, so the kernel checks the owner may write where the
placeholder lands, as for a mkdir). A pool is used only for a grant on the same filesystem;
where its mount differs the rename answers EXDEV and the placeholder is made as before. An
owner's pool holds only that owner's placeholders, each put back only once checked to be the
very inode made and empty (ext/placeholder_pool.c), so nothing of one user's ever reaches
another's folder; at most `CAP` a owner, the rest removed as before.

The pool's contents are known only in memory: at the controller's start the pool is emptied
(every empty folder in it removed; anything else is left and logged, nothing is lost), so a
killed controller's pool is never trusted, and what a clean-up left unpooled is removed from
its record as before.

An owner who kept a descriptor on a placeholder reaches its folder in the pool (and, by its
`..`, the owner's pool folder itself: the owner's own, mode 0700) and can fill it or put
entries beside it: all the owner's, reached with the owner's own rights. A take checks the
folder it renamed in is empty (one filled goes back, its name no more lent, and a folder is
made), a put_back renames with RENAME_NOREPLACE, and the start's sweep leaves what is not an
empty folder, logged; nothing of the pool is ever another user's or root's.

What this does NOT do: pool a placeholder that is a file (those inside `.git`), one reached only
through its staged mount (the folder moved on the host meanwhile), or one on a filesystem other
than the state dir's (a `/home` of its own: made and freed as before); free the pool's folders
while the controller runs (at most CAP an owner stay, a few KiB each).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

from lnk_controller import _placeholder_pool as calls
from lnk_shared.errors import StateError

__all__ = [
    "CAP",
    "Loan",
    "configure",
    "forget",
    "give_back",
    "lend",
    "pool_name",
    "put_back",
    "unconfigure",
]

CAP = 128  # an owner's pool: two write grants' placeholders, at ~49 each, and more
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loan:
    """Pool names lent to one making (`lend`), with the owner's pool open as `fd`."""

    uid: int
    fd: int
    names: tuple[bytes, ...]


@dataclass
class _Pool:
    root_fd: int
    dev: int
    free: dict[int, list[bytes]]
    going_back: dict[int, int] = field(default_factory=dict)  # room held by puts under way


_pool: _Pool | None = None
_guard = threading.Lock()


def pool_name(dev: int, ino: int) -> bytes:
    """The name a placeholder has in its owner's pool: its inode's, so two never collide."""
    return f"{dev}-{ino}".encode()


def configure(root: Path) -> None:
    """Use `root` as the pool's top (made root's and 0700 if missing), emptied of what a
    previous controller left. A root that is not a folder of root's refuses the start."""
    global _pool
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise StateError(f"cannot use {root} for the placeholders' pool: {exc.strerror}") from exc
    info = os.fstat(fd)
    if info.st_uid != 0 or stat.S_IMODE(info.st_mode) & 0o077:
        os.close(fd)
        raise StateError(
            f"{root} is the placeholders' pool and must be root's, mode 0700: "
            f"fix it with `chown root: {root} && chmod 0700 {root}`"
        )
    _sweep(fd, root)
    with _guard:
        old, _pool = _pool, _Pool(fd, info.st_dev, {})
    if old is not None:
        os.close(old.root_fd)


def unconfigure() -> None:
    """No pool from now on (the tests' reset); what is in it stays for the next sweep."""
    global _pool
    with _guard:
        old, _pool = _pool, None
    if old is not None:
        os.close(old.root_fd)


def _sweep(root_fd: int, root: Path) -> None:
    """Remove every empty folder in every owner's pool; leave and log anything else."""
    for owner in os.listdir(root_fd):
        try:
            fd = os.open(owner, _DIR_FLAGS, dir_fd=root_fd)
        except OSError:
            log.warning("placeholder pool: %s/%s is not a folder; left as it is", root, owner)
            continue
        try:
            _remove_empty(fd, f"{root}/{owner}")
        finally:
            os.close(fd)


def _remove_empty(fd: int, shown: str) -> None:
    """Remove every empty folder in the open folder `fd`; leave and log anything else."""
    for name in os.listdir(fd):
        try:
            os.rmdir(name, dir_fd=fd)
        except OSError as exc:
            log.warning("placeholder pool: %s/%s left (%s)", shown, name, exc.strerror)


def forget(uid: int) -> None:
    """Drop an old account's pool (its uid now another person's: forget_account.py): its empty
    folders removed, anything else left and logged, its part of the pool gone if empty. Its
    placeholders were never anyone else's to take; this keeps the new account from being lent
    the old one's folders, and the pool from keeping them."""
    with _guard:
        pool = _pool
        if pool is not None:
            pool.free.pop(uid, None)
    if pool is None:
        return
    name = str(uid)
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=pool.root_fd)
    except FileNotFoundError:
        return
    try:
        _remove_empty(fd, name)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=pool.root_fd)


def _owner_fd(pool: _Pool, uid: int) -> int:
    """The owner's pool open, made the owner's and 0700 if missing."""
    name = str(uid)
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=pool.root_fd)
    except FileNotFoundError:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=pool.root_fd)
        fd = os.open(name, _DIR_FLAGS, dir_fd=pool.root_fd)
    info = os.fstat(fd)
    if info.st_uid != uid or stat.S_IMODE(info.st_mode) != 0o700:
        os.fchown(fd, uid, -1)
        os.fchmod(fd, 0o700)
    return fd


def lend(uid: int, dev: int, count: int) -> Loan | None:
    """Up to `count` of the owner's pooled folders for a making on filesystem `dev`, with the
    owner's pool open; None when there is no pool, it is on another filesystem, or it holds
    none. Every name must come back through `give_back` unless `take` consumed it."""
    with _guard:
        pool = _pool
        if pool is None or pool.dev != dev or count <= 0:
            return None
        free = pool.free.get(uid, [])
        names, pool.free[uid] = tuple(free[-count:]), free[:-count]
    if not names:
        return None
    try:
        fd = _owner_fd(pool, uid)
    except OSError:
        give_back(uid, names)
        return None
    return Loan(uid, fd, names)


def give_back(uid: int, names: tuple[bytes, ...] | list[bytes]) -> None:
    """Names lent and not taken, or put back, listed free again (up to CAP)."""
    with _guard:
        if _pool is not None:
            free = _pool.free.setdefault(uid, [])
            free += list(names)[: max(0, CAP - len(free))]


def put_back(uid: int, items: list[tuple[bytes, int, int]]) -> list[tuple[int, int]]:
    """Rename each (host path, dev, ino) of an owner's folder placeholders into the owner's
    pool, as far as the pool has room: one (status, errno) of ext/placeholder_pool.c's per item
    (NOT_POOLED for those past the room, or with no pool: the caller removes them as before)."""
    with _guard:  # the room is held while the renames run: two clean-ups never pass CAP
        pool = _pool
        if pool is None:
            return [(calls.NOT_POOLED, 0)] * len(items)
        held = pool.going_back.get(uid, 0)
        room = max(0, CAP - len(pool.free.get(uid, [])) - held)
        tried = [it for it in items if it[1] == pool.dev][:room]
        pool.going_back[uid] = held + len(tried)
    results: dict[tuple[bytes, int, int], tuple[int, int]] = {}
    try:
        if tried:
            fd = _owner_fd(pool, uid)
            try:
                for at in range(0, len(tried), calls.MAX_BATCH):
                    batch = tried[at : at + calls.MAX_BATCH]
                    wire = tuple((path, dev, ino, pool_name(dev, ino)) for path, dev, ino in batch)
                    results.update(zip(batch, calls.put_back(fd, uid, wire), strict=True))
            finally:
                os.close(fd)
    except OSError:
        pass  # the owner's pool cannot be opened: every one is removed as before
    finally:
        pooled = [pool_name(d, i) for (_, d, i), r in results.items() if r[0] == calls.POOLED]
        with _guard:
            pool.going_back[uid] -= len(tried)
            if pool is _pool:
                pool.free.setdefault(uid, []).extend(pooled)
    return [results.get(it, (calls.NOT_POOLED, 0)) for it in items]
