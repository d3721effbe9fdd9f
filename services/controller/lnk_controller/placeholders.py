"""A write grant's placeholders: made as the owner would make them, sealed with FS_IMMUTABLE_FL,
recorded by the very inode, and removed only while still the one made and still empty.

Why placeholders, why empty folders, why the immutable flag, and what was tried instead:
staging.py's docstring. Which are made before the sandbox starts and which while it starts held:
placeholder_plan.py. The syscalls that make and seal them: placeholder_make.py. The clean-up puts
an empty folder's back into its owner's pool (placeholder_pool.py), and its removal of the rest
leaves the inode's freeing to late_close.py.

A held start's placeholders are made on a worker thread (`_MAKERS`): the probes and their lookups
from staging's first step (`begin_staging`, waited for where the wall's binds need their answer),
the rest from the moment their folder's probe sealed, while the staging, the fresh user, the plan
and bwrap's start go on.
The program is released only once `make_held` has their result (each made, recorded, sealed and
checked); a clean-up first waits for any making of its sandbox still under way (`settle`), so it
reads the record only once every placeholder made is in it. Each worker has its own descriptor of
the grant, so the launch's closing the owner's descriptor never leaves a worker a number reused
by another file.

What this does NOT do: make a placeholder immutable on a filesystem without FS_IMMUTABLE_FL
(there it is bound read-only by the wall and the owner can remove it); make anything in a
folder of another user's that the owner could not write (the sandbox, writing as the owner,
cannot make the name there either); protect names below the top of a write folder other than
those inside `.git`; record a placeholder made just before the controller is killed and not
yet written to the record (its `mkdir` and its record are two steps).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any, TypeVar

from lnk_controller import _placeholder_calls as calls
from lnk_controller import _placeholder_pool as pool_calls
from lnk_controller import late_close, placeholder_pool
from lnk_controller.as_caller import CallerCredentials
from lnk_controller.placeholder_make import (
    Making,
    Opened,
    make_batch_as_owner,
    seal_all,
)
from lnk_controller.placeholder_plan import HeldPlaceholders, WriteGrant, parent_of, split_probes
from lnk_controller.sandbox_store import SandboxStore
from lnk_shared.errors import LaunchRefused, StateError
from lnk_shared.paths import PROJECT_RUN_DOT_ENTRIES
from lnk_shared.protected_names import PROTECTED_NAMES

__all__ = [
    "PLACEHOLDER",
    "begin_staging",
    "make_held",
    "placeholder_entries",
    "remove_placeholder",
    "remove_placeholders",
    "settle",
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
Made = list[tuple[str, bool]]  # each placeholder's path, with whether it sealed
# The held starts' making (a worker a launch under way; a placeholder is a few syscalls) and
# what is still being made for each sandbox, for its clean-up to wait on (`settle`).
_MAKERS = futures.ThreadPoolExecutor(4, thread_name_prefix="lnk-placeholders")
_making: dict[str, list[futures.Future[Any]]] = {}
_T = TypeVar("_T")
_making_guard = threading.Lock()


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


def _placeholders(
    sandbox_id: str,
    store: SandboxStore,
    grant: WriteGrant,
    *,
    entries: list[tuple[str, bytes | None]] | None = None,
    as_files: bool = False,
    caller: CallerCredentials | None = None,
) -> Made:
    """Make an empty stand-in for each missing dot entry tools run, in a write grant, working
    from the owner's descriptor (no path lookup for a swapped link to redirect); return their
    paths, each with whether it is sealed (see `_sealed`: then it needs no read-only bind of
    the wall's). They are recorded in one write once made (each record names the very inode,
    which exists only then), also when making one fails; only then are they made the owner's
    and immutable. Each is made as the owner (`caller`, placeholder_make.make_as_owner): never
    in a folder of another user's that the owner could not write. `entries` (from
    `placeholder_entries`): these only, not every missing one."""
    made: list[_Made] = []
    dir_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=grant.source_fd)
    try:
        wanted = _entries_at(dir_fd, as_files=as_files) if entries is None else entries
        making = Making()
        try:
            making = make_batch_as_owner(dir_fd, wanted, caller=caller, owner_uid=grant.owner_uid)
            for entry, opened in making.made:
                if opened is None:
                    continue  # a folder of another user's the sandbox cannot write either
                path = os.path.join(grant.folder, entry)
                # Also where it is through the grant's staged mount (`staged`): the folder may
                # be moved or renamed on the host while the sandbox runs, but the mount holds
                # the folder itself, so the clean-up finds the placeholder there wherever it went.
                at = f"{SEP}{grant.staged}/{entry}" if grant.staged else ""
                record = f"{PLACEHOLDER}{opened.dev}:{opened.ino}:{path}{at}"
                made.append(_Made(opened, os.fsencode(entry.rpartition("/")[2]), path, record))
        finally:
            if made:  # recorded even when a later one failed, so clean-up removes them
                store.add_mounts(sandbox_id, [m.record for m in made])
            recorded = {m.opened.fd for m in made}
            for _, opened in making.made:
                if opened is not None and opened.fd not in recorded:  # a record not built
                    os.close(opened.fd)
                    os.close(opened.parent_fd)
        if making.failed is not None:
            entry, exc = making.failed
            raise LaunchRefused(
                f"{grant.folder}/{entry}", f"cannot keep it read-only: {exc.strerror}"
            )
        sealed, failed = seal_all(
            [(m.opened, m.name) for m in made], grant.owner_uid, grant.owner_gid
        )
        if failed is not None:
            path = made[len(sealed)].path
            raise LaunchRefused(path, f"cannot keep it read-only: {failed.strerror}")
    finally:
        for m in made:
            os.close(m.opened.fd)
            os.close(m.opened.parent_fd)
        os.close(dir_fd)
    return [(m.path, ok) for m, ok in zip(made, sealed, strict=True)]


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
    grant: WriteGrant,
    as_files: bool,
    caller: CallerCredentials | None,
    hold: bool,
) -> tuple[Made, HeldPlaceholders | None]:
    """A write grant's placeholders before its sandbox starts: (each path with whether it is
    sealed, the ones left for a held start or None). Without `hold`, all are made now. With it,
    the first under each folder is made now (placeholder_plan.split_probes); where it sealed,
    the rest under that folder are begun on a worker (`make_held` waits for them) and listed as
    sealed (the wall puts no bind over them); where it did not, they are made now too, each
    keeping its bind."""
    entries = placeholder_entries(grant.source_fd, as_files=as_files)
    now, later = split_probes(entries) if hold else (entries, [])
    made = _placeholders(sandbox_id, store, grant, entries=now, as_files=as_files, caller=caller)
    sealed_under = {parent_of(os.path.relpath(path, grant.folder)) for path, ok in made if ok}
    unsealed = [e for e in later if parent_of(e[0]) not in sealed_under]
    later = [e for e in later if parent_of(e[0]) in sealed_under]
    if unsealed:
        made += _placeholders(
            sandbox_id, store, grant, entries=unsealed, as_files=as_files, caller=caller
        )
    if not later:
        return made, None
    held = HeldPlaceholders(grant, tuple(later), _begin(sandbox_id, store, grant, later, caller))
    return made + [(os.path.join(grant.folder, entry), True) for entry, _ in later], held


def begin_staging(
    *,
    sandbox_id: str,
    store: SandboxStore,
    grant: WriteGrant,
    as_files: bool,
    caller: CallerCredentials | None,
) -> futures.Future[tuple[Made, HeldPlaceholders | None]]:
    """`stage_placeholders(hold=True)` begun on a worker, from a descriptor of the grant's own:
    the lookups of the missing names, the probes (made, recorded, sealed, checked) and any
    placeholder of a folder that did not seal are made while the caller stages the rest; the
    caller waits for this before anything depends on them (the wall's binds, bwrap's command
    line). Listed for the sandbox's clean-up to wait on (`settle`), as the held making it
    begins is."""
    return _on_worker(
        sandbox_id,
        grant,
        lambda mine: stage_placeholders(
            sandbox_id=sandbox_id,
            store=store,
            grant=mine,
            as_files=as_files,
            caller=caller,
            hold=True,
        ),
    )


def _begin(
    sandbox_id: str,
    store: SandboxStore,
    grant: WriteGrant,
    entries: list[tuple[str, bytes | None]],
    caller: CallerCredentials | None,
) -> futures.Future[Made]:
    """Begin making `entries` on a worker; the making is listed for the sandbox's clean-up to
    wait on (`settle`)."""
    return _on_worker(
        sandbox_id,
        grant,
        lambda mine: _placeholders(sandbox_id, store, mine, entries=entries, caller=caller),
    )


def _on_worker(
    sandbox_id: str, grant: WriteGrant, work: Callable[[WriteGrant], _T]
) -> futures.Future[_T]:
    """`work` run on a worker with the grant as a descriptor of its own (closed when done: the
    launch's closing its descriptor never leaves the worker a number reused by another file),
    listed for the sandbox's clean-up to wait on (`settle`)."""
    own = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=grant.source_fd)

    def run() -> _T:
        try:
            mine = WriteGrant(grant.folder, own, grant.staged, grant.owner_uid, grant.owner_gid)
            return work(mine)
        finally:
            os.close(own)

    with _making_guard:
        try:
            future = _MAKERS.submit(run)
        except BaseException:
            os.close(own)
            raise
        _making.setdefault(sandbox_id, []).append(future)
    return future


