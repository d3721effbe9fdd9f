"""Staging a sandbox's folders: idmapped clones of the granted folders, placeholders for the
dot entries tools run outside, and noexec tmpfs for /tmp, /dev/shm and the home.

Everything made here is recorded in the sandbox's row *before* it is made, so cleanup (or a
reconcile after a crash) can undo it: staged mounts by their target path, placeholders as
`placeholder:<dev>:<ino>:<path>` so only the very file or folder made here is ever removed,
and only while it is still empty.

The owner proves what they can reach: each folder is staged from a descriptor the client opened
as the owner, after checking it is the same file the controller's own resolution found.

What this does NOT do: hide sockets or links deep inside a granted folder (seccomp blocks unix
sockets; links resolve inside the sandbox's own view), or keep a placeholder from being seen by
the owner's own programs while the sandbox runs (an empty `.envrc` or `.git` is harmless).
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from lnk_controller import idmap_mounts
from lnk_controller.host_users import HostUser
from lnk_controller.launch_request import LaunchRequest
from lnk_controller.sandbox_store import SandboxStore
from lnk_controller.wall import Bind
from lnk_shared.errors import LaunchRefused, StateError
from lnk_shared.paths import PROJECT_RUN_DOT_ENTRIES
from lnk_shared.refusals import inside

__all__ = [
    "PLACEHOLDER",
    "TMPFS_NAMES",
    "Staged",
    "hidden_mount_points",
    "remove_placeholder",
    "stage_sandbox",
    "wanted_paths",
]

PLACEHOLDER = "placeholder:"
# The sandbox's /tmp, /dev/shm and home: tmpfs in its staging folder, recorded in its record
# when it is written (SandboxStore.create(staged=...)), so staging needs no write for them.
TMPFS_NAMES = ("tmp", "shm", "home")
SYSTEM_PROGRAM_DIRS = ("/usr",)  # bound read-only in every sandbox: no extra bind needed
# Dot entries that are folders (a placeholder for them is an empty folder, not a file).
DOT_FOLDERS = frozenset(
    {".git", ".git/hooks", ".direnv", ".github", ".husky", ".idea", ".devcontainer", ".vscode"}
)


@dataclass(frozen=True)
class Staged:
    binds: tuple[Bind, ...]
    read_only: tuple[Bind, ...]
    tmp: str
    shm: str
    home: str
    usr: str | None = None  # the noexec clone of /usr bwrap binds from, if one was made


def wanted_paths(
    grants_read: list[str],
    grants_write: list[str],
    fd_grants: list[tuple[str, bool]],
    execute: tuple[str, ...],
    *,
    programs_apart: bool,
) -> list[str]:
    """The real paths the owner must pass open for this sandbox (those not passed as fds)."""
    passed = {p for p, _ in fd_grants}
    wanted = _wanted(grants_read, grants_write, [], execute, programs_apart=programs_apart)
    return [p for p, _, _ in wanted if p not in passed]


def _wanted(
    grants_read: list[str],
    grants_write: list[str],
    fd_grants: list[tuple[str, bool]],
    execute: tuple[str, ...],
    *,
    programs_apart: bool,
) -> list[tuple[str, bool, bool]]:
    """(real path, write, is a program) for every bind the sandbox needs. With
    `programs_apart` (a finite list), a granted program inside a grant gets a bind of its own:
    the grant is noexec, so the loader maps nothing else of it (`exec_mounts.py`)."""
    wanted = [(p, False, False) for p in grants_read] + [(p, True, False) for p in grants_write]
    wanted += [(p, w, False) for p, w in fd_grants]
    granted = [w[0] for w in wanted]
    for program in execute:
        if program == "/" or any(inside(program, d) for d in SYSTEM_PROGRAM_DIRS):
            continue
        if program in granted:
            continue  # the grant is that very file: it is staged exec-capable itself
        if programs_apart or not any(inside(program, g) for g in granted):
            wanted.append((program, False, True))
    return wanted


def _owner_fd(real: str, request: LaunchRequest, fds: list[int], by_fd: dict[str, int]) -> int:
    source_fd = by_fd.get(real)
    if source_fd is None:
        index = request.grant_fds.get(real)
        if index is None:
            raise LaunchRefused(
                real, "the client did not pass it open: cannot check you may reach it"
            )
        source_fd = fds[index]
    mine, theirs = os.stat(real), os.fstat(source_fd)
    if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
        raise LaunchRefused(real, "it changed while the sandbox was being made")
    return source_fd


def _missing_entries(dir_fd: int) -> list[tuple[str, bool]]:
    """(entry, is a folder) for each dot entry tools run that is missing at the top of a folder:
    the outermost missing part, so a missing `.git` gets one placeholder covering hooks and
    config."""
    missing: dict[str, bool] = {}
    for entry in PROJECT_RUN_DOT_ENTRIES:
        parts = entry.split("/")
        for depth in range(1, len(parts) + 1):
            part = "/".join(parts[:depth])
            try:
                info = os.lstat(part, dir_fd=dir_fd)
            except FileNotFoundError:
                missing[part] = depth < len(parts) or part in DOT_FOLDERS
                break
            if not stat.S_ISDIR(info.st_mode):
                break  # a file (a worktree's `.git` pointer) is bound read-only as it is
    return sorted(missing.items())


def _placeholders(
    *,
    sandbox_id: str,
    store: SandboxStore,
    folder: str,
    source_fd: int,
    owner_uid: int,
    owner_gid: int,
) -> list[str]:
    """Make an empty stand-in for each missing dot entry tools run, in a write grant, working
    from the owner's descriptor (no path lookup for a swapped link to redirect); return their
    paths, which the wall binds read-only."""
    made: list[str] = []
    dir_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=source_fd)
    try:
        for entry, is_folder in _missing_entries(dir_fd):
            parent, _, name = entry.rpartition("/")
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            parent_fd = os.open(parent, flags, dir_fd=dir_fd) if parent else os.dup(dir_fd)
            try:
                if is_folder:
                    os.mkdir(name, 0o555, dir_fd=parent_fd)
                else:
                    create = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                    os.close(os.open(name, create, 0o444, dir_fd=parent_fd))
                info = os.lstat(name, dir_fd=parent_fd)
                path = os.path.join(folder, entry)
                store.add_mount(sandbox_id, f"{PLACEHOLDER}{info.st_dev}:{info.st_ino}:{path}")
                os.chown(name, owner_uid, owner_gid, dir_fd=parent_fd, follow_symlinks=False)
                made.append(path)
            except OSError as exc:
                raise LaunchRefused(
                    f"{folder}/{entry}", f"cannot keep it read-only: {exc.strerror}"
                ) from None
            finally:
                os.close(parent_fd)
    finally:
        os.close(dir_fd)
    return made


def remove_placeholder(record: str) -> None:
    """Remove a placeholder if it is still the one made here (same inode) and still empty; one
    that someone filled meanwhile is theirs now and stays."""
    dev, ino, path = record[len(PLACEHOLDER) :].split(":", 2)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if (info.st_dev, info.st_ino) != (int(dev), int(ino)):
        return
    try:
        if stat.S_ISDIR(info.st_mode):
            os.rmdir(path)
        elif stat.S_ISREG(info.st_mode) and info.st_size == 0:
            os.unlink(path)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY):
            raise StateError(f"cannot remove placeholder {path}: {exc.strerror}") from exc


def _inside_binds(
    binds: list[Bind], read_only_inside: tuple[str, ...], placeholders: frozenset[str]
) -> list[Bind]:
    """Binds over the dot entries of each write grant: `.git` pinned to itself (a mount point
    cannot be renamed away, so no new `.git` with hooks can take its place), then every dot entry
    tools run bound read-only over itself. A link in such a place is refused: the sandbox could
    rewrite whatever it points to."""
    pins: list[Bind] = []
    ro: list[Bind] = []
    for bind in binds:
        if not bind.write:
            continue
        git = os.path.join(bind.dest, ".git")
        with contextlib.suppress(FileNotFoundError):
            if git not in placeholders and stat.S_ISDIR(os.lstat(git).st_mode):
                pins.append(Bind(os.path.join(bind.source, ".git"), git, True))
        for path in sorted(set(read_only_inside) | placeholders | {git}):
            if not inside(path, bind.dest) or path == bind.dest:
                continue
            if path == git and any(p.dest == git for p in pins):
                continue  # a real .git folder: pinned above, its hooks and config read-only
            try:
                info = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISLNK(info.st_mode):
                raise LaunchRefused(
                    path,
                    "a link where tools run code: the sandbox could rewrite where it "
                    "points; replace the link with the file itself",
                )
            ro.append(Bind(os.path.join(bind.source, os.path.relpath(path, bind.dest)), path))
    return pins + ro


def hidden_mount_points(
    hidden: tuple[str, ...], *, home: str, owner_uid: int, owner_gid: int
) -> tuple[str, ...]:
    """The protected folders to cover inside grants, each made to exist first: a missing one
    under the owner's home (~/.lnk, ~/Link/History) is created empty, 0700 and the owner's,
    walking from the home without following links, because bwrap cannot make a mount point in
    a read-only grant and an uncovered name could appear there later. One elsewhere that does
    not exist is left out: nothing can appear there through a read-only grant."""
    out = []
    for path in hidden:
        if os.path.lexists(path):
            out.append(path)
            continue
        if not inside(path, home) or path == home:
            continue
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for part in os.path.relpath(path, home).split("/"):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
                    os.chown(part, owner_uid, owner_gid, dir_fd=fd, follow_symlinks=False)
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                next_fd = os.open(part, flags, dir_fd=fd)
                os.close(fd)
                fd = next_fd
            out.append(path)
        except OSError as exc:
            raise LaunchRefused(path, f"cannot be kept hidden: {exc.strerror}") from None
        finally:
            os.close(fd)
    return tuple(out)


def stage_sandbox(
    *,
    sandbox_id: str,
    staging: Path,
    store: SandboxStore,
    user: HostUser,
    owner_uid: int,
    request: LaunchRequest,
    fds: list[int],
    grants_read: list[str],
    grants_write: list[str],
    fd_grants: list[tuple[str, bool]],
    read_only_inside: tuple[str, ...],
    execute: tuple[str, ...],
    exec_anywhere: bool,
    programs_apart: bool,
    exec_over: tuple[str, ...] = (),
    tmp_size: int,
) -> Staged:
    """Stage everything of the sandbox's. `programs_apart` (a finite list, the loader gap
    closed): read grants noexec, each granted program in one bound on its own, and a noexec
    clone of /usr to bind, with `exec_over` exec-capable in it (`exec_mounts.py`)."""
    owner = pwd.getpwuid(owner_uid)
    by_fd = {os.readlink(f"/proc/self/fd/{fds[i]}"): fds[i] for i in request.with_fds.values()}
    binds: list[Bind] = []
    placeholders: list[str] = []
    userns_fd = idmap_mounts.make_userns_fd(
        ((owner_uid, user.uid, 1),), ((owner.pw_gid, user.gid, 1),)
    )
    try:
        wanted = _wanted(
            grants_read, grants_write, fd_grants, execute, programs_apart=programs_apart
        )
        targets = [staging / f"g{n}" for n in range(len(wanted))]
        usr = staging / "usr" if programs_apart else None
        records = [str(target) for target in targets] + ([str(usr)] if usr else [])
        if records:  # one write for all of them, before any is made
            store.add_mounts(sandbox_id, records)
        if usr is not None:
            idmap_mounts.stage_noexec_tree(SYSTEM_PROGRAM_DIRS[0], usr, exec_over)
        for (real, write, is_program), target in zip(wanted, targets, strict=True):
            source_fd = _owner_fd(real, request, fds, by_fd)
            if write and stat.S_ISDIR(os.fstat(source_fd).st_mode):
                placeholders += _placeholders(
                    sandbox_id=sandbox_id,
                    store=store,
                    folder=real,
                    source_fd=source_fd,
                    owner_uid=owner_uid,
                    owner_gid=owner.pw_gid,
                )
            if programs_apart:
                runs_here = is_program or real in execute
            else:  # unsafe_loader_maps_anything: a grant holding a program is exec-capable
                runs_here = is_program or any(inside(p, real) for p in execute if p != "/")
            idmap_mounts.stage_idmapped(
                source_fd,
                target,
                userns_fd=userns_fd,
                read_only=not write,
                noexec=not exec_anywhere and (write or not runs_here),
            )
            binds.append(Bind(str(target), real, write))
    finally:
        os.close(userns_fd)
    read_only = _inside_binds(binds, read_only_inside, frozenset(placeholders))
    made = {name: str(staging / name) for name in TMPFS_NAMES}  # recorded with the record
    for made_at in made.values():
        idmap_mounts.stage_tmpfs(
            Path(made_at),
            uid=user.uid,
            gid=user.gid,
            size_bytes=tmp_size,
            noexec=not exec_anywhere,
        )
    return Staged(
        tuple(binds),
        tuple(read_only),
        made["tmp"],
        made["shm"],
        made["home"],
        str(usr) if usr is not None else None,
    )
