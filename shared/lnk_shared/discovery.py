"""Discovery: resolve a spec's paths and programs on this machine, as the caller sees it.

Every path is expanded (`~` is the owner's home from the password database, not $HOME), made
absolute, and walked one component at a time the way the kernel does, recording each symbolic
link, what it points at and who owns it. `[commands]` names are looked up on PATH once, here,
and the real executable found is what is granted: a later change of the link does not redirect
the grant. Nothing here decides what is allowed; `refusals.judge` does, on what this returns.

Run it with the owner's credentials: it answers what *the caller* can see. Each component is
opened below its folder's descriptor without following it, so what a walk records (each link it
followed, the identity of the object it reached) is of one consistent walk; the controller binds
that object or refuses (`lnk_controller.bound`). A folder the viewer cannot search answers as a
missing one, and so does `/proc/PID` of a process the viewer does not own.

What this does NOT do: keep a path meaning the same after the walk (the identity is what
carries over, not the path), or make `/proc/self` the caller's in the controller (there it is
the controller's own, root's, and answers as missing).
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import functools
import os
import pwd
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from lnk_shared.cloud import detect_cloud
from lnk_shared.errors import SpecError
from lnk_shared.grants import Identity, LinkHop, ResolvedFd, ResolvedPath, ResolvedSpec
from lnk_shared.login_path import login_path_dirs
from lnk_shared.paths import AGENT_FOLDERS, SOCKET_DIRS, USER_SETTINGS_DIR, BoxPaths
from lnk_shared.spec import PathEntry, Spec

__all__ = [
    "DEFAULT_PATH",
    "DETECT",
    "MAX_LINK_HOPS",
    "JudgeContext",
    "PathNotFound",
    "context_for",
    "foreign_process",
    "resolve_path",
    "resolve_spec",
    "viewer_uid",
    "writes_anything",
]

DETECT = object()  # context_for(cloud=DETECT): read the machine's firmware
MAX_LINK_HOPS = 40  # the kernel's own limit on links in one lookup (MAXSYMLINKS)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
PROC_SUPER_MAGIC = 0x9FA0  # statfs f_type of procfs (linux/magic.h)
_STATFS_BYTES = 256  # room for struct statfs (120 bytes on x86_64 and aarch64)
_WALK_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC  # a handle on the entry itself


class PathNotFound(Exception):
    """A path does not exist (or is not reachable); carries the component that is missing."""


@dataclass(frozen=True)
class Walk:
    real: str
    links: tuple[LinkHop, ...]
    exists: bool
    mode: int
    identity: Identity | None = None
    nlink: int = 0
    folders: tuple[Identity, ...] = ()  # every folder the walk ended below, "/" first


def _fs_type(fd: int) -> int:
    """The filesystem's magic number (statfs f_type) of the object open at `fd`."""
    buf = ctypes.create_string_buffer(_STATFS_BYTES)
    if _libc().fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ctypes.c_long.from_buffer(buf).value)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def viewer_uid() -> int:
    """The uid this thread's file lookups are checked as (its fsuid: the caller's own in the
    CLI, the owner's while the controller judges as them)."""
    with open("/proc/thread-self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("Uid:"):
                return int(line.split()[4])
    raise OSError(errno.EIO, "no Uid line in /proc/thread-self/status")


def foreign_process(name: str, parent_fd: int, info: os.stat_result) -> bool:
    """Whether `name` (just opened below `parent_fd`, with `info`) is the /proc folder of a
    process or task the viewer does not own. Its links (cwd, root, exe, fd/N) would tell the
    viewer where another user works and what it has open, and root (which the controller
    is) may read them all: such a folder is answered as missing."""
    if not (name.isascii() and name.isdigit() and stat.S_ISDIR(info.st_mode)):
        return False
    if _fs_type(parent_fd) != PROC_SUPER_MAGIC:
        return False
    return info.st_uid != viewer_uid()


def _walk(path: str, *, must_exist: bool, identify: bool = True) -> Walk:
    """Resolve `path` (absolute) physically, component by component, recording every link.

    Each component is opened `O_PATH | O_NOFOLLOW` below the descriptor of the folder before
    it, and a link is read from its own descriptor: no component is looked up twice, so the
    identity recorded is of the object this very walk reached, and each link recorded is the
    one it followed. Permission to look is the thread's own (run it as the owner): a
    component the viewer may not reach gives the same answer as one that does not exist.
    `identify=False` records no identities (`identity` and `folders` left empty): for a caller
    that wants only where the path is, spared an `fstat` of every folder on the way.
    """
    if not path.startswith("/"):
        raise ValueError(f"not absolute: {path!r}")
    pending = [c for c in reversed(path.split("/")) if c]
    stack = [("/", os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))]
    links: list[LinkHop] = []
    try:
        while pending:
            part = pending.pop()
            if part == ".":
                continue
            if part == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[1])
                continue
            current, parent_fd = stack[-1]
            candidate = os.path.join(current, part)
            try:
                fd = os.open(part, _WALK_FLAGS, dir_fd=parent_fd)
            except (FileNotFoundError, PermissionError):
                if must_exist:
                    raise PathNotFound(candidate) from None
                rest = os.path.normpath(os.path.join(candidate, *reversed(pending)))
                return Walk(rest, tuple(links), exists=False, mode=0)
            except OSError as exc:  # a name too long, an I/O error: the path cannot be granted
                raise PathNotFound(f"{candidate} ({exc.strerror})") from None
            try:
                info = os.fstat(fd)
                if foreign_process(part, parent_fd, info):
                    raise PathNotFound(candidate)
                if stat.S_ISLNK(info.st_mode):
                    if len(links) >= MAX_LINK_HOPS:
                        raise PathNotFound(f"{candidate}: too many links (a loop?)")
                    target = os.readlink("", dir_fd=fd)  # this link, not its name again
                elif pending and not stat.S_ISDIR(info.st_mode):
                    raise PathNotFound(f"{candidate} is not a folder")
            except BaseException:
                os.close(fd)
                raise
            if not stat.S_ISLNK(info.st_mode):
                stack.append((candidate, fd))
                continue
            os.close(fd)
            links.append(LinkHop(candidate, target, info.st_uid))
            if target.startswith("/"):
                while len(stack) > 1:
                    os.close(stack.pop()[1])
            pending.extend(c for c in reversed(target.split("/")) if c)
        if not identify:
            info = os.fstat(stack[-1][1])
            return Walk(stack[-1][0], tuple(links), True, info.st_mode, nlink=info.st_nlink)
        seen = [os.fstat(fd) for _, fd in stack]
        ids = tuple(Identity(i.st_dev, i.st_ino, stat.S_IFMT(i.st_mode)) for i in seen)
        info = seen[-1]
        return Walk(
            stack[-1][0], tuple(links), True, info.st_mode, ids[-1], info.st_nlink, ids[:-1]
        )
    finally:
        for _, fd in stack:
            os.close(fd)


