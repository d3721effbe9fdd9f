"""Staging a sandbox's folders: idmapped clones of the granted folders, placeholders for the
dot entries tools run outside, and noexec tmpfs for /tmp, /dev/shm and the home.

Everything made here is recorded in the sandbox's row *before* it is made, so cleanup (or a
reconcile after a crash) can undo it: staged mounts by their target path, placeholders as
`placeholder:<dev>:<ino>:<path>` so only the very file or folder made here is ever removed,
and only while it is still empty.

Each folder is staged from the descriptor `bound.open_judged` opened as the owner, without
links, and found to be the very object judged: nothing here looks a grant up by its path.

The staging folder is root's, its group the sandbox's, mode 0710: only the sandbox's user (bwrap
binds from it) and root reach the granted folders through it, not another local user.

Placeholders (why this way, and what was tried): a mount needs a real dentry, so a name the
sandbox must not create has to exist in the owner's folder while it runs; a private copy of a
dentry per mount does not exist, Landlock's MAKE_* rights are per hierarchy (not per name),
seccomp cannot read the path a call names, an overlay over the owner's folder makes the owner's
own edits during the run undefined, and bwrap's own --tmpfs/--ro-bind on a missing path makes
it in the source folder anyway. So each placeholder at the top is an empty folder (git never
lists, adds or commits an empty folder: `git status` outside and `git add -A` inside see nothing
of the box's; `git clean -d -n` does list them), immutable while the sandbox runs (the kernel
detaches the sandbox's cover if the name is removed from the host's side: `rm` or `git clean
-fdx` by the owner would uncover it), and removed when the sandbox ends or, after a crash, by
the controller's reconcile on its next start. Inside `.git` they are files git reads as absent.
A placeholder sealed (the flag set, and its name still its inode after that) gets no read-only
bind from the wall: the flag alone refuses its removal, rename, replacement, filling and chmod
to everyone without CAP_LINUX_IMMUTABLE, and a bind each (~49 for an empty folder) was most of
a write grant's start. Where the flag does not take, the bind stands over it as before.
Since a sealed placeholder is on no command line, most are made while bwrap starts: a held start
(`stage_sandbox(hold=True)`, placeholder_plan.py) makes the first under each folder before the
start, to ask the filesystem whether the flag takes, and the rest on a worker from then on
(placeholders.py), while the staging goes on and bwrap and the confiner start; the confiner
waits on a pipe for the controller's release, sent only once every one is made, sealed and
checked (held_start.py), and anything but the release refuses.

Kept out of a plain `ls` too? A plain `ls` (no `-a`) already hides the dot names; the five
that are not (mise.toml, mise.local.toml, bunfig.toml, rust-toolchain, rust-toolchain.toml)
show while the sandbox runs. Tried, on this kernel (6.18, ext4), and why each fails:
- a placeholder of another kind: git skips FIFOs and sockets everywhere, `git clean -n -d`
  too, but neither can be made immutable on ext4 (FS_IOC_SETFLAGS needs an open descriptor:
  a socket inode gives ENXIO, a FIFO's ioctl ENOTTY; the path-based file_setattr(2) of 6.17
  says EOPNOTSUPP for ext4's special inodes), so each would need the wall's bind again and
  the owner's `rm` would uncover it; a FIFO is also a channel between sandbox and host tool;
- an overmount of the write folder's top with a view lacking them: new top-level files would
  land in the view, not in the owner's folder;
- Landlock in place of a placeholder: its MAKE_* rights cover the whole top of the folder, so
  refusing the names refuses every new top-level file;
- seccomp: a filter cannot read the path a call names; a user-notification supervisor that
  reads it races the sandbox's other threads (the kernel reads the path again after it);
- a bind of the parent, or an overlay: the parent is not granted; an overlay over the owner's
  folder makes the owner's own edits during the run undefined (above).

What this does NOT do: hide sockets or links deep inside a granted folder (seccomp blocks unix
sockets; links resolve inside the sandbox's own view); keep the five non-dot placeholders out
of a plain `ls`, or any out of `ls -a` and `git clean -n -d` (see above); protect names below
the top of a write folder; make a placeholder immutable on a filesystem without
FS_IMMUTABLE_FL (there the wall's read-only bind over it stands in the sandbox's way, and the
owner can still remove it).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lnk_controller import idmap_mounts
from lnk_controller.as_caller import CallerCredentials, caller_credentials
from lnk_controller.host_users import HostUser
from lnk_controller.placeholder_plan import HeldPlaceholders, WriteGrant
from lnk_controller.placeholders import begin_staging, stage_placeholders
from lnk_controller.sandbox_store import SandboxStore
from lnk_controller.wall import Bind
from lnk_shared.errors import LaunchRefused, StateError
from lnk_shared.refusals import inside

__all__ = [
    "TMPFS_NAMES",
    "Staged",
    "hidden_mount_points",
    "stage_sandbox",
    "staged_names",
    "wanted_binds",
    "wanted_paths",
]

# The sandbox's /tmp, /dev/shm and home: tmpfs in its staging folder, recorded in its record
# when it is written (SandboxStore.create(staged=...)), so staging needs no write for them.
TMPFS_NAMES = ("tmp", "shm", "home")
SYSTEM_PROGRAM_DIRS = ("/usr",)  # bound read-only in every sandbox: no extra bind needed


@dataclass(frozen=True)
class Staged:
    binds: tuple[Bind, ...]
    read_only: tuple[Bind, ...]
    tmp: str
    shm: str
    home: str
    usr: str | None = None  # the noexec clone of /usr bwrap binds from, if one was made
    # Placeholders being made while the sandbox starts held (`stage_sandbox(hold=True)`): the
    # program may be released only after `make_held` has every one made and sealed.
    held: tuple[HeldPlaceholders, ...] = ()


def wanted_paths(
    grants_read: list[str],
    grants_write: list[str],
    fd_grants: list[tuple[str, bool]],
    execute: tuple[str, ...],
    program_files: frozenset[str] = frozenset(),
    *,
    programs_apart: bool = False,
) -> list[str]:
    """The real paths the owner must pass open for this sandbox (those not passed as fds)."""
    passed = {p for p, _ in fd_grants}
    wanted = wanted_binds(
        grants_read, grants_write, [], execute, program_files, programs_apart=programs_apart
    )
    return [p for p, _, _ in wanted if p not in passed]


def staged_names(binds: int, *, programs_apart: bool) -> tuple[str, ...]:
    """The names `stage_sandbox` mounts in the staging folder for `binds` binds
    (`len(wanted_binds(...))`), in the order it makes them: the tmpfs, one per bind, the /usr
    clone. Written with the sandbox's record when it is created (`SandboxStore.create(staged=
    ...)`), they cost staging no write of its own (a transaction was ~0.9 ms of CPU of a 12 ms
    start)."""
    return (*TMPFS_NAMES, *(f"g{n}" for n in range(binds)), *(("usr",) if programs_apart else ()))


def wanted_binds(
    grants_read: list[str],
    grants_write: list[str],
    fd_grants: list[tuple[str, bool]],
    execute: tuple[str, ...],
    program_files: frozenset[str] = frozenset(),
    *,
    programs_apart: bool = False,
) -> list[tuple[str, bool, bool]]:
    """(real path, write, is a program) for every bind the sandbox needs. A program file
    (`program_files`) inside a granted folder is bound over itself too: what it may execute is
    then the very file judged, not whatever is renamed to its name later. With
    `programs_apart` (a finite list), every granted program inside a grant gets a bind of its
    own: the grant is noexec, so the loader maps nothing else of it (`exec_mounts.py`)."""
    wanted = [(p, False, False) for p in grants_read] + [(p, True, False) for p in grants_write]
    wanted += [(p, w, False) for p, w in fd_grants]
    granted = [w[0] for w in wanted]
    for program in execute:
        if program == "/" or any(inside(program, d) for d in SYSTEM_PROGRAM_DIRS):
            continue
        if program in granted:
            continue  # the grant is that very file: it is staged exec-capable itself
        in_grant = any(inside(program, g) for g in granted)
        if programs_apart or program in program_files or not in_grant:
            wanted.append((program, False, True))
    return wanted


def _inside_binds(
    binds: list[Bind],
    read_only_inside: tuple[str, ...],
    placeholders: frozenset[str],
    sealed: frozenset[str] = frozenset(),
) -> list[Bind]:
    """Binds over the dot entries of each write grant: `.git` pinned to itself (a mount point
    cannot be renamed away, so no new `.git` with hooks can take its place), then every dot entry
    tools run bound read-only over itself. A link in such a place is refused: the sandbox could
    rewrite whatever it points to. Each entry is looked at through the staged mount (the object
    judged), never by its path outside, which a swap could have moved elsewhere since. A
    `sealed` placeholder (immutable, see `_sealed`) needs no bind: the kernel refuses every
    change to it already."""
    pins: list[Bind] = []
    ro: list[Bind] = []
    for bind in binds:
        if not bind.write:
            continue
        git = os.path.join(bind.dest, ".git")
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            staged_git = os.path.join(bind.source, ".git")
            if git not in placeholders and stat.S_ISDIR(os.lstat(staged_git).st_mode):
                pins.append(Bind(staged_git, git, True))
        for path in sorted(set(read_only_inside) | placeholders | {git}):
            if not inside(path, bind.dest) or path == bind.dest:
                continue
            if path == git and any(p.dest == git for p in pins):
                continue  # a real .git folder: pinned above, its hooks and config read-only
            if path in sealed:
                continue
            staged = os.path.join(bind.source, os.path.relpath(path, bind.dest))
            try:
                info = os.lstat(staged)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except PermissionError:
                # Behind a folder of another user's: through the idmapped mount not even root
                # may search it (its owner is unmapped there), so the sandbox, which has less,
                # cannot reach the entry either.
                continue
            if stat.S_ISLNK(info.st_mode):
                raise LaunchRefused(
                    path,
                    "a link where tools run code: the sandbox could rewrite where it "
                    "points; replace the link with the file itself",
                )
            ro.append(Bind(staged, path))
    return pins + ro


def hidden_mount_points(
    hidden: tuple[str, ...], *, home: str, caller: CallerCredentials
) -> tuple[str, ...]:
    """The protected folders to cover inside grants, each made to exist first: a missing one
    under the owner's home (~/.lnk, ~/Link/History) is created empty and 0700, walking from the
    home without following links, because bwrap cannot make a mount point in a read-only grant
    and an uncovered name could appear there later. One elsewhere that does not exist is left
    out: nothing can appear there through a read-only grant.

    Every lookup and every folder made here is the caller's own (`caller_credentials`): a
    protected path whose folder the caller cannot search (its `~/.lnk` a link into root's home)
    answers as a missing one, so the launch tells nothing of what is there; a folder the caller
    could not make itself (a home that is not its own) refuses the launch, and nothing is made
    by root in its place."""
    if not hidden:  # nothing to cover (a launch without folders): no lookup, no switch
        return ()
    out = []
    with caller_credentials(caller):
        real_home = os.path.realpath(home)  # links above the home are the machine's
        for path in hidden:
            if os.path.lexists(path):
                out.append(path)
            elif inside(path, real_home) and path != real_home:
                _make_folders(path, real_home)
                out.append(path)
    return tuple(out)


def _make_folders(path: str, home: str) -> None:
    """Make `path` and the folders above it up to `home`, 0700, without following a link."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = -1
    try:
        fd = os.open(home, flags)
        for part in os.path.relpath(path, home).split("/"):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            next_fd = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except OSError as exc:
        raise LaunchRefused(
            path,
            f"it must exist to be kept hidden, and you cannot make it ({exc.strerror}): "
            "make it yourself as a folder (no link), or grant a folder that does not hold it",
        ) from None
    finally:
        if fd >= 0:
            os.close(fd)


def stage_sandbox(
    *,
    sandbox_id: str,
    staging: Path,
    store: SandboxStore,
    user: HostUser,
    owner_uid: int,
    sources: Mapping[str, int],
    grants_read: list[str],
    grants_write: list[str],
    fd_grants: list[tuple[str, bool]],
    read_only_inside: tuple[str, ...],
    execute: tuple[str, ...],
    exec_anywhere: bool,
    programs_apart: bool,
    exec_over: tuple[str, ...] = (),
    tmp_size: int,
    program_files: frozenset[str] = frozenset(),
    unsafe: tuple[str, ...] = (),
    caller: CallerCredentials | None = None,
    hold: bool = False,
    recorded: frozenset[str] = frozenset(),
) -> Staged:
    """Stage everything of the sandbox's. `programs_apart` (a finite list, the loader gap
    closed): read grants noexec, each granted program in one bound on its own, and a noexec
    clone of /usr to bind, with `exec_over` exec-capable in it (`exec_mounts.py`). With `hold`
    (the sandbox starts held, its program released by the caller), the placeholders that will
    seal are left for `make_held` (`Staged.held`, placeholder_plan.py). `recorded`: the targets
    the record already names (`staged_names`); any other is recorded here before it is made."""
    owner = pwd.getpwuid(owner_uid)
    idmap_mounts.make_staging_dir(staging, gid=user.gid)
    idmap_mounts.mount_staging_root(staging)  # the clean-up's one detach takes all below it
    binds: list[Bind] = []
    placeholders: list[tuple[str, bool]] = []
    held: list[HeldPlaceholders] = []
    wanted = wanted_binds(
        grants_read, grants_write, fd_grants, execute, program_files, programs_apart=programs_apart
    )
    targets = [staging / f"g{n}" for n in range(len(wanted))]
    # The placeholders first: a held start's are then made on a worker (their probes too,
    # `begin_staging`) while the rest below (the user namespace's child, the /usr view, the
    # mounts) goes on; their binds wait for the probes' answer (`_inside_binds`), the program's
    # release for every one (`make_held`).
    staging_placeholders = []
    for (real, write, _), target in zip(wanted, targets, strict=True):
        source_fd = sources.get(real)
        guarded = "unsafe_protected_names_unguarded" not in unsafe
        if source_fd is None or not (write and guarded):
            continue  # a miss is refused below
        if stat.S_ISDIR(os.fstat(source_fd).st_mode):
            grant = WriteGrant(real, source_fd, str(target), owner_uid, owner.pw_gid)
            as_files = "unsafe_placeholders_visible" in unsafe
            if hold:
                staging_placeholders.append(
                    begin_staging(
                        sandbox_id=sandbox_id,
                        store=store,
                        grant=grant,
                        as_files=as_files,
                        caller=caller,
                    )
                )
                continue
            made_now, _ = stage_placeholders(
                sandbox_id=sandbox_id,
                store=store,
                grant=grant,
                as_files=as_files,
                caller=caller,
                hold=False,
            )
            placeholders += made_now
    # The owner -> sandbox map for the idmapped grants: a short-lived child's namespace (5-10
    # ms on a loaded host), so made only when there is a grant to map (a plain launch has none).
    userns_fd = -1
    if wanted:
        userns_fd = idmap_mounts.make_userns_fd(
            ((owner_uid, user.uid, 1),), ((owner.pw_gid, user.gid, 1),)
        )
    try:
        usr = staging / "usr" if programs_apart else None
        records = [str(target) for target in targets] + ([str(usr)] if usr else [])
        records = [r for r in records if r not in recorded]
        if records:  # one write for all of them, before any is made
            store.add_mounts(sandbox_id, records)
        if usr is not None:
            idmap_mounts.stage_noexec_tree(SYSTEM_PROGRAM_DIRS[0], usr, exec_over)
        for (real, write, is_program), target in zip(wanted, targets, strict=True):
            source_fd = sources.get(real)
            if source_fd is None:  # bound.open_judged opened every one; a miss is a bug here
                raise StateError(f"{real} was not opened as judged: nothing is bound")
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
        if userns_fd >= 0:
            os.close(userns_fd)
    for begun in staging_placeholders:  # in the grants' order; a refusal refuses the launch
        made_now, held_here = begun.result()
        placeholders += made_now
        if held_here is not None:
            held.append(held_here)
    read_only = _inside_binds(
        binds,
        read_only_inside,
        frozenset(p for p, _ in placeholders),
        frozenset(p for p, sealed in placeholders if sealed),
    )
    if "unsafe_protected_names_unguarded" in unsafe:
        read_only = []
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
        tuple(held),
    )