def settle(sandbox_id: str) -> None:
    """Wait for any making of the sandbox's placeholders still under way (its launch failed
    before `make_held`): once this returns, every placeholder made for it is in its record."""
    while True:  # a staging's making (`begin_staging`) lists the held making it begins
        with _making_guard:
            pending = _making.pop(sandbox_id, [])
        if not pending:
            return
        futures.wait(pending)


def make_held(
    held: tuple[HeldPlaceholders, ...],
    *,
    sandbox_id: str,
    store: SandboxStore,
    caller: CallerCredentials | None,
) -> None:
    """The placeholders left for the held start (`Staged.held`), made and sealed, recorded as
    any others: their making begun at staging, waited for, or made here. Each must seal: a held
    start put no bind on bwrap's command line for them, so one that did not (its name swapped
    before the flag was set, or a folder below on a filesystem without it) refuses the launch,
    which is then never released."""
    for grant in held:
        if grant.making is not None:
            made = grant.making.result()  # its LaunchRefused, if making one failed
        else:
            entries = list(grant.entries)
            made = _placeholders(sandbox_id, store, grant.grant, entries=entries, caller=caller)
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
    """A placeholder made and open (its fds, inode and ids when made), its name under its
    parent, its path and its record."""

    opened: Opened
    name: bytes
    path: str
    record: str


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


