"""Discovery: resolve a spec's paths and programs on this machine, as the caller sees it.

Every path is expanded (`~` is the owner's home from the password database, not $HOME), made
absolute, and walked one component at a time the way the kernel does, recording each symbolic
link, what it points at and who owns it. `[commands]` names are looked up on PATH once, here,
and the real executable found is what is granted: a later change of the link does not redirect
the grant. Nothing here decides what is allowed; `refusals.judge` does, on what this returns.

Run it with the owner's credentials: it answers what *the caller* can see.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from lnk_shared.cloud import detect_cloud
from lnk_shared.errors import SpecError
from lnk_shared.grants import LinkHop, ResolvedFd, ResolvedPath, ResolvedSpec
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
    "resolve_path",
    "resolve_spec",
]

DETECT = object()  # context_for(cloud=DETECT): read the machine's firmware
MAX_LINK_HOPS = 40  # the kernel's own limit on links in one lookup (MAXSYMLINKS)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


class PathNotFound(Exception):
    """A path does not exist (or is not reachable); carries the component that is missing."""


@dataclass(frozen=True)
class Walk:
    real: str
    links: tuple[LinkHop, ...]
    exists: bool
    mode: int


def _walk(path: str, *, must_exist: bool) -> Walk:
    """Resolve `path` (absolute) physically, component by component, recording every link."""
    if not path.startswith("/"):
        raise ValueError(f"not absolute: {path!r}")
    pending = [c for c in reversed(path.split("/")) if c]
    current = "/"
    links: list[LinkHop] = []
    mode = os.lstat("/").st_mode
    while pending:
        part = pending.pop()
        if part == ".":
            continue
        if part == "..":
            current = os.path.dirname(current) or "/"
            continue
        candidate = os.path.join(current, part)
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            if must_exist:
                raise PathNotFound(candidate) from None
            rest = os.path.normpath(os.path.join(candidate, *reversed(pending)))
            return Walk(rest, tuple(links), exists=False, mode=0)
        except NotADirectoryError:
            raise PathNotFound(f"{current} is not a folder") from None
        except PermissionError:
            raise PathNotFound(f"{candidate} (permission denied)") from None
        except OSError as exc:  # a name too long, an I/O error: the path cannot be granted
            raise PathNotFound(f"{candidate} ({exc.strerror})") from None
        if stat.S_ISLNK(info.st_mode):
            if len(links) >= MAX_LINK_HOPS:
                raise PathNotFound(f"{candidate}: too many links (a loop?)")
            try:
                target = os.readlink(candidate)
            except OSError as exc:  # replaced between lstat and readlink
                raise PathNotFound(f"{candidate} ({exc.strerror})") from None
            links.append(LinkHop(candidate, target, info.st_uid))
            if target.startswith("/"):
                current = "/"
            pending.extend(c for c in reversed(target.split("/")) if c)
            continue
        if pending and not stat.S_ISDIR(info.st_mode):
            raise PathNotFound(f"{candidate} is not a folder")
        current = candidate
        mode = info.st_mode
    return Walk(current, tuple(links), exists=True, mode=mode)


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
    )


def real_or_planned(path: str) -> str:
    """Where `path` really is, or would be if created (for folders that may not exist yet)."""
    try:
        return _walk(os.path.abspath(path), must_exist=False).real
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
    # The owner's login PATH (from the profile files) and the per-user bin folders: see
    # login_path.py. Apart from `path_dirs` (the caller's PATH and the default) for the message.
    login_path_dirs: tuple[str, ...] = ()


def _spec_location(spec_file: str) -> tuple[str, tuple[str, ...]]:
    absolute = os.path.abspath(spec_file)
    try:
        walk = _walk(absolute, must_exist=False)
    except PathNotFound:
        return absolute, ()
    return walk.real, tuple(hop.link for hop in walk.links)


def context_for(
    uid: int,
    *,
    env: Mapping[str, str],
    box: BoxPaths,
    spec_file: str | None = None,
    home: str | None = None,
    cloud: str | object | None = None,
) -> JudgeContext:
    """Build the rules' context for the user `uid`, resolving every protected path. `cloud`
    is what the firmware says unless given (tests pass it; `DETECT` reads DMI)."""
    if home is None:
        try:
            home = pwd.getpwuid(uid).pw_dir
        except KeyError:
            raise SpecError(f"uid {uid} has no entry in the password database") from None
    real_home = real_or_planned(home)
    path_dirs = [real_or_planned(d) for d in env.get("PATH", DEFAULT_PATH).split(":") if d]
    path_dirs += [real_or_planned(d) for d in DEFAULT_PATH.split(":")]
    runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    sockets = [real_or_planned(d) for d in (*SOCKET_DIRS, runtime)]
    spec_real, spec_links = _spec_location(spec_file) if spec_file else (None, ())
    return JudgeContext(
        owner_uid=uid,
        home=real_home,
        path_dirs=tuple(dict.fromkeys(d for d in path_dirs if d.startswith("/"))),
        user_settings=real_or_planned(os.path.join(real_home, USER_SETTINGS_DIR)),
        box_dirs=tuple(real_or_planned(str(d)) for d in box.all()),
        agent_folders=tuple(real_or_planned(os.path.join(real_home, f)) for f in AGENT_FOLDERS),
        socket_dirs=tuple(dict.fromkeys(sockets)),
        login_path_dirs=tuple(
            dict.fromkeys(real_or_planned(d) for d in login_path_dirs(uid, real_home))
        ),
        spec_file=spec_real,
        spec_links=spec_links,
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
            out.append(ResolvedPath(resolved.real, written, resolved.links, resolved.is_dir))
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
    )
