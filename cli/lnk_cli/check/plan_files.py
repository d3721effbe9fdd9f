"""The plan's probes of files and folders: the bait files read, the home and its startup files
written, each write folder's top-level dot entries (the names the wall reserves) and a dot entry
below the top (a known gap), read-only folders written, each granted object checked to be the
one judged, the confiner's folder, and the box's placeholders as git sees them."""

from __future__ import annotations

import os

from lnk_cli.check.probe import (
    ALLOWED,
    KNOWN_GAP,
    REFUSED,
    Evidence,
    PlanContext,
    Probe,
    expect,
    read_folders,
    write_folders,
)
from lnk_shared.paths import PROJECT_RUN_DOT_ENTRIES
from lnk_shared.refusals import inside

__all__ = [
    "confiner_probe",
    "file_probes",
    "folder_state",
    "identity_probes",
    "placeholder_probes",
    "write_probes",
]

HOME_RC_FILES = (".bashrc", ".profile", ".bash_profile", ".zshrc", ".bash_login")
# Dot entries that are folders when they exist (as the wall makes their stand-ins): a missing
# one is made as a folder holding a new file, like a hook would be.
DOT_FOLDERS = frozenset(
    {"hooks", ".direnv", ".github", ".husky", ".idea", ".devcontainer", ".vscode"}
)


def file_probes(c: PlanContext) -> None:
    home = c.bait.home
    for bait in c.bait.files:
        shown = bait.path.replace(home, "~", 1) if bait.path.startswith(home + "/") else bait.path
        c.add(
            Probe(
                bait.id,
                f"read {shown}",
                expect(c.visible(bait.path)),
                {"kind": "read", "path": bait.path},
                (Evidence("secret", bait.secret),),
            )
        )
    c.add(
        Probe(
            "list.ssh",
            "list ~/.ssh",
            expect(c.visible(c.bait.ssh_dir)),
            {"kind": "list", "path": c.bait.ssh_dir},
            (Evidence("names", names=tuple(c.bait.ssh_names)),),
        )
    )


def _write_or_create(c: PlanContext, ident: str, tried: str, path: str, expected: str) -> None:
    """Open an existing file for writing (its mtime marked), or create what is missing (with
    each missing folder on the way): both are seen outside."""
    if os.path.lexists(path) and not os.path.isdir(path):
        info = os.lstat(path)
        c.add(
            Probe(
                ident,
                tried,
                expected,
                {"kind": "open_write", "path": path},
                (Evidence("marked", (info.st_atime_ns, info.st_mtime_ns), path=path),),
            )
        )
        return
    folder = os.path.isdir(path) or (
        not os.path.lexists(path) and os.path.basename(path) in DOT_FOLDERS
    )
    target = os.path.join(path, c.name()) if folder else path
    missing: list[str] = []
    walk = os.path.dirname(target)
    while not os.path.lexists(walk):
        missing.append(walk)
        walk = os.path.dirname(walk)
    outermost = missing[-1] if missing else target
    c.add(
        Probe(
            ident,
            tried,
            expected,
            {"kind": "create", "path": target, "dirs": list(reversed(missing)), "content": c.nonce},
            (Evidence("created", path=outermost),),
            leftovers=(outermost,),
        )
    )


def placeholder_probes(c: PlanContext) -> None:
    """Before anything is written: the names the box reserves at the top of each write folder
    must not show to git (a file or a link is listed and committed; an empty folder is not)."""
    top = sorted({entry.split("/")[0] for entry in PROJECT_RUN_DOT_ENTRIES})
    for folder in write_folders(c.grants):
        missing = [n for n in top if not os.path.lexists(os.path.join(folder, n))]
        c.add(
            Probe(
                f"placeholder.git:{folder}",
                f"see the box's placeholders in {folder} as git does (git status, git add -A)",
                REFUSED,
                {"kind": "git_visible", "path": folder, "names": missing},
                (Evidence("inside"),),
            )
        )


def write_probes(c: PlanContext) -> None:
    home = c.bait.home
    _write_or_create(
        c, "write.home", "write a new file in ~", os.path.join(home, c.name()), REFUSED
    )
    for rc in HOME_RC_FILES:
        _write_or_create(c, f"write.home:~/{rc}", f"write ~/{rc}", os.path.join(home, rc), REFUSED)
    for folder in write_folders(c.grants):
        _write_or_create(
            c, f"write.folder:{folder}", f"write a new file in {folder}", folder, ALLOWED
        )
        for entry in PROJECT_RUN_DOT_ENTRIES:
            path = os.path.join(folder, entry)
            _write_or_create(c, f"write.dot:{path}", f"write {path}", path, REFUSED)
        deep = os.path.join(folder, c.name(), ".envrc")
        tried = f"write a .envrc below the top of {folder}"
        _write_or_create(c, f"write.deep-dot:{folder}", tried, deep, KNOWN_GAP)
    writable = write_folders(c.grants)
    for folder in read_folders(c.grants):  # granted for reading only: a write must fail
        if folder == home or any(inside(folder, w) for w in writable):
            continue  # the home is probed above; inside a write grant, writing is granted
        ident, tried = f"write.read-folder:{folder}", f"write a new file in {folder} (read only)"
        _write_or_create(c, ident, tried, folder, REFUSED)


def confiner_probe(c: PlanContext, confiner_dir: str) -> None:
    file = os.path.join(confiner_dir, "lnk-sandbox")
    c.add(
        Probe(
            "confiner",
            f"write into {confiner_dir} or beside it",
            REFUSED,
            {"kind": "confiner", "dir": confiner_dir, "file": file, "name": c.name()},
            (Evidence("confiner", folder_state(confiner_dir, file), path=confiner_dir),),
        )
    )


def folder_state(folder: str, file: str) -> list[object]:
    """What replacing the folder or writing the confiner would change outside: the folder's
    and its parent's identity, the confiner's identity, time and size. (Not the folders'
    times: installing anything into the box changes those.)"""
    state: list[object] = []
    for path, whole in ((folder, False), (file, True), (os.path.dirname(folder), False)):
        try:
            info = os.lstat(path)
        except OSError as exc:
            state.append(exc.strerror)
            continue
        ident = [info.st_dev, info.st_ino]
        state.append([*ident, info.st_mtime_ns, info.st_size] if whole else ident)
    return state


def identity_probes(c: PlanContext) -> None:
    """Each granted folder or file: what the sandbox finds bound there must be the very object
    judged (device, inode, type), not whatever a swap after judging put at its path."""
    spec = c.grants.spec
    granted = [(p, "read") for p in spec.read] + [(p, "write") for p in spec.write]
    granted += [(f.path, f"--with-fd {f.fd}") for f in spec.with_fds]
    seen: set[str] = set()
    for n, (path, how) in enumerate(granted):
        if path.identity is None or path.real in seen:
            continue
        seen.add(path.real)
        judged = [path.identity.dev, path.identity.ino, path.identity.kind]
        c.add(
            Probe(
                f"identity-{n}",
                f"find another object than the one judged bound at {path.real} ({how})",
                REFUSED,
                {"kind": "identity", "path": path.real},
                (Evidence("identity", judged, path.real),),
            )
        )