def resolve_path(written: str, *, base: str, home: str) -> ResolvedPath:
    """Resolve one written path; raise PathNotFound when it does not exist."""
    if written == "~":
        absolute = home
    elif written.startswith("~/"):
        absolute = os.path.join(home, written[2:])
    else:
        absolute = os.path.join(base, written)
    walk = _walk(absolute, must_exist=True)
    return ResolvedPath(
        real=walk.real,
        written=written,
        links=walk.links,
        is_dir=stat.S_ISDIR(walk.mode),
        is_socket=stat.S_ISSOCK(walk.mode),
        identity=walk.identity,
    )


def real_or_planned(path: str) -> str:
    """Where `path` really is, or would be if created (for folders that may not exist yet)."""
    try:
        return _walk(os.path.abspath(path), must_exist=False, identify=False).real
    except PathNotFound:
        return os.path.abspath(path)


@dataclass(frozen=True)
class JudgeContext:
    """What the rules compare grants against, every path real (resolved through links).

    `spec_links`: each link met on the way to the spec file; whoever may replace one chooses
    which file the next run reads, so they are guarded like the file itself.
    """

    owner_uid: int
    home: str
    path_dirs: tuple[str, ...]
    user_settings: str
    box_dirs: tuple[str, ...]
    agent_folders: tuple[str, ...]
    socket_dirs: tuple[str, ...]
    spec_file: str | None = None
    cloud: str | None = None  # "aws", "gcp", "azure" when the firmware says so
    spec_links: tuple[str, ...] = ()
    # The spec file as an object: a write grant that is its folder (or one above it) under
    # another path, or that may hold another hard link of it, is refused by identity.
    spec_identity: Identity | None = None
    spec_nlink: int = 0
    spec_folders: tuple[Identity, ...] = ()
    # The owner's login PATH (from the profile files) and the per-user bin folders: see
    # login_path.py. Apart from `path_dirs` (the caller's PATH and the default) for the message.
    login_path_dirs: tuple[str, ...] = ()
    # False when `context_for(login_path=False)` left them out: a context to judge no write.
    login_path_judged: bool = True


