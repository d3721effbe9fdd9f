"""A write grant's placeholders: made as the owner would make them, sealed with FS_IMMUTABLE_FL,
recorded by the very inode, and removed only while still the one made and still empty.

Why placeholders, why empty folders, why the immutable flag, and what was tried instead:
staging.py's docstring. Which are made before the sandbox starts and which while it starts held:
placeholder_plan.py. The clean-up's removal leaves the inode's freeing to late_close.py.

What this does NOT do: make a placeholder immutable on a filesystem without FS_IMMUTABLE_FL
(there it is bound read-only by the wall and the owner can remove it); make anything in a
folder of another user's that the owner could not write (the sandbox, writing as the owner,
cannot make the name there either); protect names below the top of a write folder other than
those inside `.git`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from lnk_controller import late_close
from lnk_controller.as_caller import CallerCredentials, caller_credentials
from lnk_controller.placeholder_plan import HeldPlaceholders, parent_of, split_probes
from lnk_controller.sandbox_store import SandboxStore
from lnk_shared.errors import LaunchRefused, StateError
from lnk_shared.paths import PROJECT_RUN_DOT_ENTRIES
from lnk_shared.protected_names import PROTECTED_NAMES

__all__ = [
    "PLACEHOLDER",
    "make_held",
    "placeholder_entries",
    "remove_placeholder",
    "stage_placeholders",
]

PLACEHOLDER = "placeholder:"
SEP = "\0"  # between a placeholder record's host path and its staged path: in no path

# What a placeholder inside `.git` holds, where an empty file would change what git does: git
# reads its common folder from `commondir` (and dies on an empty one); "." is `.git` itself, as
# if the file were absent. Git never lists what is inside `.git`, so these stay unseen.
GIT_PLACEHOLDER_CONTENT = {".git/commondir": b".\n"}
# The largest content above: a regular file placeholder holding more was filled by someone.
MAX_PLACEHOLDER_BYTES = 16
# FS_IOC_SETFLAGS/GETFLAGS (the `long` ioctls of linux/fs.h) and FS_IMMUTABLE_FL: a
# placeholder nobody but root may remove, rename or fill while its sandbox runs (the kernel
# drops the sandbox's cover when the name is removed from the host's side).
FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_IMMUTABLE_FL = 0x00000010


def placeholder_content(entry: str) -> bytes | None:
    """What stands in for a missing protected entry: None for an empty folder, else a regular
    file's bytes. At the top of a write folder it is always an empty folder, whatever the tool
    expects there, because git never lists or adds an empty folder: `git status` outside and
    `git add -A` inside see nothing of the box's. Inside `.git` (which git never lists) it is
    what git reads as if the entry were absent."""
    name = next((n for n in PROTECTED_NAMES if n.path == entry), None)
    if "/" not in entry or name is None or name.kind == "folder":
        return None
    return GIT_PLACEHOLDER_CONTENT.get(entry, b"")


def _is_file_name(entry: str) -> bool:
    """True when the tools expect a file at `entry` (nothing protected below it)."""
    kinds = {
        n.kind if n.path == entry else "folder"
        for n in PROTECTED_NAMES
        if n.path.split("/")[0] == entry
    }
    return kinds == {"file"}


def _missing_entries(dir_fd: int) -> list[tuple[str, bytes | None]]:
    """(entry, placeholder content: None for a folder) for each protected entry missing at the
    top of a folder: the outermost missing part, so a missing `.git` gets one placeholder
    covering everything git reads inside it."""
    missing: dict[str, bytes | None] = {}
    for entry in PROJECT_RUN_DOT_ENTRIES:
        parts = entry.split("/")
        for depth in range(1, len(parts) + 1):
            part = "/".join(parts[:depth])
            try:
                info = os.lstat(part, dir_fd=dir_fd)
            except FileNotFoundError:
                missing[part] = None if depth < len(parts) else placeholder_content(part)
                break
            if not stat.S_ISDIR(info.st_mode):
                break  # a file (a worktree's `.git` pointer) is bound read-only as it is
    return sorted(missing.items())


def _make_placeholder(parent_fd: int, name: str, content: bytes | None) -> int:
    """Make one placeholder (an empty folder, or a file holding `content`) under `parent_fd`;
    return it open."""
    if content is None:
        os.mkdir(name, 0o555, dir_fd=parent_fd)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(name, flags, dir_fd=parent_fd)
    create = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, create, 0o444, dir_fd=parent_fd)
    try:
        os.write(fd, content)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _make_as_owner(
    dir_fd: int,
    parent: str,
    name: str,
    content: bytes | None,
    *,
    caller: CallerCredentials | None,
    owner_uid: int,
) -> tuple[int, int] | None:
    """Make one placeholder as the owner would (`caller_credentials`): (its fd, its parent's
    fd), or None where the owner may not make it and could not make itself able to, because a
    folder on the way is another user's (then the sandbox, which writes only as the owner,
    cannot make the name either, and root must not make anything in that user's folder).
    Where the folder in the way is the owner's own (a `.git` it made 0555), the sandbox could
    chmod it and make the name: root makes the placeholder, as the owner could have."""
    entry = f"{parent}/{name}" if parent else name
    made = _make_all_as_owner(dir_fd, [(entry, content)], caller=caller, owner_uid=owner_uid)
    return next(made)[1]


def _make_all_as_owner(
    dir_fd: int,
    entries: list[tuple[str, bytes | None]],
    *,
    caller: CallerCredentials | None,
    owner_uid: int,
) -> Iterator[tuple[str, tuple[int, int] | None]]:
    """`_make_as_owner` for each (entry, content), yielded as made: (entry, its fd and its
    parent's, or None). One switch to the owner's credentials for all of them (a dozen raw
    syscalls each way, against ~49 placeholders for an empty folder), then root's fallback for
    those the owner was refused. The consumer runs between two yields with this thread's file
    ids the owner's: it only records what was made."""
    refused: list[tuple[str, bytes | None]] = []
    with caller_credentials(caller) if caller is not None else contextlib.nullcontext():
        for entry, content in entries:
            parent, _, name = entry.rpartition("/")
            try:
                opened = _make_walking(dir_fd, parent, name, content)
            except PermissionError:
                if caller is None:
                    raise
                refused.append((entry, content))
                continue
            yield entry, opened
    for entry, content in refused:
        parent, _, name = entry.rpartition("/")
        owned = _folders_owned_by(dir_fd, parent, owner_uid)
        yield entry, _make_walking(dir_fd, parent, name, content) if owned else None


def _make_walking(dir_fd: int, parent: str, name: str, content: bytes | None) -> tuple[int, int]:
    """Walk from `dir_fd` down to `parent`, then make the placeholder `name` there: (its fd,
    its parent's)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    parent_fd = os.dup(dir_fd)
    for part in parent.split("/") if parent else ():  # each step O_NOFOLLOW, not only the
        try:  # last: a `.git` swapped for a link must not lead root's fallback elsewhere
            below = os.open(part, flags, dir_fd=parent_fd)
        finally:
            os.close(parent_fd)
        parent_fd = below
    try:
        return _make_placeholder(parent_fd, name, content), parent_fd
    except BaseException:
        os.close(parent_fd)
        raise


def _folders_owned_by(dir_fd: int, parent: str, uid: int) -> bool:
    """Whether every folder from the grant's top down to `parent` is `uid`'s (lstat, no link
    followed: the walk found them as folders)."""
    path = ""
    for part in ["", *(parent.split("/") if parent else [])]:
        path = f"{path}/{part}".strip("/")
        info = os.lstat(path or ".", dir_fd=dir_fd)
        if info.st_uid != uid:
            return False
    return True


def _placeholders(
    *,
    sandbox_id: str,
    store: SandboxStore,
    folder: str,
    source_fd: int,
    owner_uid: int,
    owner_gid: int,
    as_files: bool = False,
    caller: CallerCredentials | None = None,
    staged: str = "",
    entries: list[tuple[str, bytes | None]] | None = None,
) -> list[tuple[str, bool]]:
    """Make an empty stand-in for each missing dot entry tools run, in a write grant, working
    from the owner's descriptor (no path lookup for a swapped link to redirect); return their
    paths, each with whether it is sealed (see `_sealed`: then it needs no read-only bind of
    the wall's). They are recorded in one write once made (each record names the very inode,
    which exists only then), also when making one fails; only then are they made the owner's
    and immutable. Each is made as the owner (`caller`, see `_make_as_owner`): never in a
    folder of another user's that the owner could not write. `entries` (from
    `placeholder_entries`): these only, not every missing one."""
    made: list[_Made] = []
    sealed: list[tuple[str, bool]] = []
    dir_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=source_fd)
    try:
        wanted = _entries_at(dir_fd, as_files=as_files) if entries is None else entries
        entry = ""
        try:
            making = _make_all_as_owner(dir_fd, wanted, caller=caller, owner_uid=owner_uid)
            for entry, opened in making:
                if opened is None:
                    continue  # a folder of another user's the sandbox cannot write either
                made_fd, parent_fd = opened
                info = os.fstat(made_fd)
                path = os.path.join(folder, entry)
                # Also where it is through the grant's staged mount (`staged`): the folder may
                # be moved or renamed on the host while the sandbox runs, but the mount holds
                # the folder itself, so the clean-up finds the placeholder there wherever it went.
                at = f"{SEP}{staged}/{entry}" if staged else ""
                record = f"{PLACEHOLDER}{info.st_dev}:{info.st_ino}:{path}{at}"
                made.append(_Made(made_fd, parent_fd, entry.rpartition("/")[2], path, record, info))
        except OSError as exc:
            raise LaunchRefused(
                f"{folder}/{entry}", f"cannot keep it read-only: {exc.strerror}"
            ) from None
        finally:
            if made:  # recorded even when a later one failed, so clean-up removes them
                store.add_mounts(sandbox_id, [m.record for m in made])
        for m in made:
            try:
                if (m.info.st_uid, m.info.st_gid) != (owner_uid, owner_gid):
                    os.fchown(m.fd, owner_uid, owner_gid)  # root's fallback made it, or a group
                immutable = _set_immutable(m.fd, True)
            except OSError as exc:
                raise LaunchRefused(m.path, f"cannot keep it read-only: {exc.strerror}") from None
            sealed.append((m.path, immutable and _sealed(m.info, m.parent_fd, m.name)))
    finally:
        for m in made:
            os.close(m.fd)
            os.close(m.parent_fd)
        os.close(dir_fd)
    return sealed


def _entries_at(dir_fd: int, *, as_files: bool) -> list[tuple[str, bytes | None]]:
    """(entry, content) of each placeholder a write grant open at `dir_fd` needs now."""
    wanted = []
    for entry, missing in _missing_entries(dir_fd):
        # unsafe_placeholders_visible: an empty file git lists
        visible = as_files and missing is None and "/" not in entry and _is_file_name(entry)
        wanted.append((entry, b"" if visible else missing))
    return wanted


def placeholder_entries(source_fd: int, *, as_files: bool) -> list[tuple[str, bytes | None]]:
    """(entry, content: None for an empty folder) of each placeholder the write grant open at
    `source_fd` needs now, in the order they are made."""
    dir_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=source_fd)
    try:
        return _entries_at(dir_fd, as_files=as_files)
    finally:
        os.close(dir_fd)


def stage_placeholders(
    *,
    sandbox_id: str,
    store: SandboxStore,
    folder: str,
    source_fd: int,
    owner_uid: int,
    owner_gid: int,
    as_files: bool,
    caller: CallerCredentials | None,
    staged: str,
    hold: bool,
) -> tuple[list[tuple[str, bool]], HeldPlaceholders | None]:
    """A write grant's placeholders before its sandbox starts: (each path with whether it is
    sealed, the ones left for a held start or None). Without `hold`, all are made now. With it,
    the first under each folder is made now (placeholder_plan.split_probes); where it sealed,
    the rest under that folder are left to `make_held` and listed as sealed (the wall puts no
    bind over them); where it did not, they are made now too, each keeping its bind."""
    entries = placeholder_entries(source_fd, as_files=as_files)
    now, later = split_probes(entries) if hold else (entries, [])

    def make(wanted: list[tuple[str, bytes | None]]) -> list[tuple[str, bool]]:
        return _placeholders(
            sandbox_id=sandbox_id,
            store=store,
            folder=folder,
            source_fd=source_fd,
            owner_uid=owner_uid,
            owner_gid=owner_gid,
            as_files=as_files,
            caller=caller,
            staged=staged,
            entries=wanted,
        )

    made = make(now)
    sealed_under = {parent_of(os.path.relpath(path, folder)) for path, ok in made if ok}
    unsealed = [e for e in later if parent_of(e[0]) not in sealed_under]
    later = [e for e in later if parent_of(e[0]) in sealed_under]
    if unsealed:
        made += make(unsealed)
    if not later:
        return made, None
    held = HeldPlaceholders(folder, source_fd, staged, tuple(later), owner_uid, owner_gid)
    return made + [(os.path.join(folder, entry), True) for entry, _ in later], held


def make_held(
    held: tuple[HeldPlaceholders, ...],
    *,
    sandbox_id: str,
    store: SandboxStore,
    caller: CallerCredentials | None,
) -> None:
    """Make and seal the placeholders left for the held start (`Staged.held`), recorded as any
    others. Each must seal: a held start put no bind on bwrap's command line for them, so one
    that did not (its name swapped before the flag was set, or a folder below on a filesystem
    without it) refuses the launch, which is then never released."""
    for grant in held:
        made = _placeholders(
            sandbox_id=sandbox_id,
            store=store,
            folder=grant.folder,
            source_fd=grant.source_fd,
            owner_uid=grant.owner_uid,
            owner_gid=grant.owner_gid,
            caller=caller,
            staged=grant.staged,
            entries=list(grant.entries),
        )
        for path, sealed in made:
            if not sealed:
                raise LaunchRefused(
                    path,
                    "its placeholder could not be made immutable as the sandbox started (the "
                    "name changed while it was made, or the folder holding it is on another "
                    "filesystem): nothing ran; run it again, and if it recurs, make that folder "
                    "a plain folder of the grant's own filesystem",
                )


@dataclass(frozen=True)
class _Made:
    """A placeholder made and open: its fd, its parent's, its name there, its path, its
    record, and its fstat when made."""

    fd: int
    parent_fd: int
    name: str
    path: str
    record: str
    info: os.stat_result


def _sealed(made: os.stat_result, parent_fd: int, name: str) -> bool:
    """Whether `name` under `parent_fd` is still the immutable placeholder `made` (its fstat
    when made). Then nobody without CAP_LINUX_IMMUTABLE (no sandbox) can remove, rename,
    replace, fill or chmod it, or make anything inside it, so the wall needs no read-only bind
    over it: one mount fewer per name (and one fewer mount-table parse in bwrap). Checked after
    the flag is set: a name swapped before that is not our inode and keeps its bind."""
    try:
        there = os.lstat(name, dir_fd=parent_fd)
    except OSError:
        return False
    return (there.st_dev, there.st_ino) == (made.st_dev, made.st_ino)


def _set_immutable(fd: int, on: bool) -> bool:
    """Set or clear FS_IMMUTABLE_FL on an open placeholder; whether it now is as asked. A
    filesystem without the flag (ENOTTY, EOPNOTSUPP, EINVAL) leaves the placeholder removable
    by its owner, which only uncovers the name for the owner's own writes (the wall's bind
    over it then stands in the sandbox's way); nothing else is given up."""
    try:
        buf = bytearray(struct.pack("l", 0))
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf)
        (flags,) = struct.unpack("l", buf)
        wanted = flags | FS_IMMUTABLE_FL if on else flags & ~FS_IMMUTABLE_FL
        if wanted != flags:
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("l", wanted))
    except OSError as exc:
        if exc.errno not in (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL):
            raise
        return False
    return True


