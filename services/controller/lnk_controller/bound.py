"""Opening what was judged, to bind it: the same object, or a refusal naming the path.

Discovery recorded, for every folder and program it judged, the object its walk ended on
(device, inode, type). Before anything of the sandbox exists (no record, user, mount or staging
folder), each one is opened again by its real path *without following any link*
(`openat2` with `RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`: the real path has none, so a
link swapped in anywhere on it fails the open) as the owner, and what opened is compared with
the judged identity, never with a fresh lookup. The client's own descriptor for it (opened as
the owner, following links) must be that object too. A `--with-fd` descriptor is bound itself,
after the same comparison. Any difference refuses the launch: "~/work/out changed after it was
judged: run again". What is bound is the descriptor opened here, so nothing is looked up by path
after the comparison.

Security limitations: this does NOT
- keep the *contents* of a judged folder or program from changing: whoever may write them
  outside still may (a folder is granted as a place; a program's bytes are the owner's);
- stop a rename of the judged object itself to elsewhere after it was opened here: the mount
  follows the object, which is what was judged and shown;
- apply to paths the wall binds that no spec names (the system's, the box's own).
`unsafe_skip_identity_check` (test boxes only; logs a warning) opens by path following links
and compares nothing, as the box did before: `lnk sandbox check` and the racing tests show the
leak it reopens.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lnk_shared.discovery import JudgeContext
from lnk_shared.errors import LaunchRefused
from lnk_shared.grants import Identity, ResolvedPath

__all__ = [
    "JudgedObject",
    "changed",
    "close_all",
    "identity_of",
    "judged_identities",
    "open_judged",
    "open_no_links",
    "same_spec",
]

log = logging.getLogger(__name__)

_SYS_OPENAT2 = 437  # the same on x86_64 and aarch64 (Linux 5.6)
_AT_FDCWD = -100  # an absolute path: the current folder plays no part
_RESOLVE_NO_MAGICLINKS = 0x02  # no /proc/PID/fd/N-style jumps
_RESOLVE_NO_SYMLINKS = 0x04  # no link at all, anywhere on the path
# A handle, as discovery's walk held. No O_NOFOLLOW: with it O_PATH opens a final link itself;
# without it RESOLVE_NO_SYMLINKS refuses a link there too (ELOOP).
_OPEN_FLAGS = os.O_PATH | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    """struct open_how (include/uapi/linux/openat2.h)."""

    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


@dataclass(frozen=True)
class JudgedObject:
    """One thing to bind: its real path, the identity judged there, and, for a `--with-fd`
    grant, the descriptor passed (bound itself rather than reopened)."""

    real: str
    identity: Identity | None
    passed_fd: int | None = None


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def identity_of(fd: int) -> Identity:
    info = os.fstat(fd)
    return Identity(info.st_dev, info.st_ino, stat.S_IFMT(info.st_mode))


def open_no_links(path: str) -> int:
    """An O_PATH descriptor of `path`, refused (OSError ELOOP/ENOENT/...) if a link is met."""
    how = _OpenHow(_OPEN_FLAGS, 0, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    ctypes.set_errno(0)
    fd = int(
        _libc().syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_long(_AT_FDCWD),
            ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def changed(real: str, home: str) -> LaunchRefused:
    """The refusal for an object that is not the one judged (named as the owner sees it)."""
    shown = "~" + real[len(home) :] if home != "/" and (real + "/").startswith(home + "/") else real
    return LaunchRefused(shown, "it changed after it was judged: run again")


def judged_identities(
    folders: Iterable[ResolvedPath], programs: Iterable[ResolvedPath], home: str
) -> dict[str, Identity]:
    """Real path -> the object judged there. One path judged twice as two objects (swapped
    while it was being judged) is refused; one judged without an identity is left out, so
    binding it is refused."""
    out: dict[str, Identity] = {}
    for path in (*folders, *programs):
        if path.identity is None:
            continue
        if out.setdefault(path.real, path.identity) != path.identity:
            raise changed(path.real, home)
    return out


def same_spec(spec_fd: int, ctx: JudgeContext) -> None:
    """The spec read (the client's descriptor) must be the file at the path judged, shown and
    remembered as its source, and whose folder the rules kept from being written."""
    if ctx.spec_file is None:
        return
    if ctx.spec_identity is None or identity_of(spec_fd) != ctx.spec_identity:
        raise changed(ctx.spec_file, ctx.home)


def _open_unchecked(real: str) -> int:
    return os.open(real, os.O_PATH | os.O_CLOEXEC)  # follows links: the unsafe, old way


def open_judged(
    objects: Iterable[JudgedObject],
    client_fds: Mapping[str, int],
    *,
    home: str,
    unsafe_skip_identity_check: bool = False,
) -> dict[str, int]:
    """A descriptor for each object, opened without links and checked against its judged
    identity (and the client's descriptor for it); real path -> fd. Raises the refusal for the
    first that differs, closing what it opened. Run it as the owner (`caller_credentials`)."""
    opened: dict[str, int] = {}
    try:
        for obj in objects:
            if obj.real in opened:
                continue
            if obj.passed_fd is not None:
                fd = os.dup(obj.passed_fd)
            elif unsafe_skip_identity_check:
                log.warning("unsafe_skip_identity_check: %s bound without comparing", obj.real)
                fd = _open_unchecked(obj.real)
            else:
                try:
                    fd = open_no_links(obj.real)
                except OSError:
                    raise changed(obj.real, home) from None
            opened[obj.real] = fd
            if unsafe_skip_identity_check:
                continue
            seen = identity_of(fd)
            client = client_fds.get(obj.real)
            if client is None and obj.passed_fd is None:
                raise LaunchRefused(
                    obj.real, "the client did not pass it open: cannot check you may reach it"
                )
            if obj.identity is None or seen != obj.identity:
                raise changed(obj.real, home)
            if client is not None and identity_of(client) != obj.identity:
                raise changed(obj.real, home)
    except BaseException:
        close_all(opened)
        raise
    return opened


def close_all(opened: Mapping[str, int]) -> None:
    for fd in opened.values():
        os.close(fd)