def writes_anything(spec: Spec) -> bool:
    """Whether the spec asks to write anywhere (a write folder or a writable descriptor): the
    grants the login PATH folders are judged against (`refusals._check_outside_code`)."""
    return bool(spec.write) or any(grant.write for grant in spec.with_fds)


def _spec_location(spec_file: str) -> Walk:
    absolute = os.path.abspath(spec_file)
    try:
        return _walk(absolute, must_exist=False)
    except PathNotFound:
        return Walk(absolute, (), exists=False, mode=0)


def context_for(
    uid: int,
    *,
    env: Mapping[str, str],
    box: BoxPaths,
    spec_file: str | None = None,
    home: str | None = None,
    cloud: str | object | None = None,
    login_path: bool = True,
) -> JudgeContext:
    """Build the rules' context for the user `uid`, resolving every protected path. `cloud`
    is what the firmware says unless given (tests pass it; `DETECT` reads DMI).

    `login_path=False` leaves the owner's login PATH folders unread and unresolved (half the
    context's lookups, ~1 ms of a launch): for a spec that writes nothing (`writes_anything`),
    the only kind of grant they are judged against. The context then says so
    (`login_path_judged`), and `refusals.find_refusals` refuses to judge a write with it."""
    if home is None:
        try:
            home = pwd.getpwuid(uid).pw_dir
        except KeyError:
            raise SpecError(f"uid {uid} has no entry in the password database") from None
    # One walk per folder named: the caller's PATH is most often the default one, and the
    # system's profiles name the same folders again.
    real = functools.cache(real_or_planned)
    real_home = real(home)
    path_dirs = [real(d) for d in env.get("PATH", DEFAULT_PATH).split(":") if d]
    path_dirs += [real(d) for d in DEFAULT_PATH.split(":")]
    runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    sockets = [real(d) for d in (*SOCKET_DIRS, runtime)]
    spec = _spec_location(spec_file) if spec_file else None
    return JudgeContext(
        owner_uid=uid,
        home=real_home,
        path_dirs=tuple(dict.fromkeys(d for d in path_dirs if d.startswith("/"))),
        user_settings=real(os.path.join(real_home, USER_SETTINGS_DIR)),
        box_dirs=tuple(real(str(d)) for d in box.all()),
        agent_folders=tuple(real(os.path.join(real_home, f)) for f in AGENT_FOLDERS),
        socket_dirs=tuple(dict.fromkeys(sockets)),
        login_path_dirs=tuple(dict.fromkeys(real(d) for d in login_path_dirs(uid, real_home)))
        if login_path
        else (),
        login_path_judged=login_path,
        spec_file=spec.real if spec else None,
        spec_links=tuple(hop.link for hop in spec.links) if spec else (),
        spec_identity=spec.identity if spec else None,
        spec_nlink=spec.nlink if spec else 0,
        spec_folders=spec.folders if spec else (),
        cloud=detect_cloud() if cloud is DETECT else (cloud if isinstance(cloud, str) else None),
    )