def _holds_only_placeholder(fd: int, info: os.stat_result) -> bool:
    if stat.S_ISDIR(info.st_mode):
        return True  # rmdir itself refuses a folder someone filled
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_PLACEHOLDER_BYTES:
        return False
    return os.pread(fd, MAX_PLACEHOLDER_BYTES + 1, 0) in (b"", *GIT_PLACEHOLDER_CONTENT.values())


def remove_placeholder(record: str) -> None:
    """Remove a placeholder if it is still the one made here (same inode) and still holds only
    what was put there; one that someone filled meanwhile is theirs now and stays. It is looked
    for first through the grant's staged mount (still mounted: placeholders go first), which
    holds the folder wherever it was moved on the host meanwhile, then at its host path (a
    record without a staged path, or a clean-up run again after the unmount)."""
    dev, ino, paths = record[len(PLACEHOLDER) :].split(":", 2)
    path, _, staged = paths.partition(SEP)
    if staged and _remove_if_ours(staged, int(dev), int(ino)):
        return
    _remove_if_ours(path, int(dev), int(ino))


def _remove_if_ours(path: str, dev: int, ino: int) -> bool:
    """Remove the placeholder at `path` if it is inode (dev, ino) and holds only what was put
    there; whether `path` was that inode (removed, or kept as filled by someone)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        info = os.lstat(path)
        if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
            return False
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise StateError(f"cannot remove placeholder {path}: {exc.strerror}") from exc
    removed = False
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (dev, ino):
            return False
        if not _holds_only_placeholder(fd, info):
            return True
        _set_immutable(fd, False)
        if stat.S_ISDIR(info.st_mode):
            os.rmdir(path)
        else:
            os.unlink(path)
        removed = True
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY):
            raise StateError(f"cannot remove placeholder {path}: {exc.strerror}") from exc
    finally:
        if removed:  # the name is gone; the inode's freeing (a discard's wait) comes later
            late_close.close_later(fd)
        else:
            os.close(fd)
    return True
