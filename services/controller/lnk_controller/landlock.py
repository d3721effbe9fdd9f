"""Landlock, as the controller sees it: which ABI this kernel offers, before a launch.

The confiner (`lnk_inside/native/lnk_sandbox.c`) applies the rules inside each sandbox and checks
the ABI again there; the controller only probes it, to refuse a launch up front
(`Launcher.preflight`) and to log it at start, naming what is missing.

What Landlock does NOT stop, and so what the rest of the wall must: `mmap(PROT_EXEC)` of a
readable file (the ELF loader, once executable, runs any readable ELF: under a finite list the
noexec mounts of `exec_mounts.py` stop that; an interpreter runs any readable script); `connect()`
to a pathname unix socket it can reach (no right for it before the RESOLVE_UNIX right of a later
ABI: the mount namespace and the confiner's unix-socket block close it); UDP, raw and MPTCP
sockets (the seccomp filter refuses MPTCP); metadata changes (`chmod`, `utimes`, `setxattr`) and
`stat`; descriptors opened before the ruleset (inherited fds keep their rights; device ioctls on
them too); threads other than the caller's (the confiner is single-threaded).
"""

from __future__ import annotations

import ctypes
import errno

from lnk_shared.errors import LaunchRefused

__all__ = ["probe_abi"]

_SYS_CREATE_RULESET = 444  # the same on x86_64 and aarch64 (one numbering since 5.1)
_CREATE_RULESET_VERSION = 1 << 0  # flag: return the ABI version instead of a ruleset


def _errname(number: int) -> str:
    if number == errno.EOPNOTSUPP:
        return "EOPNOTSUPP"  # errorcode says ENOTSUP, the same number; the man page says this
    return errno.errorcode.get(number, f"errno {number}")


def probe_abi() -> int:
    """The kernel's Landlock ABI version; raises `LaunchRefused` if Landlock is unusable."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(
        ctypes.c_long(_SYS_CREATE_RULESET),
        ctypes.c_void_p(None),
        ctypes.c_size_t(0),
        ctypes.c_uint32(_CREATE_RULESET_VERSION),
    )
    if version >= 1:
        return int(version)
    err = ctypes.get_errno()
    hint = {
        errno.ENOSYS: "the kernel is built without Landlock (CONFIG_SECURITY_LANDLOCK)",
        errno.EOPNOTSUPP: "Landlock is disabled at boot: add landlock to the lsm= parameter",
    }.get(err, "the kernel refused the version query")
    raise LaunchRefused("Landlock", f"Landlock is not available: {_errname(err)} ({hint})")
