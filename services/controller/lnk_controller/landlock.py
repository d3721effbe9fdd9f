"""Landlock for the confiner: filesystem, TCP and IPC-scope rules, applied before the target runs.

Trusts: the kernel, and the policy it is given (built by the controller from a checked spec).
Paths are opened as the confiner sees them inside the sandbox's mount namespace, following
symlinks, before any untrusted code has run; keeping planted links out of grants is the
controller's link rule, not this module's job.

What it does: `apply` creates a ruleset that handles every filesystem right the kernel's ABI
knows, so anything not granted is denied (execute anywhere else, device ioctls on ABI >= 5,
cross-folder rename and link on ABI >= 2, truncate on ABI >= 3); adds one rule per granted path;
adds TCP port rules and IPC scopes when the policy asks; then restricts the calling thread and
everything it starts. Any failure raises `LaunchRefused` naming the path or capability and the
errno: the confiner never goes on unconfined, and a policy needing a feature the kernel lacks
is refused, never silently weakened.

Security limitations: Landlock does NOT stop
- `mmap(PROT_EXEC)` of a readable file: the ELF loader, once granted EXECUTE (every dynamic
  `[commands]` entry needs it), runs any readable ELF as `ld.so /path/to/elf`; likewise any
  granted interpreter runs any readable script. EXECUTE decides which files `execve` may start,
  not which code runs;
- `connect()`/`sendmsg()` to a pathname unix socket it can reach (no such right before the
  `LANDLOCK_ACCESS_FS_RESOLVE_UNIX` right of a later ABI): the mount namespace must not show
  other programs' sockets;
- UDP, raw or MPTCP sockets: TCP rules cover `IPPROTO_TCP` only (MPTCP is closed by the
  seccomp filter, see `seccomp.py`); SCTP is not built into this kernel;
- metadata changes (`chmod`, `chown`, `utimes`, `setxattr`) on files it can reach, `stat`, and
  operations on file descriptors opened before `apply` (inherited fds keep their rights);
- ioctls on device files opened before `apply` (the terminal passed in stays usable);
- anything on a thread other than the caller's: `apply` refuses unless the process has one.

The caller must know: a dynamic binary in `execute` also needs its ELF interpreter there (the
kernel opens it for exec, and Landlock checks EXECUTE on it); an execute grant carries
READ_FILE, since exec reads the file; device files (`/dev/null`) need a read or write grant
like any file, and their ioctls stay denied. `apply` sets no_new_privs; the ruleset survives
execve and binds every child.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from lnk_shared.errors import LaunchRefused

__all__ = ["ABI_NET", "ABI_SCOPES", "LandlockPolicy", "apply", "handled_fs", "probe_abi"]

# Syscall numbers: the same on x86_64 and aarch64 (new syscalls share one numbering since 5.1).
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446

_CREATE_RULESET_VERSION = 1 << 0  # flag: return the ABI version instead of a ruleset
_RULE_PATH_BENEATH = 1  # rule type: a file hierarchy
_RULE_NET_PORT = 2  # rule type: a TCP port
_PR_SET_NO_NEW_PRIVS = 38  # prctl option: required to restrict self without CAP_SYS_ADMIN

# Filesystem rights (include/uapi/linux/landlock.h).
FS_EXECUTE = 1 << 0  # execve() the file (and be its ELF interpreter)
FS_WRITE_FILE = 1 << 1  # open a file for writing
FS_READ_FILE = 1 << 2  # open a file for reading
FS_READ_DIR = 1 << 3  # list a directory
FS_REMOVE_DIR = 1 << 4  # rmdir, or rename a directory away
FS_REMOVE_FILE = 1 << 5  # unlink, or rename a file away
FS_MAKE_CHAR = 1 << 6  # mknod a character device
FS_MAKE_DIR = 1 << 7  # mkdir
FS_MAKE_REG = 1 << 8  # create a regular file
FS_MAKE_SOCK = 1 << 9  # bind a pathname unix socket (creates the socket file)
FS_MAKE_FIFO = 1 << 10  # mkfifo
FS_MAKE_BLOCK = 1 << 11  # mknod a block device
FS_MAKE_SYM = 1 << 12  # symlink
FS_REFER = 1 << 13  # ABI 2: rename or link a file into another hierarchy
FS_TRUNCATE = 1 << 14  # ABI 3: truncate, O_TRUNC
FS_IOCTL_DEV = 1 << 15  # ABI 5: ioctl on a device file

NET_BIND_TCP = 1 << 0  # ABI 4: bind a TCP socket to a port
NET_CONNECT_TCP = 1 << 1  # ABI 4: connect a TCP socket to a port

SCOPE_ABSTRACT_UNIX = 1 << 0  # ABI 6: no connect to abstract sockets made outside the domain
SCOPE_SIGNAL = 1 << 1  # ABI 6: no signals to processes outside the domain

ABI_REFER = 2  # first ABI with FS_REFER
ABI_TRUNCATE = 3  # first ABI with FS_TRUNCATE
ABI_NET = 4  # first ABI with TCP bind/connect rules
ABI_IOCTL_DEV = 5  # first ABI with FS_IOCTL_DEV
ABI_SCOPES = 6  # first ABI with abstract-unix and signal scopes

_MAX_PORT = 65535  # TCP ports are 16-bit

# Rights Landlock accepts on a rule for a non-directory (others are EINVAL there).
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
_READ = FS_READ_FILE | FS_READ_DIR
_WRITE = (
    _READ
    | FS_WRITE_FILE
    | FS_REMOVE_DIR
    | FS_REMOVE_FILE
    | FS_MAKE_DIR
    | FS_MAKE_REG
    | FS_MAKE_SYM
    | FS_REFER
    | FS_TRUNCATE
)
# execve also opens the file for reading, so an execute grant carries READ_FILE (not READ_DIR).
_EXECUTE = FS_EXECUTE | FS_READ_FILE


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel struct is __attribute__((packed)): 12 bytes
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class _NetPortAttr(ctypes.Structure):
    _fields_ = (("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64))


class LandlockPolicy:
    """What the sandbox may touch. Empty tuples grant nothing; `None` ports = not restricted.

    A plain class, not a dataclass: the confiner imports this at every sandbox start, and
    `dataclasses` (with `inspect`) costs more to import than the rest of the confiner.
    """

    __slots__ = (
        "execute",
        "min_abi",
        "read",
        "scope_abstract_unix",
        "scope_signal",
        "tcp_bind",
        "tcp_connect",
        "write",
    )

    def __init__(
        self,
        *,
        read: tuple[str, ...],
        write: tuple[str, ...],
        execute: tuple[str, ...],
        tcp_connect: tuple[int, ...] | None,
        tcp_bind: tuple[int, ...] | None,
        scope_abstract_unix: bool,
        scope_signal: bool,
        min_abi: int,
    ) -> None:
        self.read = read
        self.write = write
        self.execute = execute
        self.tcp_connect = tcp_connect
        self.tcp_bind = tcp_bind
        self.scope_abstract_unix = scope_abstract_unix
        self.scope_signal = scope_signal
        self.min_abi = min_abi
        self._check()

    def __setattr__(self, name: str, value: object) -> None:
        if hasattr(self, name):
            raise AttributeError(f"LandlockPolicy is immutable: cannot set {name}")
        object.__setattr__(self, name, value)

    def _check(self) -> None:
        for name in ("read", "write", "execute", "tcp_connect", "tcp_bind"):
            value = getattr(self, name)
            if not isinstance(value, tuple) and not (name.startswith("tcp") and value is None):
                raise LaunchRefused("landlock policy", f"{name} must be a tuple, not {value!r}")
        for path in (*self.read, *self.write, *self.execute):
            if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
                raise LaunchRefused("landlock policy", f"path {path!r} is not absolute or has NUL")
        for port in (*(self.tcp_connect or ()), *(self.tcp_bind or ())):
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= _MAX_PORT:
                raise LaunchRefused("landlock policy", f"port {port!r} is not 0-{_MAX_PORT}")
        if self.min_abi < 1:
            raise LaunchRefused("landlock policy", f"min_abi {self.min_abi} is below 1")

    @property
    def needs_net(self) -> bool:
        return self.tcp_connect is not None or self.tcp_bind is not None

    @property
    def needs_scopes(self) -> bool:
        return self.scope_abstract_unix or self.scope_signal


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int
    return libc


def _errname(number: int) -> str:
    if number == errno.EOPNOTSUPP:
        return "EOPNOTSUPP"  # errorcode says ENOTSUP, the same number; the man page says this
    return errno.errorcode.get(number, f"errno {number}")


def probe_abi() -> int:
    """The kernel's Landlock ABI version; raises `LaunchRefused` if Landlock is unusable."""
    libc = _libc()
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


