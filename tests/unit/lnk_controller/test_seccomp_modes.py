"""seccomp attacks on what a sandbox leaves behind: set-id and shared modes, ACLs, host ports.

As test_seccomp.py: a fresh Python child loads the controller's compiled program the way the
confiner does, then attacks; each attack runs unconfined too, so a refusal is the filter's and
not the kernel's (root may do all of these). The child also reports the modes on disk after
each attempt, so a refusal that still changed the file would show.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from seccomp_child import results_of, run_child

from lnk_controller import seccomp, seccomp_modes

pytestmark = pytest.mark.needs_root

MODES = """
import struct
DIR = ARGS["dir"]
def path(name):
    return os.path.join(DIR, name)
def fresh(name, mode=0o644):
    p = path(name)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    os.chmod(p, mode)
    return p
def mode_of(name):
    return oct(stat.S_IMODE(os.lstat(path(name)).st_mode)) if os.path.lexists(path(name)) else "-"
import stat
names = ["chmod-suid", "chmod-sgid", "chmod-666", "chmod-620", "chmod-755", "fchmod", "fchmodat",
         "fchmodat2", "acl", "xattr"]
for n in names:
    fresh(n)
os.mkdir(path("dir-1755"), 0o755)
os.umask(0o022)
if ARGS["confined"]:
    load_filter()
S = ctypes.c_char_p
attempt("chmod 04755", lambda: os.chmod(path("chmod-suid"), 0o4755))
attempt("chmod 02755", lambda: os.chmod(path("chmod-sgid"), 0o2755))
attempt("chmod 0666", lambda: os.chmod(path("chmod-666"), 0o666))
attempt("chmod 0620", lambda: os.chmod(path("chmod-620"), 0o620))
attempt("chmod 0755", lambda: os.chmod(path("chmod-755"), 0o755))
attempt("chmod 01755 a folder", lambda: os.chmod(path("dir-1755"), 0o1755))
SUID = S(path("chmod-suid").encode())
attempt("chmod 04755 with high bits", lambda: call(90, SUID, (1 << 32) | 0o4755))
def fchmod():
    fd = os.open(path("fchmod"), os.O_RDONLY)
    try:
        os.fchmod(fd, 0o6755)
    finally:
        os.close(fd)
attempt("fchmod 06755", fchmod)
attempt("fchmodat 0777", lambda: call(268, -100, S(path("fchmodat").encode()), 0o777))
attempt("fchmodat2 04755", lambda: call(452, -100, S(path("fchmodat2").encode()), 0o4755, 0))
def create(name, flags, mode):
    os.close(os.open(path(name), os.O_WRONLY | flags, mode))
attempt("open O_CREAT 04755", lambda: create("open-suid", os.O_CREAT, 0o4755))
attempt("open O_CREAT 02755", lambda: create("open-sgid", os.O_CREAT | os.O_EXCL, 0o2755))
attempt("open O_CREAT 0666", lambda: create("open-666", os.O_CREAT, 0o666))
attempt("openat O_CREAT 04755", lambda: call(257, -100, S(path("openat-suid").encode()),
                                           os.O_WRONLY | os.O_CREAT, 0o4755))
attempt("open O_TMPFILE 04755", lambda: os.close(os.open(DIR, os.O_TMPFILE | os.O_WRONLY, 0o4755)))
attempt("creat 04755", lambda: call(85, S(path("creat-suid").encode()), 0o4755))
attempt("mknod S_IFREG|04755", lambda: os.mknod(path("mknod-suid"), stat.S_IFREG | 0o4755))
attempt("mknodat S_IFREG|06755", lambda: call(259, -100, S(path("mknodat-sgid").encode()),
                                             stat.S_IFREG | 0o6755, 0))
attempt("mkdir 0777", lambda: os.mkdir(path("mkdir-777"), 0o777))
class OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))
def openat2():
    how = OpenHow(os.O_WRONLY | os.O_CREAT, 0o4755, 0)
    name = S(path("openat2-suid").encode())
    fd = sys_call(437, -100, name, ctypes.byref(how), ctypes.sizeof(how))
    os.close(fd)
attempt("openat2 O_CREAT 04755", openat2)
# a minimal ACL (user::rw-, group::r--, other::rw-): it sets the mode's other-write bit
ACL = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, 0xFFFFFFFF)
                                      for t, p in ((1, 6), (4, 4), (0x20, 6)))
