"""A Landlock denial said as a person reads it, with the grant that would allow it.

`explain(access, home)` turns one parsed record (denial_records.Access) into one line:

    run /usr/bin/echo (grant it with --command echo)
    write ~/x/y (grant it with --write ~/x)
    read ~/notes.txt (grant it with --read ~/notes.txt)
    connect 10.0.0.5:443 (the sandbox reaches the network through the box's proxy: ...)

and never suggests a grant the box refuses anyway: the grant is put to the box's own rules
(`rules_of`: lnk_shared.refusals, with the owner's context), and one they refuse (a system
folder, a home dot folder, lnk's settings, a socket folder) is said to be refused by rule, with
the rule's reason, instead. Pure: the caller escapes the line when it shows it (the path is the
sandbox's choice) and cuts it.

Does NOT: know the spec the sandbox ran with (a denial of something the spec grants is not
possible: Landlock allowed it), or follow links (the kernel logs the path it resolved).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable

from lnk_controller.denial_records import Access
from lnk_shared.discovery import JudgeContext
from lnk_shared.grants import ResolvedPath, ResolvedSpec
from lnk_shared.refusals import find_refusals

__all__ = ["Refused", "explain", "key", "priority", "rules_of"]

# Programs found on the default PATH are granted by name (`--command make`); others by path.
_PATH_DIRS = ("/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin")
_READS = {"fs.read_file", "fs.read_dir"}
# Rights whose logged path is the folder being changed (a new or removed entry, a rename).
_IN_FOLDER = {
    "fs.make_char",
    "fs.make_dir",
    "fs.make_reg",
    "fs.make_sock",
    "fs.make_fifo",
    "fs.make_block",
    "fs.make_sym",
    "fs.remove_dir",
    "fs.remove_file",
    "fs.refer",
}
_ON_FILE = {"fs.write_file", "fs.truncate"}


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _tilde(path: str, home: str | None) -> str:
    if home and home != "/" and _under(path, home):
        return "~" + path[len(home.rstrip("/")) :]
    return path


def key(access: Access) -> tuple[str, str]:
    """What makes two denials the same example: the kind of access and its object."""
    kind = "net" if access.port is not None else ",".join(sorted(access.blockers))
    where = f"{access.address}:{access.port}" if access.port is not None else access.path or ""
    return kind, where


# Whether the box would refuse a grant, and why: ("read" | "write", path) -> the reason, or None.
# The launcher passes the box's own rules (refusals.find_refusals with the owner's context), so
# a hint never names a grant the next launch would refuse.
Refused = Callable[[str, str], str | None]


def rules_of(ctx: JudgeContext) -> Refused:
    """The box's rules for the owner `ctx` is of, as a `Refused`."""

    def refused(kind: str, path: str) -> str | None:
        place = ResolvedPath(real=path, written=path)
        found = find_refusals(
            ResolvedSpec(
                source=None,
                read=(place,) if kind == "read" else (),
                write=(place,) if kind == "write" else (),
                commands=(),
                commands_any=False,
                internet_any=False,
                internet=(),
                network_host=False,
                lan_any=False,
                lan=(),
                browser=(),
                ports=(),
                with_fds=(),
            ),
            ctx,
        )
        return f"[{found[0].rule}]: {found[0].why}" if found else None

    return refused


def priority(access: Access) -> int:
    """Which denials a person reads first: what a program needed (run, write, read, connect)
    before what programs probe and survive (a terminal ioctl on /dev/null, a /proc peek)."""
    blockers = set(access.blockers)
    if "fs.execute" in blockers:
        return 0
    if blockers & (_IN_FOLDER | _ON_FILE):
        return 1
    if blockers & _READS or access.port is not None:
        return 2
    return 3


def _run(path: str, home: str | None) -> str:
    shown = _tilde(path, home)
    if ".so" in posixpath.basename(path):
        return (
            f"load {shown} as code (a library: grant the program that loads it with --command, "
            "and its folder with --read)"
        )
    name = posixpath.basename(path)
    grant = name if posixpath.dirname(path) in _PATH_DIRS else shown
    return f"run {shown} (grant it with --command {grant})"


def _nothing_refused(kind: str, path: str) -> str | None:
    return None


def explain(access: Access, home: str | None, refused: Refused = _nothing_refused) -> str:
    """The denial as one line: what was denied, and the flag that grants it (or the rule that
    refuses it)."""
    blockers = set(access.blockers)
    if access.port is not None:
        target = f"{access.address}:{access.port}"
        if "net.bind_tcp" in blockers:
            return f"listen on port {access.port} (refused by rule: a sandbox serves no port)"
        if access.address in ("127.0.0.1", "::1"):
            return f"connect {target} (grant this machine's port with --port {access.port})"
        return (
            f"connect {target} (the sandbox reaches the network through the box's proxy only: "
            f"grant the host's name with --internet-host NAME:{access.port})"
        )
    path = access.path
    if path is None:
        if "ptrace" in blockers:
            return "trace or read a process outside the sandbox (refused by rule)"
        what = ",".join(access.blockers)
        return f"{what} (refused by rule: signals and abstract sockets stay inside the sandbox)"
    shown = _tilde(path, home)
    if "fs.execute" in blockers:
        return _run(path, home)
    if "fs.ioctl_dev" in blockers:
        return f"use device {shown} (refused by rule: device commands are not granted)"
    if blockers & (_IN_FOLDER | _ON_FILE):
        folder = path if blockers & _IN_FOLDER else posixpath.dirname(path) or "/"
        why = refused("write", folder)
        if why is not None:
            return f"write {shown} (refused {why})"
        return f"write {shown} (grant it with --write {_tilde(folder, home)})"
    if blockers & _READS:
        why = refused("read", path)
        if why is not None:
            return f"read {shown} (refused {why})"
        return f"read {shown} (grant it with --read {shown})"
    return f"{','.join(access.blockers)} {shown}"
