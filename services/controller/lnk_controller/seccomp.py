"""The confiner's seccomp filter: a deny-list over syscalls the sandbox has no use for.

Trusts: the kernel, and `libseccomp.so.2` (loaded through ctypes) to compile the rules below
into BPF faithfully for the native architecture.

What it does: the controller compiles the rules to BPF here, once per process (`programs`), and
writes them into the confiner's policy; the confiner (`lnk_inside/native/lnk_sandbox.c`) only loads
them, after no_new_privs and Landlock, so it needs neither libseccomp nor Python inside the sandbox.
The first program (`compile_filter`) has the default ALLOW and makes each call in
`DENIED_SYSCALLS` fail (EPERM unless noted) before the kernel acts on it: kernel keyrings, BPF,
perf, userfaultfd, ptrace and cross-process memory access, taking or comparing another
process's descriptors (`pidfd_getfd`, `kcmp`), new namespaces (`unshare`, `setns`,
`clone` with any `CLONE_NEW*` flag), every mount call, io_uring (its ring runs syscalls the
filter never sees), personality changes, module and kexec loading, swap, reboot, accounting,
quotas, file handles, chroot, the kernel log, `TIOCSTI`/`TIOCLINUX` (typing into a terminal),
vsock sockets (a way to the hypervisor) and MPTCP sockets (which Landlock's TCP rules do not
cover). `clone3` fails with ENOSYS so libc falls back to `clone`, whose flags a filter can see
(clone3 keeps them in memory). Syscalls of any other ABI (i386 via `int 0x80`, x32 on x86_64,
32-bit arm on aarch64) kill the process: no rule here was written for their numbers.
`modify_ldt` and `memfd_secret` are refused too, and so are the calls that would leave a
set-id, group- or other-writable file or an ACL in a write grant (`seccomp_modes`: the chmod
family, creating calls with set-id modes, `openat2` with ENOSYS, every xattr write). Syscalls
newer than the installed libseccomp are named by number (`_BY_NUMBER`). The second program,
stacked last, blocks unix sockets and, on the host's network, listening and datagram sockets
(`seccomp_host_net`).

Security limitations: it does NOT stop
- anything not listed: it is a deny-list; the wall is Landlock plus the namespaces bwrap made;
- what a syscall does with memory it points at (a filter cannot read pointers): only the
  register arguments named above are checked;
- `personality(PER_LINUX)` and the `0xffffffff` query, which stay allowed for libc;
- syscalls newer than both libseccomp and `_BY_NUMBER`: a kernel upgrade needs a look here;
- `memfd_create` + `execve("/proc/self/fd/N")` (lnk-spawn's vm.memfd_noexec=2 stops that),
  `mmap(PROT_EXEC)`, UDP outside host mode, raw sockets (they need
  CAP_NET_RAW, which bwrap drops) and netlink (iproute needs it).

The caller must know: the loader must set no_new_privs first and be single-threaded (the
confiner is; the programs are loaded without TSYNC); a loaded filter stays in force across
execve and fork. The programs are for the controller's own architecture, which is the
sandbox's: both run on this machine's kernel.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os

from lnk_controller import seccomp_host_net, seccomp_modes
from lnk_shared.errors import LaunchRefused

__all__ = [
    "ALLOW_PREFIX",
    "BLANKET_NAMES",
    "DENIED_SYSCALLS",
    "SUPPORTED_MACHINES",
    "UNSAFE_RELAXATIONS",
    "compile_filter",
    "compile_unix_block",
    "programs",
]

LIBSECCOMP = "libseccomp.so.2"  # the soname Debian's libseccomp2 ships

# Machines we wrote and tested the rules for, with the AUDIT_ARCH that libseccomp reports.
SUPPORTED_MACHINES = {
    "x86_64": 0xC000003E,  # AUDIT_ARCH_X86_64
    "aarch64": 0xC00000B7,  # AUDIT_ARCH_AARCH64
}

# libseccomp actions and attributes (seccomp.h).
_ACT_ALLOW = 0x7FFF0000  # SCMP_ACT_ALLOW: the default, this is a deny-list
_ACT_KILL_PROCESS = 0x80000000  # SCMP_ACT_KILL_PROCESS: for syscalls of a foreign ABI
_ACT_ERRNO = 0x00050000  # SCMP_ACT_ERRNO(e) = this | e: fail the call with errno e
_FLTATR_ACT_BADARCH = 2  # attribute: action for a syscall from an architecture not in the filter
_CMP_MASKED_EQ = 7  # SCMP_CMP_MASKED_EQ: (argument & datum_a) == datum_b

_NR_SCMP_ERROR = -1  # seccomp_syscall_resolve_name: no syscall of that name at all
# Syscalls newer than Debian's libseccomp (2.5.4), which cannot name them, by their number in
# the generic table (the same on x86_64 and aarch64): a deny-list must not miss them.
_BY_NUMBER = {**seccomp_modes.BY_NUMBER, "open_tree_attr": 467}
# The `unsafe_…` controller switches that turn a group of rules off (tests of `check` only).
UNSAFE_RELAXATIONS = frozenset({"set_id_modes", "shared_modes", "host_listen"})
# A relaxation naming one row of _BLANKET to leave out ("allow:keyctl"): config's
# unsafe_allow_syscalls, one for each call named there.
ALLOW_PREFIX = "allow:"
_LOW32 = 0xFFFFFFFF  # the kernel reads int/unsigned-int arguments from the low 32 bits only

# clone() flags that make a namespace: CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID,
# NEWNET (together 0x7E020000) and CLONE_NEWTIME (0x80). One rule per bit: rules are OR-ed.
_CLONE_NEW_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x00000080,  # CLONE_NEWTIME
)
_TIOCSTI = 0x5412  # ioctl: push a byte into the terminal's input, as if typed
_TIOCLINUX = 0x541C  # ioctl: console tricks, including pasting the selection as input
_AF_VSOCK = 40  # socket family: virtio/VMCI sockets to the hypervisor and host
_IPPROTO_MPTCP = 262  # socket protocol: multipath TCP, not covered by Landlock's TCP rules

# (syscall, why) for every call the filter refuses outright.
_BLANKET: tuple[tuple[str, str], ...] = (
    ("keyctl", "kernel keyrings outlive the sandbox and are shared by uid"),
    ("add_key", "kernel keyrings outlive the sandbox and are shared by uid"),
    ("request_key", "kernel keyrings; can call out to a helper on the host"),
    ("bpf", "loads programs into the kernel; a large attack surface"),
    ("perf_event_open", "reads kernel and other processes' activity; a large attack surface"),
    ("userfaultfd", "lets a process stall the kernel mid-copy, a classic exploit aid"),
    ("ptrace", "inspects and drives other processes"),
    ("process_vm_readv", "reads another process's memory"),
    ("process_vm_writev", "writes another process's memory"),
    # Beside the relay being non-dumpable (relay.c): its descriptors are the hand-offs to the
    # proxy and its unix connections; a copy kept by the program would share their flags.
    ("pidfd_getfd", "copies another process's descriptor (the relay's, for one)"),
    ("kcmp", "compares other processes' descriptors and memory: learns what they hold"),
    ("unshare", "new namespaces: the sandbox must not make its own user or mount namespace"),
    ("setns", "joins another namespace"),
    ("mount", "changes the filesystem view"),
    ("umount2", "uncovers what a mount hides"),
    ("pivot_root", "changes the root"),
    ("fsopen", "new mount API"),
    ("fsconfig", "new mount API"),
    ("fsmount", "new mount API"),
    ("fspick", "new mount API"),
    ("move_mount", "new mount API"),
    ("open_tree", "new mount API; clones mounts"),
    ("mount_setattr", "new mount API; changes mount flags"),
    ("io_uring_setup", "io_uring runs operations the filter never sees"),
    ("io_uring_enter", "io_uring runs operations the filter never sees"),
    ("io_uring_register", "io_uring runs operations the filter never sees"),
    ("kexec_load", "replaces the running kernel"),
    ("kexec_file_load", "replaces the running kernel"),
    ("init_module", "loads kernel code"),
    ("finit_module", "loads kernel code"),
    ("delete_module", "unloads kernel code"),
    ("swapon", "host memory configuration"),
    ("swapoff", "host memory configuration"),
    ("reboot", "host power state"),
    ("acct", "host process accounting"),
    ("quotactl", "host disk quotas"),
    ("lookup_dcookie", "kernel profiling interface"),
    ("open_by_handle_at", "opens files by handle, bypassing path checks"),
    ("name_to_handle_at", "makes the handles open_by_handle_at uses"),
    ("chroot", "changes the root; with a writable folder, an escape aid"),
    ("syslog", "reads the kernel log"),
    ("vhangup", "hangs up the terminal of other sessions"),
    ("modify_ldt", "x86 segment descriptors: old exploit aid, no use to a 64-bit program"),
    ("memfd_secret", "memory hidden even from the kernel's own views: a hiding place for code"),
    ("open_tree_attr", "new mount API (Linux 6.15); clones mounts with new attributes"),
)

# A comparison (arg index, op, datum_a, datum_b); a rule fires when all of its comparisons hold
# (libseccomp allows one comparison per argument); an entry fires when any of its rules does.
_Cmp = tuple[int, int, int, int]
_Rules = tuple[tuple[_Cmp, ...], ...]
_ALWAYS: _Rules = ((),)


def _low32_is(arg: int, value: int) -> _Rules:
    return (((arg, _CMP_MASKED_EQ, _LOW32, value),),)


def _personality_changes() -> _Rules:
    # The kernel reads the low 32 bits. They are neither 0 (PER_LINUX) nor all ones (the query)
    # exactly when some bit is 1 and the next bit up (cyclically) is 0: one rule per bit.
    return tuple(
        ((0, _CMP_MASKED_EQ, (1 << bit) | (1 << ((bit + 1) % 32)), 1 << bit),) for bit in range(32)
    )


# (syscall, why, errno, rules) for the calls refused only with some arguments, and clone3.
_ARG_RULES: tuple[tuple[str, str, int, _Rules], ...] = (
    (
        "clone",
        "with any CLONE_NEW* flag: new namespaces",
        errno.EPERM,
        tuple(((0, _CMP_MASKED_EQ, bit, bit),) for bit in _CLONE_NEW_FLAGS),
    ),
    (
        "clone3",
        "always ENOSYS: its flags hide in memory; libc falls back to clone",
        errno.ENOSYS,
        _ALWAYS,
    ),
    ("ioctl", "TIOCSTI: types into the terminal", errno.EPERM, _low32_is(1, _TIOCSTI)),
    ("ioctl", "TIOCLINUX: console selection paste", errno.EPERM, _low32_is(1, _TIOCLINUX)),
    (
        "socket",
        "AF_VSOCK (EAFNOSUPPORT): a way to the hypervisor",
        errno.EAFNOSUPPORT,
        _low32_is(0, _AF_VSOCK),
    ),
    (
        "socket",
        "IPPROTO_MPTCP (EPROTONOSUPPORT): not covered by Landlock's TCP rules",
        errno.EPROTONOSUPPORT,
        _low32_is(2, _IPPROTO_MPTCP),
    ),
    (
        "personality",
        "anything but PER_LINUX or the 0xffffffff query: no ASLR, readable-implies-executable",
        errno.EPERM,
        _personality_changes(),
    ),
)

BLANKET_NAMES = frozenset(name for name, _why in _BLANKET)

DENIED_SYSCALLS: tuple[tuple[str, str], ...] = _BLANKET + tuple(
    (name, why) for name, why, _errno, _rules in _ARG_RULES
)


class _ArgCmp(ctypes.Structure):
    """struct scmp_arg_cmp."""

    _fields_ = (
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    )


def _load_library() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(LIBSECCOMP, use_errno=True)
    except OSError as exc:
        raise LaunchRefused(
            "seccomp", f"libseccomp is missing or unreadable ({exc}); install libseccomp2"
        ) from exc
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.restype = None
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_attr_set.restype = ctypes.c_int
    lib.seccomp_arch_native.argtypes = []
    lib.seccomp_arch_native.restype = ctypes.c_uint32
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    # The array form, not the variadic seccomp_rule_add: no structs by value through varargs.
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_rule_add_array.restype = ctypes.c_int
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_export_bpf.restype = ctypes.c_int
    return lib


def _check(rc: int, what: str) -> None:
    if rc != 0:
        name = errno.errorcode.get(-rc, f"error {rc}")
        raise LaunchRefused("seccomp", f"seccomp filter: {what} failed: {name}")


_Entry = tuple[str, int, _Rules]  # (syscall, errno, rules)


def _compile(lib: ctypes.CDLL, entries: list[_Entry]) -> bytes:
    """A filter (default ALLOW, foreign ABIs killed) refusing `entries`, as BPF instructions."""
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        raise LaunchRefused("seccomp", "seccomp filter: seccomp_init failed")
    try:
        _check(lib.seccomp_attr_set(ctx, _FLTATR_ACT_BADARCH, _ACT_KILL_PROCESS), "bad-arch action")
        for name, number, rules in entries:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr == _NR_SCMP_ERROR and name in _BY_NUMBER:
                nr = _BY_NUMBER[name]  # newer than this libseccomp: named by its number
            if nr == _NR_SCMP_ERROR:
                raise LaunchRefused(
                    "seccomp", f"seccomp filter: libseccomp does not know syscall {name}"
                )
            if nr < 0:
                continue  # a pseudo-number: the syscall does not exist on this architecture
            for cmps in rules:
                array = (_ArgCmp * max(len(cmps), 1))(*(_ArgCmp(*cmp) for cmp in cmps))
                rc = lib.seccomp_rule_add_array(ctx, _ACT_ERRNO | number, nr, len(cmps), array)
                _check(rc, f"rule for {name}")
        fd = os.memfd_create("lnk-seccomp-bpf", os.MFD_CLOEXEC)
        try:
            _check(lib.seccomp_export_bpf(ctx, fd), "export")
            size = os.fstat(fd).st_size
            program = os.pread(fd, size, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
    if not program or len(program) != size:
        raise LaunchRefused("seccomp", "seccomp filter: the exported program is empty or short")
    return program


def compile_filter(
    *, pretend_machine: str | None = None, unsafe: frozenset[str] = frozenset()
) -> bytes:
    """The deny-list filter as BPF for this machine; raise rather than return a weaker one.

    `pretend_machine` (tests only) stands in for `os.uname().machine` to see the refusal;
    `unsafe` names rule groups of `UNSAFE_RELAXATIONS` to leave out (the `unsafe_…` switches),
    and `allow:<call>` each row of the blanket deny-list to leave out (unsafe_allow_syscalls).
    """
    machine = os.uname().machine if pretend_machine is None else pretend_machine
    if machine not in SUPPORTED_MACHINES:
        raise LaunchRefused("seccomp", f"seccomp filter: unsupported architecture {machine}")
    lib = _load_library()
    native = lib.seccomp_arch_native()
    if native != SUPPORTED_MACHINES[machine]:
        raise LaunchRefused(
            "seccomp", f"seccomp filter: libseccomp's native arch {native:#x} is not {machine}"
        )
    entries = [
        (name, errno.EPERM, _ALWAYS)
        for name, _why in _BLANKET
        if f"{ALLOW_PREFIX}{name}" not in unsafe
    ]
    entries += [(name, number, rules) for name, _why, number, rules in _ARG_RULES]
    entries += seccomp_modes.mode_rules(
        set_id="set_id_modes" not in unsafe, shared="shared_modes" not in unsafe
    )
    return _compile(lib, entries)


_AF_UNIX = 1  # socket family: named and abstract unix sockets


def compile_unix_block(
    *, network_host: bool = False, unsafe: frozenset[str] = frozenset()
) -> bytes:
    """A second filter, stacked last: `socket(AF_UNIX, …)` fails with EPERM; `socketpair` works.

    Landlock (ABI < 9) cannot stop connecting to a named unix socket the sandbox can see, and a
    granted folder (or a home read with `--read ~`) may hold another program's socket: an agent's,
    gpg's, a database's. Denying the creation of unix sockets closes every such connect at once;
    pairs made with `socketpair` (what most programs use between their own processes) still work.
    The confiner loads it last, after the relays (which need their unix socket) have started.
    With the host's network (`network_host`) it also holds `seccomp_host_net`'s rules: no
    listening socket and no datagram socket on the host.
    """
    entries: list[_Entry] = [("socket", errno.EPERM, _low32_is(0, _AF_UNIX))]
    if network_host and "host_listen" not in unsafe:
        entries += seccomp_host_net.host_net_rules()
    return _compile(_load_library(), entries)


@functools.cache
def programs(
    *, network_host: bool = False, unsafe: frozenset[str] = frozenset()
) -> tuple[bytes, bytes]:
    """(the deny-list, the last filter): compiled once per controller process and variant."""
    unknown = unsafe - UNSAFE_RELAXATIONS - {f"{ALLOW_PREFIX}{name}" for name in BLANKET_NAMES}
    if unknown:
        raise LaunchRefused("seccomp", f"seccomp filter: unknown relaxations {sorted(unknown)}")
    return (
        compile_filter(unsafe=unsafe),
        compile_unix_block(network_host=network_host, unsafe=unsafe),
    )