ACL_NAME = "system.posix_acl_access"
attempt("setxattr " + ACL_NAME, lambda: os.setxattr(path("acl"), ACL_NAME, ACL))
attempt("setxattr user.lnk", lambda: os.setxattr(path("xattr"), "user.lnk", b"x"))
attempt("setxattrat", lambda: call(463, -100, S(path("xattr").encode()), 0, S(b"user.lnk"), 0, 0))
attempt("getxattr", lambda: len(os.listxattr(path("xattr"))))
attempt("modify_ldt read", lambda: sys_call(154, 0, ctypes.create_string_buffer(16), 16))
attempt("memfd_secret", lambda: os.close(sys_call(447, 0)))
attempt("open_tree_attr", lambda: call(467, -100, S(b"/nonexistent-lnk"), 0, 0, 0))
results["modes"] = {n: mode_of(n) for n in sorted(os.listdir(DIR))}
"""

# attack -> (unconfined result, confined result)
EXPECTED = {
    "chmod 04755": ("OK", "EPERM"),
    "chmod 02755": ("OK", "EPERM"),
    "chmod 0666": ("OK", "EPERM"),
    "chmod 0620": ("OK", "EPERM"),
    "chmod 0755": ("OK", "OK"),
    "chmod 01755 a folder": ("OK", "OK"),
    "chmod 04755 with high bits": ("OK", "EPERM"),
    "fchmod 06755": ("OK", "EPERM"),
    "fchmodat 0777": ("OK", "EPERM"),
    "fchmodat2 04755": ("OK", "EPERM"),
    "open O_CREAT 04755": ("OK", "EPERM"),
    "open O_CREAT 02755": ("OK", "EPERM"),
    "open O_CREAT 0666": ("OK", "OK"),
    "openat O_CREAT 04755": ("OK", "EPERM"),
    "open O_TMPFILE 04755": ("OK", "EPERM"),
    "creat 04755": ("OK", "EPERM"),
    "mknod S_IFREG|04755": ("OK", "EPERM"),
    "mknodat S_IFREG|06755": ("OK", "EPERM"),
    "mkdir 0777": ("OK", "OK"),
    "openat2 O_CREAT 04755": ("OK", "ENOSYS"),
    "setxattr system.posix_acl_access": ("OK", "ENOTSUP"),
    "setxattr user.lnk": ("OK", "ENOTSUP"),
    "setxattrat": ("EINVAL", "ENOTSUP"),
    "getxattr": (1, 0),
    "modify_ldt read": (0, "EPERM"),
    "memfd_secret": ("OK", "EPERM"),
    "open_tree_attr": ("ENOENT", "EPERM"),
}

# what is on disk afterwards: unconfined every attack took; confined none did
MODES_AFTER = {
    False: {
        "chmod-suid": "0o4755",
        "chmod-sgid": "0o2755",
        "chmod-666": "0o666",
        "chmod-620": "0o620",
        "fchmod": "0o6755",
        "fchmodat": "0o777",
        "fchmodat2": "0o4755",
        "open-suid": "0o4755",
        "open-sgid": "0o2755",
        "openat-suid": "0o4755",
        "creat-suid": "0o4755",
        "mknod-suid": "0o4755",
        "mknodat-sgid": "0o6755",
        "openat2-suid": "0o4755",
        "acl": "0o646",
        "open-666": "0o644",
        "mkdir-777": "0o755",
        "dir-1755": "0o1755",
    },
    True: {
        "chmod-suid": "0o644",
        "chmod-sgid": "0o644",
        "chmod-666": "0o644",
        "chmod-620": "0o644",
        "fchmod": "0o644",
        "fchmodat": "0o644",
        "fchmodat2": "0o644",
        "open-suid": "-",
        "open-sgid": "-",
        "openat-suid": "-",
        "creat-suid": "-",
        "mknod-suid": "-",
        "mknodat-sgid": "-",
        "openat2-suid": "-",
        "acl": "0o644",
        "open-666": "0o644",
        "mkdir-777": "0o755",
        "dir-1755": "0o1755",
    },
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, dict[str, Any]]:
    """Every attack's result, keyed by confined (True) or not (False), each in a fresh folder
    on a disk filesystem (ext4 here: xattrs and ACLs as on the owner's folders)."""
    deny_list, _last = seccomp.programs()
    found: dict[bool, dict[str, Any]] = {}
    for confined in (False, True):
        folder = tmp_path_factory.mktemp(f"modes-{confined}")
        found[confined] = results_of(
            run_child(MODES, filter=deny_list.hex(), dir=str(folder), confined=confined)
        )
    return found


@pytest.mark.parametrize("attack", sorted(EXPECTED))
def test_mode_attack_is_refused_and_plain_modes_still_work(
    outcomes: dict[bool, dict[str, Any]], attack: str
) -> None:
    unconfined, confined = EXPECTED[attack]
    assert (outcomes[False][attack], outcomes[True][attack]) == (unconfined, confined)


@pytest.mark.parametrize("confined", [False, True])
def test_nothing_refused_changed_a_mode_on_disk(
    outcomes: dict[bool, dict[str, Any]], confined: bool
) -> None:
    modes = outcomes[confined]["modes"]
    assert {k: modes.get(k, "-") for k in MODES_AFTER[confined]} == MODES_AFTER[confined]
    assert modes["chmod-755"] == "0o755"


@pytest.mark.parametrize(
    ("unsafe", "attack", "confined"),
    [
        ("set_id_modes", "chmod 04755", "OK"),
        ("set_id_modes", "chmod 0666", "EPERM"),
        ("shared_modes", "chmod 04755", "EPERM"),
        ("shared_modes", "chmod 0666", "OK"),
        ("shared_modes", "setxattr system.posix_acl_access", "OK"),
    ],
)
def test_each_unsafe_switch_reopens_only_its_own_class(
    tmp_path: Path, unsafe: str, attack: str, confined: str
) -> None:
    deny_list, _last = seccomp.programs(unsafe=frozenset({unsafe}))
    results = results_of(run_child(MODES, filter=deny_list.hex(), dir=str(tmp_path), confined=True))
    assert results[attack] == confined


HOST_NET = """
def make_socket(*args):
    socket.socket(*args).close()
def listen_unbound():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.listen()
        return "listening on %d" % s.getsockname()[1]
def udp_bind():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
load_filter("last")
attempt("listen on an unbound TCP socket", listen_unbound)
attempt("UDP socket", lambda: make_socket(socket.AF_INET, socket.SOCK_DGRAM))
attempt("UDP bind", udp_bind)
DGRAM_NB = socket.SOCK_DGRAM | socket.SOCK_NONBLOCK
attempt("UDP6 socket, nonblocking", lambda: make_socket(socket.AF_INET6, DGRAM_NB))
ICMP = socket.IPPROTO_ICMP
attempt("ICMP ping socket", lambda: make_socket(socket.AF_INET, socket.SOCK_DGRAM, ICMP))
attempt("SCTP seqpacket", lambda: make_socket(socket.AF_INET, socket.SOCK_SEQPACKET, 132))
attempt("AF_PACKET", lambda: make_socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
attempt("AF_RDS", lambda: make_socket(21, socket.SOCK_SEQPACKET, 0))
attempt("AF_TIPC", lambda: make_socket(30, socket.SOCK_RDM, 0))
attempt("family 255", lambda: make_socket(255, socket.SOCK_STREAM, 0))
attempt("TCP socket", lambda: make_socket(socket.AF_INET, socket.SOCK_STREAM))
STREAM_CX = socket.SOCK_STREAM | socket.SOCK_CLOEXEC
attempt("TCP6 socket", lambda: make_socket(socket.AF_INET6, STREAM_CX))
attempt("netlink socket", lambda: make_socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
attempt("AF_UNIX", lambda: make_socket(socket.AF_UNIX, socket.SOCK_STREAM))
attempt("socketpair", lambda: [s.close() for s in socket.socketpair()] and None)
"""

HOST_NET_EXPECTED = {
    "listen on an unbound TCP socket": "EPERM",
    "UDP socket": "EPERM",
    "UDP bind": "EPERM",
    "UDP6 socket, nonblocking": "EPERM",
    "ICMP ping socket": "EPERM",
    "SCTP seqpacket": "EPERM",
    "AF_PACKET": "EAFNOSUPPORT",
    "AF_RDS": "EAFNOSUPPORT",
    "AF_TIPC": "EAFNOSUPPORT",
    "family 255": "EAFNOSUPPORT",
    "TCP socket": "OK",
    "TCP6 socket": "OK",
    "netlink socket": "OK",
    "AF_UNIX": "EPERM",
    "socketpair": "OK",
}


def test_host_network_filter_refuses_listening_and_datagrams_but_not_dialing() -> None:
    _deny, last = seccomp.programs(network_host=True)
    assert results_of(run_child(HOST_NET, last=last.hex())) == HOST_NET_EXPECTED


def test_without_host_network_listening_and_udp_stay_open() -> None:
    # the sandbox's own empty network: what listens there reaches no one
    _deny, last = seccomp.programs()
    results = results_of(run_child(HOST_NET, last=last.hex()))
    assert results["listen on an unbound TCP socket"].startswith("listening on ")
    assert results["UDP bind"] == "OK"


def test_host_listen_switch_reopens_listening() -> None:
    _deny, last = seccomp.programs(network_host=True, unsafe=frozenset({"host_listen"}))
    results = results_of(run_child(HOST_NET, last=last.hex()))
    assert results["listen on an unbound TCP socket"].startswith("listening on ")


def test_an_unknown_relaxation_is_refused() -> None:
    with pytest.raises(Exception, match="unknown relaxations"):
        seccomp.programs(unsafe=frozenset({"everything"}))


def test_refused_bits_are_set_id_and_shared_write() -> None:
    assert seccomp_modes.MODE_REFUSED_BITS == stat.S_ISUID | stat.S_ISGID | 0o022
    assert seccomp_modes.CREATE_REFUSED_BITS == stat.S_ISUID | stat.S_ISGID