def remove_placeholder(record: str) -> None:
    """`remove_placeholders` of one record; its problem raised as StateError."""
    problems = remove_placeholders([record])
    if problems:
        raise StateError(problems[0])


def remove_placeholders(records: list[str], *, owner_uid: int | None = None) -> list[str]:
    """Remove each placeholder if it is still the one made here (same inode) and still holds
    only what was put there; one that someone filled meanwhile is theirs now and stays. With
    `owner_uid`, the owner's folder placeholders still at their host path go back into the
    owner's pool first (placeholder_pool.put_back: checked the same way, no link on the path);
    the rest are removed. Each is looked for first through the grant's staged mount (still
    mounted: placeholders go first), which holds the folder wherever it was moved on the host
    meanwhile, then at its host path (a record without a staged path, or a clean-up run again
    after the unmount). The syscalls are placeholder_calls.c's `remove`, the whole batch with
    the GIL released; every record is tried. What could not be removed, one line each."""
    items = []
    for record in records:
        dev, ino, paths = record[len(PLACEHOLDER) :].split(":", 2)
        path, _, staged = paths.partition(SEP)
        items.append(
            (os.fsencode(staged) if staged else None, os.fsencode(path), int(dev), int(ino))
        )
    problems = []
    if owner_uid is not None and items:
        pooled = placeholder_pool.put_back(owner_uid, [(p, d, i) for _, p, d, i in items])
        left = []
        for item, (status, err) in zip(items, pooled, strict=True):
            if status == pool_calls.NOT_POOLED:
                left.append(item)
            elif status == pool_calls.ERROR:
                problems.append(
                    f"placeholder {os.fsdecode(item[1])} was swapped or filled as it went back "
                    f"to the pool and could not be returned: it is in the pool, kept "
                    f"({os.strerror(err)})"
                )
        items = left
    contents = (b"", *GIT_PLACEHOLDER_CONTENT.values())
    for at in range(0, len(items), calls.MAX_BATCH):
        batch = tuple(items[at : at + calls.MAX_BATCH])
        for item, (status, value, which) in zip(batch, calls.remove(batch, contents), strict=True):
            if status == calls.REMOVED:  # the name is gone; the inode's freeing comes later
                late_close.close_later(value)
            elif status == calls.ERROR:
                path = os.fsdecode(item[1] if which else item[0] or b"")
                problems.append(f"cannot remove placeholder {path}: {os.strerror(value)}")
    return problems