def _resolve_entries(
    entries: tuple[PathEntry, ...], key: str, spec: Spec, home: str
) -> tuple[ResolvedPath, ...]:
    out = []
    for entry in entries:
        try:
            out.append(resolve_path(entry.written, base=entry.base, home=home))
        except PathNotFound as exc:
            raise SpecError(
                f"{entry.written!r} cannot be granted: no such file or folder ({exc})",
                source=spec.source,
                key=key,
            ) from None
    return tuple(sorted(set(out)))


def _find_on_path(name: str, path_env: str) -> str | None:
    for folder in path_env.split(":"):
        if not folder.startswith("/"):
            continue  # a relative PATH entry would depend on the current folder
        candidate = os.path.join(folder, name)
        try:
            info = os.stat(candidate)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_mode & 0o111:
            return candidate
    return None


def _resolve_commands(spec: Spec, home: str, path_env: str) -> tuple[ResolvedPath, ...]:
    out = []
    for entry in spec.commands:
        written = entry.written
        if "/" not in written and written != "~":
            found = _find_on_path(written, path_env)
            if found is None:
                raise SpecError(
                    f"{written!r} is not a program found on PATH ({path_env})",
                    source=spec.source,
                    key="commands.allow",
                )
            resolved = resolve_path(found, base="/", home=home)
            out.append(dataclasses.replace(resolved, written=written))
            continue
        try:
            resolved = resolve_path(written, base=entry.base, home=home)
        except PathNotFound as exc:
            raise SpecError(
                f"{written!r}: no such program ({exc})", source=spec.source, key="commands.allow"
            ) from None
        out.append(resolved)
    for resolved in out:
        if not resolved.is_dir:
            info = os.stat(resolved.real)
            if not (stat.S_ISREG(info.st_mode) and info.st_mode & 0o111):
                raise SpecError(
                    f"{resolved.written!r} is not an executable file or a folder",
                    source=spec.source,
                    key="commands.allow",
                )
    return tuple(sorted(set(out)))


def _resolve_fds(spec: Spec, home: str) -> tuple[ResolvedFd, ...]:
    out = []
    for grant in spec.with_fds:
        try:
            target = os.readlink(f"/proc/self/fd/{grant.fd}")
        except OSError:
            raise SpecError(
                f"descriptor {grant.fd} is not open", source="--with-fd", key=str(grant.fd)
            ) from None
        try:
            resolved = resolve_path(target, base="/", home=home)
        except PathNotFound as exc:
            raise SpecError(
                f"descriptor {grant.fd} is not an open folder ({exc})",
                source="--with-fd",
                key=str(grant.fd),
            ) from None
        if not resolved.is_dir:
            raise SpecError(
                f"descriptor {grant.fd} is not a folder", source="--with-fd", key=str(grant.fd)
            )
        info = os.fstat(grant.fd)
        if resolved.identity != Identity(info.st_dev, info.st_ino, stat.S_IFMT(info.st_mode)):
            raise SpecError(
                f"descriptor {grant.fd} is no longer the folder at {target}: it was moved or "
                "replaced; open it again and run again",
                source="--with-fd",
                key=str(grant.fd),
            )
        out.append(ResolvedFd(grant.fd, grant.write, resolved))
    return tuple(out)


def resolve_spec(spec: Spec, ctx: JudgeContext, *, path_env: str = DEFAULT_PATH) -> ResolvedSpec:
    """Resolve every path and program of `spec` on this machine; raise SpecError if one fails."""
    home = ctx.home
    return ResolvedSpec(
        source=spec.source,
        read=_resolve_entries(spec.read, "folders.read", spec, home),
        write=_resolve_entries(spec.write, "folders.write", spec, home),
        commands=() if spec.commands_any else _resolve_commands(spec, home, path_env),
        commands_any=spec.commands_any,
        internet_any=spec.internet_any,
        internet=spec.internet,
        network_host=spec.network_host,
        lan_any=spec.lan_any,
        lan=spec.lan,
        browser=spec.browser,
        ports=spec.ports,
        with_fds=_resolve_fds(spec, home),
        store_driver=spec.store_driver,
        services=spec.services,
        models=spec.models,
    )
