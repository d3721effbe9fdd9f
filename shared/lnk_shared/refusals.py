"""The rules a spec's grants must pass before anything runs: pure functions, no I/O.

Every comparison is between real paths (resolved through links on both sides), so another
spelling of the same place (`~/x`, `/home/u/x`, a link to it, `a/../x`) meets the same rule.
`judge` raises the first refusal; `find_refusals` lists them all (for `lnk spec show`).

A `[commands]` name found on PATH may lead through links the owner made (a package manager's
`~/.local/bin/tool -> ~/.local/share/tool/1.2/tool`): the seed grants such a name by its real
program, so links of the owner's own are followed there, where a path written keeps the rule
that every link on it is root's. What is judged and bound is the real program (its path and,
at launch, its identity): the link is only how it was found, and a change of it asks again
when the real program it leads to changes. Refused on such a chain, as another party choosing
what runs: a link owned by anyone but root or the owner, a link in a folder anyone else may
change (another user's, or group/other-writable without the sticky bit), a link in a folder the
sandbox may write or in a shared scratch folder, a real program (or a folder on its way) anyone
else may change, and a chain of more than `MAX_FOUND_LINKS` links.

What these rules do NOT do: look inside granted folders (a socket or a link deep inside one is
the wall's to contain), or check that the owner may read what is named (discovery runs with the
owner's credentials for that). Project dot entries that do not exist yet are listed in
`read_only_inside` all the same; keeping them from being created is the wall's job.
"""

from __future__ import annotations

import ipaddress
import os
import stat

from lnk_shared.discovery import JudgeContext
from lnk_shared.errors import (
    CloudLanRefused,
    CommandRefused,
    LinkRefused,
    OutsideCodeRefused,
    RefusedError,
    SandboxHomeRefused,
    SelfWideningRefused,
    SettingsGrantRefused,
    SocketGrantRefused,
    StateError,
)
from lnk_shared.grants import Grants, Holder, ResolvedPath, ResolvedSpec
from lnk_shared.paths import PROJECT_RUN_DOT_ENTRIES, SANDBOX_HOMES, SYSTEM_DIRS, TEMP_DIRS
from lnk_shared.protected_names import PROTECTED_NAMES

__all__ = ["MAX_FOUND_LINKS", "check_self_widening", "find_refusals", "inside", "judge"]

ROOT_UID = 0
# Links on the way from a PATH entry to its real program: package managers make 1 to 3
# (update-alternatives' two, pipx's venv link and its Python's); a longer chain is a maze to
# read in the approval, not an install.
MAX_FOUND_LINKS = 8


def inside(path: str, folder: str) -> bool:
    """True when `path` is `folder` or below it (both absolute and normalized)."""
    if folder == "/":
        return True
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _label(p: ResolvedPath, key: str) -> str:
    if p.written == p.real:
        return f"{key} {p.written}"
    return f"{key} {p.written} (really {p.real})"


def _settings(ctx: JudgeContext) -> list[tuple[str, str]]:
    named = [(ctx.user_settings, "the box's settings (~/.lnk)")]
    named += [(d, "the box's own folder") for d in ctx.box_dirs]
    named += [(d, "agents' folders") for d in ctx.agent_folders]
    return named


def _check_settings(
    p: ResolvedPath, key: str, write: bool, ctx: JudgeContext
) -> RefusedError | None:
    for protected, what in _settings(ctx):
        if inside(p.real, protected):
            return SettingsGrantRefused(_label(p, key), f"it opens {what}, closed to every sandbox")
        if write and inside(protected, p.real):
            return SettingsGrantRefused(
                _label(p, key), f"it holds {protected} ({what}), which no sandbox may write"
            )
    return None


def _check_sockets(p: ResolvedPath, key: str, ctx: JudgeContext) -> RefusedError | None:
    if p.is_socket:
        return SocketGrantRefused(_label(p, key), "it is a socket: another program's way in")
    for folder in ctx.socket_dirs:
        if inside(p.real, folder) or inside(folder, p.real):
            return SocketGrantRefused(
                _label(p, key), f"it opens {folder}, where other programs keep their sockets"
            )
    return None