def handled_fs(abi: int) -> int:
    """Every filesystem right the ABI knows: all of them are denied unless a rule grants them."""
    rights = (1 << 13) - 1  # ABI 1: EXECUTE .. MAKE_SYM
    if abi >= ABI_REFER:
        rights |= FS_REFER
    if abi >= ABI_TRUNCATE:
        rights |= FS_TRUNCATE
    if abi >= ABI_IOCTL_DEV:
        rights |= FS_IOCTL_DEV
    return rights


def _check_abi(policy: LandlockPolicy, abi: int) -> None:
    if abi < policy.min_abi:
        raise LaunchRefused(
            "Landlock", f"Landlock ABI {policy.min_abi} (policy minimum) needed, kernel has {abi}"
        )
    if policy.needs_net and abi < ABI_NET:
        raise LaunchRefused(
            "Landlock", f"Landlock ABI {ABI_NET} (TCP rules) needed, kernel has {abi}"
        )
    if policy.needs_scopes and abi < ABI_SCOPES:
        raise LaunchRefused(
            "Landlock",
            f"Landlock ABI {ABI_SCOPES} (abstract unix socket and signal scopes) needed, "
            f"kernel has {abi}",
        )


def _check_single_threaded() -> None:
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError as exc:
        raise LaunchRefused(
            "Landlock", f"cannot count threads in /proc/self/task: {_errname(exc.errno or 0)}"
        ) from exc
    if threads != 1:
        raise LaunchRefused(
            "Landlock", f"the confiner has {threads} threads; Landlock binds only the caller's"
        )


