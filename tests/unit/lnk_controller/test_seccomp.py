"""seccomp attacks: a fresh Python child loads the filter, then tries what it refuses.

The child loads the BPF program the controller compiles (`seccomp.programs()`) the way the
confiner does: no_new_privs, then seccomp(SECCOMP_SET_MODE_FILTER), nothing else, so a denial
here is the filter's alone (the confiner's Landlock is tested in test_landlock.py, and both
together in test_confiner.py).

Each attack runs twice, unconfined and confined, so a denial is the filter's and not the
kernel's (root may do all of these unconfined). The unconfined run is chosen to be harmless:
mount targets a missing path, bpf and io_uring get null arguments, clone3 a null struct.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

import pytest
import seccomp_child
from seccomp_child import results_of

from lnk_controller import seccomp
from lnk_shared.errors import LaunchRefused

pytestmark = pytest.mark.needs_root

ATTACKS = """
CLONE_NEWUSER, SIGCHLD, HIGH_BIT = 0x10000000, 17, 1 << 32

def clone_raw(flags):
    pid = sys_call(56, flags, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)

def ptrace_attach():
    # a forked target, reaped by hand: Popen would read the attach-stop as an exit
    pid = os.fork()
    if pid == 0:
        while True:
            signal.pause()
    try:
        sys_call(101, 16, pid, 0, 0)
    finally:
        os.kill(pid, signal.SIGKILL)
        while not os.WIFSIGNALED(os.waitpid(pid, 0)[1]):
            pass

def tiocsti(request):
    _main, tty = os.openpty()
    byte = ctypes.c_char(b"x")
    sys_call(16, tty, request, ctypes.byref(byte))

def make_socket(*args):
    socket.socket(*args).close()

def thread():
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()

def of_a_child(take):
    # a child of its own that holds a pipe's read end (same uid, dumpable: the kernel lets
    # its parent take and compare its descriptors); `take(pid, fd)` tries
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    try:
        return take(pid, r)
    finally:
        os.write(w, b"x")
        os.waitpid(pid, 0)
        os.close(r)
        os.close(w)

def pidfd_getfd(pid, fd):
    pidfd = os.pidfd_open(pid)
    try:
        os.close(sys_call(438, pidfd, fd, 0))
    finally:
        os.close(pidfd)

KCMP = {"x86_64": 312, "aarch64": 272}[os.uname().machine]
KCMP_FILE = 0
VM_READV = {"x86_64": 310, "aarch64": 270}[os.uname().machine]

def kcmp(pid, fd):
    call(KCMP, os.getpid(), pid, KCMP_FILE, fd, fd)

def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    return os.waitpid(pid, 0)[1] >> 8

if ARGS["confined"]:
    load_filter()