def _check_outside_code(p: ResolvedPath, key: str, ctx: JudgeContext) -> RefusedError | None:
    label = _label(p, key)
    real = p.real
    if inside(ctx.home, real):
        return OutsideCodeRefused(label, "it holds your home's dot files, which run outside")
    if inside(real, ctx.home) and real != ctx.home:
        first = real[len(ctx.home) :].lstrip("/").split("/")[0]
        if first.startswith("."):
            return OutsideCodeRefused(label, f"~/{first} is a home dot folder; it runs outside")
    for folder in ctx.path_dirs:
        if inside(real, folder) or inside(folder, real):
            return OutsideCodeRefused(label, f"{folder} is on PATH; programs there run outside")
    for folder in ctx.login_path_dirs:
        if inside(real, folder) or inside(folder, real):
            return OutsideCodeRefused(
                label,
                f"{folder} is on your login PATH (a profile file or a per-user bin folder); "
                "programs there run outside, in your next shell",
            )
    for folder in SYSTEM_DIRS:
        if inside(real, folder) or inside(folder, real):
            return OutsideCodeRefused(label, f"{folder} is a system folder")
    parts = real.split("/")
    for name in PROTECTED_NAMES:
        head = name.path.split("/")
        what = f"a project file {name.tool} reads or runs ({name.why})"
        for i in range(len(parts) - len(head) + 1):
            if parts[i : i + len(head)] == head:
                return OutsideCodeRefused(label, f"{name.path} is {what}")
        if parts[-1] == head[0] and len(head) > 1:
            return OutsideCodeRefused(label, f"it holds {name.path}, {what}")
    return None


def _check_self_widening(p: ResolvedPath, key: str, ctx: JudgeContext) -> RefusedError | None:
    if ctx.spec_file is None:
        return None
    # Holding the file means being the file, its folder or a parent of it.
    if inside(ctx.spec_file, p.real):
        return SelfWideningRefused(
            _label(p, key), f"it could rewrite this spec ({ctx.spec_file}) and widen its next run"
        )
    # Holding a link on the way to it means choosing which file the next run reads.
    for link in ctx.spec_links:
        if inside(link, p.real):
            return SelfWideningRefused(
                _label(p, key),
                f"it could replace the link {link} on the way to this spec and widen its next run",
            )
    return _check_self_widening_by_identity(p, key, ctx)


def _check_self_widening_by_identity(
    p: ResolvedPath, key: str, ctx: JudgeContext
) -> RefusedError | None:
    """The same rule on objects, for what paths cannot show: the spec's folder (or one above
    it) reached under another path (a bind mount), the spec itself under another name, and a
    spec with other hard links, any of which may sit in this folder (a hard link is on the
    same filesystem, so only a folder on another one is sure to hold none)."""
    if ctx.spec_identity is None or p.identity is None:
        return None
    why = None
    if p.identity == ctx.spec_identity:
        why = f"it is this spec ({ctx.spec_file}) under another name"
    elif p.identity in ctx.spec_folders:
        why = f"it is a folder holding this spec ({ctx.spec_file}), reached by another path"
    elif ctx.spec_nlink > 1 and p.identity.dev == ctx.spec_identity.dev and p.is_dir:
        why = (
            f"this spec ({ctx.spec_file}) has {ctx.spec_nlink} hard links and this folder is "
            "on its filesystem, so one may be inside it; keep the spec as a single file (copy it)"
        )
    if why is None:
        return None
    return SelfWideningRefused(_label(p, key), f"{why}: a run could rewrite it and widen its next")


def check_self_widening(p: ResolvedPath, key: str, ctx: JudgeContext) -> None:
    """Raise the self-widening refusal for a folder written that is not a spec's grant (an
    agent's home, which its sandbox writes)."""
    refusal = _check_self_widening(p, key, ctx)
    if refusal is not None:
        raise refusal