def _add_path_rule(libc: ctypes.CDLL, ruleset_fd: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise LaunchRefused(
            "Landlock", f"cannot open grant {path}: {_errname(exc.errno or 0)}"
        ) from exc
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= _FILE_RIGHTS
        attr = _PathBeneathAttr(allowed_access=access, parent_fd=fd)
        _add_rule(libc, ruleset_fd, _RULE_PATH_BENEATH, ctypes.byref(attr), f"path {path}")
    finally:
        os.close(fd)


def _add_rule(libc: ctypes.CDLL, ruleset_fd: int, kind: int, attr: object, what: str) -> None:
    rc = libc.syscall(
        ctypes.c_long(_SYS_ADD_RULE),
        ctypes.c_int(ruleset_fd),
        ctypes.c_int(kind),
        attr,
        ctypes.c_uint32(0),
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise LaunchRefused("Landlock", f"cannot add the rule for {what}: {_errname(err)}")


def apply(policy: LandlockPolicy, *, pretend_abi: int | None = None) -> None:
    """Restrict this process and its future children to `policy`; raise rather than go on.

    `pretend_abi` (tests only) acts as if the kernel had that older ABI; it can only narrow.
    """
    abi = probe_abi()
    if pretend_abi is not None:
        if pretend_abi > abi:
            raise LaunchRefused("Landlock", f"cannot pretend ABI {pretend_abi} above {abi}")
        abi = pretend_abi
    _check_abi(policy, abi)
    _check_single_threaded()
    fs = handled_fs(abi)
    net = 0
    if policy.tcp_connect is not None:
        net |= NET_CONNECT_TCP
    if policy.tcp_bind is not None:
        net |= NET_BIND_TCP
    scoped = (SCOPE_ABSTRACT_UNIX if policy.scope_abstract_unix else 0) | (
        SCOPE_SIGNAL if policy.scope_signal else 0
    )
    libc = _libc()
    attr = _RulesetAttr(handled_access_fs=fs, handled_access_net=net, scoped=scoped)
    ruleset_fd = libc.syscall(
        ctypes.c_long(_SYS_CREATE_RULESET),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
        ctypes.c_uint32(0),
    )
    if ruleset_fd < 0:
        err = ctypes.get_errno()
        raise LaunchRefused("Landlock", f"cannot create a ruleset: {_errname(err)}")
    try:
        for paths, access in (
            (policy.read, _READ),
            (policy.write, _WRITE),
            (policy.execute, _EXECUTE),
        ):
            for path in paths:
                _add_path_rule(libc, ruleset_fd, path, access & fs)
        for ports, right in (
            (policy.tcp_connect, NET_CONNECT_TCP),
            (policy.tcp_bind, NET_BIND_TCP),
        ):
            for port in ports or ():
                port_attr = _NetPortAttr(allowed_access=right, port=port)
                _add_rule(libc, ruleset_fd, _RULE_NET_PORT, ctypes.byref(port_attr), f"port {port}")
        one, zero = ctypes.c_ulong(1), ctypes.c_ulong(0)
        if libc.prctl(ctypes.c_int(_PR_SET_NO_NEW_PRIVS), one, zero, zero, zero) != 0:
            err = ctypes.get_errno()
            raise LaunchRefused("Landlock", f"cannot set no_new_privs: {_errname(err)}")
        if libc.syscall(
            ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(ruleset_fd), ctypes.c_uint32(0)
        ):
            err = ctypes.get_errno()
            raise LaunchRefused("Landlock", f"cannot restrict self: {_errname(err)}")
    finally:
        os.close(ruleset_fd)