attempt("unshare CLONE_NEWUSER", lambda: in_fork(lambda: call(272, CLONE_NEWUSER)))
attempt("clone CLONE_NEWUSER", lambda: clone_raw(CLONE_NEWUSER | SIGCHLD))
attempt("clone CLONE_NEWUSER, high bit", lambda: clone_raw(HIGH_BIT | CLONE_NEWUSER | SIGCHLD))
attempt("clone3", lambda: sys_call(435, 0, 0))
NONE, MISSING, TMPFS = (ctypes.c_char_p(b) for b in (b"none", b"/nonexistent-lnk", b"tmpfs"))
attempt("mount", lambda: sys_call(165, NONE, MISSING, TMPFS, 0, 0))
attempt("keyctl", lambda: call(250, 0, -3, 0))
attempt("bpf", lambda: sys_call(321, 0, 0, 0))
attempt("io_uring_setup", lambda: sys_call(425, 1, 0))
attempt("ptrace attach", ptrace_attach)
attempt("pidfd_getfd of a child", lambda: of_a_child(pidfd_getfd))
attempt("kcmp of a child", lambda: of_a_child(kcmp))
attempt("process_vm_readv of itself", lambda: call(VM_READV, os.getpid(), 0, 0, 0, 0, 0))
attempt("ioctl TIOCSTI", lambda: tiocsti(0x5412))
attempt("ioctl TIOCSTI with a high bit", lambda: tiocsti(HIGH_BIT | 0x5412))
attempt("socket AF_VSOCK", lambda: make_socket(40, socket.SOCK_STREAM))
attempt("socket IPPROTO_MPTCP", lambda: make_socket(socket.AF_INET, socket.SOCK_STREAM, 262))
attempt("personality ADDR_NO_RANDOMIZE", lambda: call(135, 0x0040000))
attempt("personality PER_LINUX32", lambda: call(135, 0x0008))
attempt("personality query", lambda: call(135, 0xFFFFFFFF))
attempt("personality PER_LINUX", lambda: call(135, 0))
attempt("fork", fork)
attempt("thread", thread)
attempt("subprocess", lambda: subprocess.run(["true"]).returncode)
attempt("socket AF_INET", lambda: make_socket(socket.AF_INET, socket.SOCK_STREAM))
attempt("socket AF_NETLINK", lambda: make_socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
"""

# attack -> (unconfined result, confined result)
EXPECTED = {
    "unshare CLONE_NEWUSER": ("OK", "EPERM"),
    "clone CLONE_NEWUSER": ("OK", "EPERM"),
    "clone CLONE_NEWUSER, high bit": ("OK", "EPERM"),
    "clone3": ("EINVAL", "ENOSYS"),
    "mount": ("ENOENT", "EPERM"),
    "keyctl": ("OK", "EPERM"),
    "bpf": ("EINVAL", "EPERM"),
    "io_uring_setup": ("EFAULT", "EPERM"),
    "ptrace attach": ("OK", "EPERM"),
    "pidfd_getfd of a child": ("OK", "EPERM"),  # the relay is not dumpable too (relay.c)
    "kcmp of a child": ("OK", "EPERM"),
    "process_vm_readv of itself": ("OK", "EPERM"),
    "ioctl TIOCSTI": ("OK", "EPERM"),
    "ioctl TIOCSTI with a high bit": ("OK", "EPERM"),
    "socket AF_VSOCK": ("OK", "EAFNOSUPPORT"),
    "socket IPPROTO_MPTCP": ("OK", "EPROTONOSUPPORT"),
    "personality ADDR_NO_RANDOMIZE": ("OK", "EPERM"),
    "personality PER_LINUX32": ("OK", "EPERM"),
    "personality query": ("OK", "OK"),
    "personality PER_LINUX": ("OK", "OK"),
    "fork": (7, 7),
    "thread": ("OK", "OK"),
    "subprocess": (0, 0),
    "socket AF_INET": ("OK", "OK"),
    "socket AF_NETLINK": ("OK", "OK"),
}


def run_child(body: str, **args: Any) -> subprocess.CompletedProcess[str]:
    deny_list, unix_block = seccomp.programs()
    return seccomp_child.run_child(
        body, **{"filter": deny_list.hex(), "unix": unix_block.hex(), **args}
    )


@pytest.fixture(scope="module")
def outcomes() -> dict[bool, dict[str, Any]]:
    """Every attack's result, keyed by confined (True) or not (False)."""
    return {
        confined: results_of(run_child(ATTACKS, confined=confined)) for confined in (False, True)
    }


@pytest.mark.parametrize("attack", sorted(EXPECTED))
def test_attack_is_refused_by_the_filter_and_normal_calls_still_work(
    outcomes: dict[bool, dict[str, Any]], attack: str
) -> None:
    unconfined, confined = EXPECTED[attack]
    assert (outcomes[False][attack], outcomes[True][attack]) == (unconfined, confined)


X32_GETPID = """
if ARGS["confined"]:
    load_filter()
attempt("x32 getpid", lambda: sys_call(0x40000000 + 39))
"""

# mov eax, 20 (getpid in the i386 table); int 0x80; ret
I386_GETPID = """
if ARGS["confined"]:
    load_filter()
code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])
page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
call = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
attempt("i386 getpid", lambda: "pid" if call() == os.getpid() else "other")
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x32 and i386 exist on x86_64 only")
@pytest.mark.parametrize("attack", [X32_GETPID, I386_GETPID], ids=["x32", "i386"])
def test_syscall_through_a_foreign_abi_kills_the_process(attack: str) -> None:
    # Unconfined, this kernel answers x32 with ENOSYS and runs i386 getpid; either way the
    # process lives. Confined, the filter's bad-arch action kills it with SIGSYS.
    assert run_child(attack, confined=False).returncode == 0
    assert run_child(attack, confined=True).returncode == -signal.SIGSYS


UNIX_SOCKETS = """
def make_socket(*args):
    socket.socket(*args).close()
load_filter("unix")
attempt("socket AF_UNIX", lambda: make_socket(socket.AF_UNIX, socket.SOCK_STREAM))
attempt("socketpair", lambda: [s.close() for s in socket.socketpair()] and None)
attempt("socket AF_INET", lambda: make_socket(socket.AF_INET, socket.SOCK_STREAM))
"""


def test_the_unix_socket_block_refuses_unix_sockets_but_not_pairs() -> None:
    results = results_of(run_child(UNIX_SOCKETS))
    assert results == {"socket AF_UNIX": "EPERM", "socketpair": "OK", "socket AF_INET": "OK"}


# attack -> the deny-list row that refuses it (each left out alone by unsafe_allow_syscalls)
REOPENED_BY = {
    "keyctl": "keyctl",
    "ptrace attach": "ptrace",
    "pidfd_getfd of a child": "pidfd_getfd",
    "kcmp of a child": "kcmp",
    "process_vm_readv of itself": "process_vm_readv",
}


@pytest.mark.parametrize("attack", sorted(REOPENED_BY))
def test_an_allowed_row_reopens_its_call_only(attack: str) -> None:
    # unsafe_allow_syscalls (a test switch, so check can be seen to report the class leaked)
    allowed = frozenset({f"{seccomp.ALLOW_PREFIX}{REOPENED_BY[attack]}"})
    deny_list, unix_block = seccomp.programs(unsafe=allowed)
    results = results_of(
        seccomp_child.run_child(
            ATTACKS, filter=deny_list.hex(), unix=unix_block.hex(), confined=True
        )
    )
    assert results[attack] == EXPECTED[attack][0]  # as unconfined
    assert {a: r for a, r in results.items() if a != attack} == {
        a: confined for a, (_, confined) in EXPECTED.items() if a != attack
    }


def test_an_unknown_relaxation_is_refused() -> None:
    with pytest.raises(LaunchRefused, match=r"unknown relaxations \['allow:getpid'\]"):
        seccomp.programs(unsafe=frozenset({"allow:getpid"}))


def test_the_programs_are_compiled_once_per_process() -> None:
    assert seccomp.programs() is seccomp.programs()


def test_unsupported_architecture_is_refused() -> None:
    with pytest.raises(LaunchRefused, match="seccomp filter: unsupported architecture riscv64"):
        seccomp.compile_filter(pretend_machine="riscv64")


def test_missing_libseccomp_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seccomp, "LIBSECCOMP", "libseccomp-lnk-missing.so.0")
    with pytest.raises(LaunchRefused, match="libseccomp is missing"):
        seccomp.compile_filter()
    with pytest.raises(LaunchRefused, match="libseccomp is missing"):
        seccomp.compile_unix_block()


REQUIRED = [
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "personality",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "lookup_dcookie",
    "open_by_handle_at",
    "name_to_handle_at",
    "chroot",
    "syslog",
    "vhangup",
    "clone",
    "clone3",
    "ioctl",
    "socket",
]


def test_every_required_syscall_is_listed_with_a_reason() -> None:
    listed = {name for name, _why in seccomp.DENIED_SYSCALLS}
    assert set(REQUIRED) <= listed
    assert all(why for _name, why in seccomp.DENIED_SYSCALLS)