def _check_sandbox_home(p: ResolvedPath, key: str, ctx: JudgeContext) -> RefusedError | None:
    """A grant bound where the sandbox's own home goes (/home, or /): bwrap would have to make
    the home's mount point inside the grant, which it cannot (a read grant is read-only, and a
    write grant is the owner's real folder), so the launch would fail after judging."""
    if not inside(SANDBOX_HOMES, p.real):
        return None
    own = inside(ctx.home, SANDBOX_HOMES) and ctx.home != SANDBOX_HOMES
    return SandboxHomeRefused(
        _label(p, key),
        f"it holds {SANDBOX_HOMES}, where the sandbox's own home is mounted: grant folders "
        f"below {SANDBOX_HOMES} instead" + (f", such as your home {ctx.home}" if own else ""),
    )


def _check_links(p: ResolvedPath, key: str) -> RefusedError | None:
    for hop in p.links:
        if hop.owner_uid != ROOT_UID:
            hint = "name the real path instead"
            if key == "commands.allow" and p.found_on_path is None:
                name = os.path.basename(p.written.rstrip("/"))
                hint += (
                    f", or name the program without a path ({name!r}) to have it found on "
                    "PATH and granted by its real path"
                )
            return LinkRefused(
                _label(p, key),
                f"the link {hop.link} -> {hop.target} is owned by uid {hop.owner_uid}, not root; "
                f"{hint}",
            )
    return None


def _who_else_changes(holder: Holder, owner: int, *, folder: bool = True) -> str | None:
    """Who besides root and the owner may change `holder` (a folder: what is in it, unless it
    is sticky; a file: itself), or None."""
    if holder.owner_uid not in (ROOT_UID, owner):
        return f"uid {holder.owner_uid} (its owner)"
    mode = holder.mode if folder else holder.mode & ~stat.S_ISVTX
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        return "every user" if mode & stat.S_IWOTH else "its group"
    return None


def _first_changed_by_another(
    holders: tuple[Holder, ...], owner: int, *, last_is_file: bool
) -> tuple[Holder, str] | None:
    for i, holder in enumerate(holders):
        file = last_is_file and i == len(holders) - 1
        who = _who_else_changes(holder, owner, folder=not file)
        if who is not None:
            return holder, who
    return None


def _check_found_on_path(
    p: ResolvedPath, spec: ResolvedSpec, ctx: JudgeContext
) -> RefusedError | None:
    """A program found on PATH through links that are not all root's (the module docstring)."""
    label = _label(p, "commands.allow")
    owner = ctx.owner_uid
    if len(p.links) > MAX_FOUND_LINKS:
        return LinkRefused(
            label,
            f"it is found through {len(p.links)} links, more than {MAX_FOUND_LINKS}: "
            "name the real path instead",
        )
    writable = [w.real for w in spec.write] + [f.path.real for f in spec.with_fds if f.write]
    for hop in p.links:
        shown_hop = f"the link {hop.link} -> {hop.target}"
        if hop.owner_uid not in (ROOT_UID, owner):
            return LinkRefused(
                label,
                f"{shown_hop} is owned by uid {hop.owner_uid}, neither root nor you: that user "
                "chooses what it runs; name the real path if you trust it",
            )
        for place in (*writable, *TEMP_DIRS):
            if inside(hop.link, place):
                return CommandRefused(
                    label,
                    f"{shown_hop} is in {place}, which the sandbox or anyone may write, so it "
                    "could lead the next run elsewhere",
                )
        if not hop.folders:
            return LinkRefused(label, f"{shown_hop}: who owns the folders it is in is not known")
        changed = _first_changed_by_another(hop.folders, owner, last_is_file=False)
        if changed is not None:
            return LinkRefused(
                label,
                f"{shown_hop} is in {changed[0].path}, which {changed[1]} may change: "
                "that chooses what runs",
            )
    if not p.holders:
        return LinkRefused(label, f"who owns {p.real} and its folders is not known")
    changed = _first_changed_by_another(p.holders, owner, last_is_file=not p.is_dir)
    if changed is not None:
        what = "it" if changed[0] is p.holders[-1] else f"{changed[0].path} on its way"
        return LinkRefused(
            label,
            f"it is found through your own links as {p.real}, and {what} may be changed by "
            f"{changed[1]}: only you and root may change what such a name runs",
        )
    return None


