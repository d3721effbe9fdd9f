"""Looking things up as the caller: this thread's file credentials become the caller's.

Every lookup the controller makes for a caller (resolving a spec's paths and programs, reading
a program's `#!` line, reopening what was judged to bind it) runs inside `caller_credentials`,
which sets the *calling thread's* filesystem uid, gid and supplementary groups to the
caller's, as the kernel saw them on the socket (`SO_PEERCRED`, `SO_PEERGROUPS`), and puts
root's back after. While the fsuid is not 0 the kernel drops the file capabilities
(`CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`, `CAP_FOWNER`, ...) from the thread's effective set,
so a folder the caller cannot search answers `EACCES` exactly as it would to the caller.

Why this, and not a helper process running as the caller or only the client's descriptors:
a helper costs a Python start per launch and a second copy of discovery's answers to trust on
the way back; the client's descriptors cannot say what a path *means* (where its links go),
only what one open found. A thread's fs credentials are three syscalls each way, on the very
thread that judges, and the walk itself is unchanged. `setfsuid`/`setfsgid` are per thread;
`setgroups` is made as a raw syscall because glibc's wrapper changes every thread.

Security limitations: this does NOT
- drop capabilities other than the file ones: `CAP_SYS_PTRACE` stays, so `/proc/PID/...` of
  another user's process would still be readable; discovery answers such a folder as missing
  (`discovery.foreign_process`);
- cover lookups made on another thread, or after the `with` block: keep every lookup for a
  caller inside it, and nothing else (the database, the box's own files) inside it;
- change what a descriptor opened before already reaches.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import pwd
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from lnk_shared.errors import StateError

__all__ = ["CallerCredentials", "caller_credentials", "credentials_of", "peer_credentials"]

# setgroups(2) by number: the same syscall glibc's wrapper makes, on this thread only.
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}
_SO_PEERGROUPS = 59  # socket(7): the peer's supplementary groups as of connect (Linux 4.13)
_NGROUPS_MAX = 65536  # the kernel's limit on supplementary groups
_GID = struct.Struct("I")
_NO_ID = -1  # setfsuid(-1) changes nothing and returns the current fsuid


@dataclass(frozen=True)
class CallerCredentials:
    uid: int
    gid: int
    groups: tuple[int, ...]


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.setfsuid.argtypes = (ctypes.c_int,)
    libc.setfsgid.argtypes = (ctypes.c_int,)
    return libc


def peer_credentials(sock: socket.socket, uid: int, gid: int) -> CallerCredentials:
    """The caller's groups as the kernel recorded them at connect, with its uid and gid."""
    size = _GID.size * 64
    while True:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, size)
            break
        except OSError as exc:
            if (
                exc.errno != errno.ERANGE or size >= _GID.size * _NGROUPS_MAX
            ):  # the buffer was too small
                raise StateError(f"cannot read the caller's groups: {exc.strerror}") from exc
            size *= 4
    groups = tuple(g for (g,) in _GID.iter_unpack(raw[: len(raw) - len(raw) % _GID.size]))
    return CallerCredentials(uid, gid, groups)


def credentials_of(uid: int) -> CallerCredentials:
    """A user's credentials from the password and group databases (for a caller known only by
    its uid); `StateError` if the uid has no entry."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        raise StateError(f"uid {uid} has no entry in the password database") from None
    return CallerCredentials(uid, entry.pw_gid, tuple(os.getgrouplist(entry.pw_name, entry.pw_gid)))


def _setgroups(groups: tuple[int, ...]) -> None:
    number = _SYS_SETGROUPS.get(os.uname().machine)
    if number is None:
        raise StateError(f"no setgroups syscall number for {os.uname().machine}")
    array = (ctypes.c_uint * max(1, len(groups)))(*groups)
    ctypes.set_errno(0)
    if _libc().syscall(ctypes.c_long(number), ctypes.c_long(len(groups)), array) != 0:
        err = ctypes.get_errno()
        raise StateError(f"cannot set this thread's groups: {os.strerror(err)}")


def _set_fs_ids(uid: int, gid: int) -> None:
    libc = _libc()
    libc.setfsgid(gid)
    libc.setfsuid(uid)
    if libc.setfsgid(_NO_ID) != gid or libc.setfsuid(_NO_ID) != uid:
        raise StateError(f"this thread's file ids did not become {uid}:{gid}")


@contextlib.contextmanager
def caller_credentials(caller: CallerCredentials) -> Iterator[None]:
    """Run the block with this thread's file access checked as `caller`'s."""
    libc = _libc()
    own_uid, own_gid = libc.setfsuid(_NO_ID), libc.setfsgid(_NO_ID)
    own_groups = tuple(os.getgroups())  # this thread's
    try:
        _setgroups(caller.groups)
        _set_fs_ids(caller.uid, caller.gid)
        yield
    finally:
        # The own ids first: fsuid 0 gives back the file capabilities.
        _set_fs_ids(own_uid, own_gid)
        _setgroups(own_groups)
