"""Where code may be mapped under a finite `[commands]` list: a noexec `/usr` and read grants,
with exec-capable binds over them for the system's shared libraries and the granted programs.

Landlock's EXECUTE right is checked at execve only. The ELF loader must be executable (every
dynamic program needs it), and run directly (`/lib64/ld-linux-x86-64.so.2 /usr/bin/x`) it maps
the program it is given with mmap(PROT_EXEC), which Landlock does not check. A noexec mount
does: execve of a file on it fails with EACCES and mmap(PROT_EXEC) with EPERM (the loader says
"failed to map segment"). So under a finite list the sandbox's `/usr` is a read-only noexec
clone (`idmap_mounts.stage_noexec_tree`), read grants are staged noexec (`staging.py`), and
exec-capable read-only clones are mounted over them for exactly:

- the system's shared-library folders under `/usr`, as `/etc/ld.so.cache` names them
  (`ldconfig -p`), and the loader's own folder: the system's own libraries are excepted;
- each granted program under `/usr` (a bind of the file over itself; one in a read grant gets
  an idmapped file bind of its own, `staging.py`);
- what a granted program maps as code besides its libraries (`program_folders`): a granted
  `pythonX.Y` gets its standard library (`lib-dynload`'s C modules) and the system's site
  folders (`/usr/lib/python3/dist-packages`, `/usr/local/lib/pythonX.Y/dist-packages`), because
  a granted interpreter may run any code it likes (it can write machine code to anonymous
  executable memory): its C extensions open nothing its grant did not; a granted `git` gets
  `git-core` (its helpers; Landlock still decides which of them may be execve'd).

With `allow = ["*"]` none of this is made: the exec limit is lifted, `/usr` is bound as it is.
Cost: the controller makes the clone and one mount in it per library folder and per granted
program under /usr (a few syscalls each), and bwrap binds the whole view once, so bwrap's own
work (a parse of the mount table per bind) does not grow with the list.

What this does NOT stop:
- the loader running a file of a library folder as a program (`ld.so .../libc.so.6` prints its
  version, and a helper program a package keeps in a library folder runs): those folders must
  be mappable, and only root writes them;
- a granted interpreter (python, a shell reading a script) running what it likes;
- the box's own prefix (the confiner, the relay, the `lnk` client, the Python packages the box
  runs): it stays exec-capable, as the confiner must be; only root writes it;
- a library a granted program loads from outside the cache's folders (an RPATH into
  `/usr/lib/<package>`, a plugin folder), or kept directly in a `TOO_BROAD` folder
  (`/usr/local/lib` itself: it holds programs too): it fails to map, and the program with it
  (a usability limit, not a way out: grant `allow = ["*"]` for such a program);
- a venv's C extensions in a read grant: the read grant is noexec, so they do not load (grant
  `allow = ["*"]`, or use the system's site folders);
- a granted program outside `/usr` and the grants: it is bound alone, its folder is not seen.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Iterable

from lnk_shared.refusals import inside

__all__ = [
    "SYSTEM_ROOT",
    "TOO_BROAD",
    "exec_binds",
    "library_folders",
    "program_folders",
    "system_exec_binds",
]

SYSTEM_ROOT = "/usr"  # the system folder made noexec (merged-usr: /bin, /lib, ... link into it)
# Folders never made exec-capable whole, even when the cache names them: each holds programs
# the list does not grant (a library kept directly in one of them fails to map).
TOO_BROAD = frozenset(
    {"/usr", "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/libexec", "/usr/local", "/usr/local/lib"}
)
LDCONFIG = "/sbin/ldconfig"  # glibc's, root-owned; `-p` prints the cache, one library a line
LD_SO_CACHE = "/etc/ld.so.cache"  # its identity keys what was read from it
LDCONFIG_TIMEOUT_S = 5.0  # it reads one small file; more means something is wrong
_PYTHON = re.compile(r"python(3\.[0-9]+)")
GIT_CORE = ("/usr/lib/git-core", "/usr/libexec/git-core")  # Debian's, and Fedora's


def program_folders(program: str) -> tuple[str, ...]:
    """Folders a granted program (its real path) maps code from, besides its libraries."""
    name = os.path.basename(program)
    if match := _PYTHON.fullmatch(name):
        version = match.group(1)
        return (
            f"/usr/lib/python{version}",
            "/usr/lib/python3/dist-packages",
            f"/usr/local/lib/python{version}/dist-packages",
        )
    if name == "git":
        return GIT_CORE
    return ()


def library_folders(cache_folders: Iterable[str], loaders: Iterable[str]) -> tuple[str, ...]:
    """The library folders to make exec-capable: those the cache names (real paths) under
    /usr that are not `TOO_BROAD`, and each loader's folder."""
    wanted = {os.path.normpath(f) for f in cache_folders}
    wanted |= {os.path.dirname(os.path.normpath(loader)) for loader in loaders}
    return tuple(sorted(f for f in wanted if inside(f, SYSTEM_ROOT) and f not in TOO_BROAD))


def exec_binds(execute: Iterable[str], libraries: Iterable[str]) -> tuple[str, ...]:
    """Paths under /usr to mount exec-capable in the noexec clone, outer first: the library
    folders, each granted program under /usr and its `program_folders`; a path inside another
    is left out (the outer mount shows it). `/` (any program) is not a path to mount."""
    wanted = set(libraries)
    for program in execute:
        if program == "/" or not inside(program, SYSTEM_ROOT):
            continue
        wanted.add(program)
        wanted.update(f for f in program_folders(program) if inside(f, SYSTEM_ROOT))
    wanted = {os.path.normpath(p) for p in wanted if p not in TOO_BROAD}
    kept = [p for p in wanted if not any(o != p and inside(p, o) for o in wanted)]
    return tuple(sorted(kept, key=lambda p: (p.count("/"), p)))


def _parse_cache(text: str) -> tuple[str, ...]:
    """The real folders of the libraries `ldconfig -p` lists (`name (flags) => path`)."""
    folders = set()
    for line in text.splitlines():
        _, arrow, path = line.partition(" => ")
        if arrow and path.startswith("/"):
            folders.add(os.path.dirname(os.path.realpath(path.strip())))
    return tuple(sorted(folders))


@functools.lru_cache(maxsize=4)
def _cache_folders(_identity: tuple[int, int, int]) -> tuple[str, ...]:
    try:
        done = subprocess.run(
            [LDCONFIG, "-p"],
            capture_output=True,
            check=False,
            env={},
            timeout=LDCONFIG_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    return _parse_cache(done.stdout.decode("utf-8", "replace"))


def system_exec_binds(execute: Iterable[str], loaders: Iterable[str]) -> tuple[str, ...]:
    """`exec_binds` for this machine: the cache's folders (read again when the cache changes)
    and the loaders' real paths; only paths that exist (bwrap cannot bind a missing one)."""
    try:
        info = os.stat(LD_SO_CACHE)
        identity = (info.st_dev, info.st_ino, info.st_mtime_ns)
    except OSError:
        identity = (0, 0, 0)
    real_loaders = [os.path.realpath(p) for p in loaders if os.path.exists(p)]
    libraries = library_folders(_cache_folders(identity), real_loaders)
    return tuple(p for p in exec_binds(execute, libraries) if os.path.exists(p))