def _check_command(p: ResolvedPath, spec: ResolvedSpec, ctx: JudgeContext) -> RefusedError | None:
    label = _label(p, "commands.allow")
    writable = [w.real for w in spec.write] + [f.path.real for f in spec.with_fds if f.write]
    for folder in writable:
        if inside(p.real, folder) or inside(folder, p.real):
            return CommandRefused(label, f"the sandbox may write {folder}, so it could replace it")
    for folder in TEMP_DIRS:
        if inside(p.real, folder) or inside(folder, p.real):
            return CommandRefused(label, f"{folder} is a shared scratch folder anyone writes")
    return None


# A range holding one of these is "every private network": on a cloud, the cloud's network.
_PRIVATE_BLOCKS = tuple(
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)


def _check_lan_on_cloud(spec: ResolvedSpec, ctx: JudgeContext) -> RefusedError | None:
    if ctx.cloud is None:
        return None
    why = (
        f"this machine is on {ctx.cloud}, whose private ranges are the cloud's network: "
        "list the hosts or addresses it may reach"
    )
    if spec.lan_any:
        return CloudLanRefused('[lan] hosts = ["*"]', why)
    for entry in spec.lan:
        net = entry.network
        if net is not None and any(
            net.version == block.version and block.subnet_of(net)  # type: ignore[arg-type]
            for block in _PRIVATE_BLOCKS
        ):
            return CloudLanRefused(f"[lan] {entry}", why)
    return None


def find_refusals(spec: ResolvedSpec, ctx: JudgeContext) -> list[RefusedError]:
    """Every rule the spec breaks, in a stable order (settings first)."""
    found: list[RefusedError | None] = []
    reads = [(p, "folders.read", False) for p in spec.read]
    writes = [(p, "folders.write", True) for p in spec.write]
    fds = [(f.path, f"--with-fd {f.fd}", f.write) for f in spec.with_fds]
    if not ctx.login_path_judged and any(write for _, _, write in (*writes, *fds)):
        raise StateError(
            "a write grant was judged without the owner's login PATH folders "
            "(context_for(login_path=False)): a bug in lnk, report it"
        )
    for p, key, write in (*reads, *writes, *fds):
        found.append(_check_links(p, key))
        found.append(_check_settings(p, key, write, ctx))
        found.append(_check_sockets(p, key, ctx))
        found.append(_check_sandbox_home(p, key, ctx))
        if write:
            found.append(_check_outside_code(p, key, ctx))
            found.append(_check_self_widening(p, key, ctx))
    found.append(_check_lan_on_cloud(spec, ctx))
    for p in spec.commands:
        if p.found_on_path is not None and p.links:  # root's links too: their folders count
            found.append(_check_found_on_path(p, spec, ctx))
        else:
            found.append(_check_links(p, "commands.allow"))
        found.append(_check_settings(p, "commands.allow", False, ctx))
        found.append(_check_command(p, spec, ctx))
    return [r for r in found if r is not None]


def _hidden(spec: ResolvedSpec, ctx: JudgeContext) -> tuple[str, ...]:
    granted = [p.real for p in (*spec.read, *spec.write)] + [f.path.real for f in spec.with_fds]
    hidden = {
        protected
        for protected, _ in _settings(ctx)
        for folder in granted
        if inside(protected, folder) and protected != folder
    }
    return tuple(sorted(hidden))


def _read_only_inside(spec: ResolvedSpec) -> tuple[str, ...]:
    folders = [p.real for p in spec.write if p.is_dir]
    folders += [f.path.real for f in spec.with_fds if f.write]
    return tuple(sorted({os.path.join(f, e) for f in folders for e in PROJECT_RUN_DOT_ENTRIES}))


def judge(spec: ResolvedSpec, ctx: JudgeContext) -> Grants:
    """Return the grants if every rule passes; raise the first refusal otherwise."""
    refusals = find_refusals(spec, ctx)
    if refusals:
        raise refusals[0]
    return Grants(spec=spec, hidden=_hidden(spec, ctx), read_only_inside=_read_only_inside(spec))
