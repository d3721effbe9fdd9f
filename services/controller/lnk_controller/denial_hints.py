"""A Landlock denial said as a person reads it, with the grant that would allow it.

`explain(access, home)` turns one parsed record (denial_records.Access) into one line:

    run /usr/bin/echo (grant it with --command echo)
    write ~/x/y (grant it with --write ~/x)
    read ~/notes.txt (grant it with --read ~/notes.txt)
    connect 10.0.0.5:443 (the sandbox reaches the network through the box's proxy: ...)

and never suggests a grant the box refuses anyway: a write under a system folder, a protected
name at the top of a write grant (protected_names.py) or the user's own lnk settings is said to
be refused by rule instead. Pure: the caller escapes the line when it shows it (the path is the
sandbox's choice) and cuts it.

Does NOT: know the spec the sandbox ran with (a denial of something the spec grants is not
possible: Landlock allowed it), or follow links (the kernel logs the path it resolved).
"""

from __future__ import annotations

import posixpath

from lnk_controller.denial_records import Access
from lnk_shared.paths import PROJECT_RUN_DOT_ENTRIES, SYSTEM_DIRS, USER_SETTINGS_DIR

__all__ = ["explain", "key"]

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


def _refused_write(folder: str, path: str, home: str | None) -> str | None:
    for system in SYSTEM_DIRS:
        if _under(folder, system):
            return f"{system} is a system folder, which no sandbox may write"
    if home and _under(path, posixpath.join(home, USER_SETTINGS_DIR)):
        return "lnk's own settings are never granted"
    if home and folder.rstrip("/") == home.rstrip("/"):
        return None
    name = posixpath.basename(path)
    for entry in PROJECT_RUN_DOT_ENTRIES:
        if entry.split("/", 1)[0] == name or path.endswith("/" + entry):
            return f"{entry} stays read-only in every write grant (tools outside run it)"
    return None


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


def explain(access: Access, home: str | None) -> str:
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
        what = ",".join(access.blockers)
        return f"{what} (refused by rule: signals and abstract sockets stay inside the sandbox)"
    shown = _tilde(path, home)
    if "fs.execute" in blockers:
        return _run(path, home)
    if "fs.ioctl_dev" in blockers:
        return f"use device {shown} (refused by rule: device commands are not granted)"
    if blockers & (_IN_FOLDER | _ON_FILE):
        folder = path if blockers & _IN_FOLDER else posixpath.dirname(path) or "/"
        refused = _refused_write(folder, path, home)
        if refused is not None:
            return f"write {shown} (refused by rule: {refused})"
        return f"write {shown} (grant it with --write {_tilde(folder, home)})"
    if blockers & _READS:
        if home and _under(path, posixpath.join(home, USER_SETTINGS_DIR)):
            return f"read {shown} (refused by rule: lnk's own settings are never granted)"
        return f"read {shown} (grant it with --read {shown})"
    return f"{','.join(access.blockers)} {shown}"
