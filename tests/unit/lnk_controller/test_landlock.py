"""Landlock attacks: each test runs a fresh Python under the confiner (lnk-sandbox) with a
policy, and that Python tries to get out.

The target is the system's Python with -I -S, so every policy reads /usr and executes Python
and its loader; the child prints a JSON map of attack -> "OK" or the errno name. Tests named
`test_gap_...` pin down what Landlock does NOT stop on this kernel, so a change in either
direction is noticed. The unix-socket block is off unless a test says so (it is seccomp's, see
test_seccomp.py); the syscall filter is always loaded, as it is in every sandbox.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk_controller import landlock
from lnk_controller.spawn import encode_policy

pytestmark = pytest.mark.needs_root

TRUE = "/usr/bin/true"
FALSE = "/usr/bin/false"
PYTHON = os.path.realpath("/usr/bin/python3")
PT_INTERP = 3  # ELF program header type naming the loader


def _elf_interpreter(path: str) -> str:
    """The loader named in a 64-bit little-endian ELF's PT_INTERP header."""
    data = Path(path).read_bytes()
    phoff, phentsize, phnum = data[32:40], data[54:56], data[56:58]
    offset = struct.unpack("<Q", phoff)[0]
    size = struct.unpack("<H", phentsize)[0]
    for i in range(struct.unpack("<H", phnum)[0]):
        header = data[offset + i * size : offset + (i + 1) * size]
        p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack("<IIQQQQ", header[:40])
        if p_type == PT_INTERP:
            return data[p_offset : p_offset + p_filesz].rstrip(b"\0").decode()
    raise AssertionError(f"{path} has no PT_INTERP")


LOADER = _elf_interpreter(TRUE)

PRELUDE = """
import errno, json, os, signal, socket, subprocess, sys
ARGS = json.loads(sys.argv[1])
results = {}

def attempt(label, fn):
    try:
        value = fn()
    except OSError as exc:
        results[label] = errno.errorcode[exc.errno]
    else:
        results[label] = "OK" if value is None else value
"""


def confined(
    binary: Path,
    tmp_path: Path,
    body: str,
    *,
    read: tuple[str, ...] = (),
    write: tuple[str, ...] = (),
    execute: tuple[str, ...] = (),
    args: dict[str, Any] | None = None,
    **fields: object,
) -> dict[str, Any]:
    """Run PRELUDE + body in Python under the confiner with this policy; its results map."""
    policy: dict[str, object] = {
        "read": ["/usr", *read],
        "write": list(write),
        "execute": [PYTHON, LOADER, *execute],
        "tcp_connect": None,
        "tcp_bind": None,
        "scope_abstract_unix": False,
        "scope_signal": False,
        "block_unix_sockets": False,
        "min_abi": 1,
        "unsafe_pretend_abi": None,
        **fields,
    }
    policy_file = tmp_path / "policy"
    policy_file.write_text(encode_policy(policy))
    script = PRELUDE + body + "\nprint(json.dumps(results))\n"
    target = [PYTHON, "-I", "-S", "-c", script, json.dumps(args or {})]
    proc = subprocess.run(
        [str(binary), "--policy", str(policy_file), "--", *target],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """outside/secret, ro/file, rw/file: three folders for grants."""
    for name in ("outside", "ro", "rw"):
        (tmp_path / name).mkdir()
    (tmp_path / "outside" / "secret").write_text("secret")
    (tmp_path / "ro" / "file").write_text("read me")
    (tmp_path / "rw" / "file").write_text("change me")
    return tmp_path


def test_probe_abi_reports_a_landlock_version() -> None:
    assert landlock.probe_abi() >= 1


def test_reading_a_file_outside_the_read_grants_is_denied(lnk_sandbox: Path, tree: Path) -> None:
    results = confined(
        lnk_sandbox,
        tree,
        """
attempt("read granted", lambda: open(ARGS["ro"] + "/file").read() and None)
attempt("read outside", lambda: open(ARGS["secret"]).read())
attempt("list outside", lambda: os.listdir(ARGS["outside"]))
attempt("list /", lambda: os.listdir("/"))
""",
        read=(str(tree / "ro"),),
        args={
            "ro": str(tree / "ro"),
            "secret": str(tree / "outside" / "secret"),
            "outside": str(tree / "outside"),
        },
    )
    assert results == {
        "read granted": "OK",
        "read outside": "EACCES",
        "list outside": "EACCES",
        "list /": "EACCES",
    }


def test_writing_in_a_read_only_grant_is_denied(lnk_sandbox: Path, tree: Path) -> None:
    results = confined(
        lnk_sandbox,
        tree,
        """
attempt("open for write", lambda: open(ARGS["ro"] + "/file", "a").close())
attempt("create", lambda: open(ARGS["ro"] + "/new", "x").close())
attempt("truncate", lambda: os.truncate(ARGS["ro"] + "/file", 0))
attempt("unlink", lambda: os.unlink(ARGS["ro"] + "/file"))
attempt("mkdir", lambda: os.mkdir(ARGS["ro"] + "/dir"))
""",
        read=(str(tree / "ro"),),
        args={"ro": str(tree / "ro")},
    )
    assert set(results.values()) == {"EACCES"}, results
    assert (tree / "ro" / "file").read_text() == "read me"


WRITE_GRANT_WORK = """
attempt("create", lambda: open(ARGS["rw"] + "/new", "x").write("x") and None)
attempt("append", lambda: open(ARGS["rw"] + "/file", "a").close())
attempt("truncate", lambda: os.truncate(ARGS["rw"] + "/file", 0))
attempt("mkdir", lambda: os.mkdir(ARGS["rw"] + "/dir"))
attempt("symlink", lambda: os.symlink("new", ARGS["rw"] + "/link"))
attempt("rename inside", lambda: os.rename(ARGS["rw"] + "/new", ARGS["rw"] + "/dir/new"))
attempt("unlink", lambda: os.unlink(ARGS["rw"] + "/dir/new"))
"""


def test_creating_files_in_a_write_grant_works(lnk_sandbox: Path, tree: Path) -> None:
    """Everything but a symbolic link, which a write grant never allows (write_links.py)."""
    results = confined(
        lnk_sandbox,
        tree,
        WRITE_GRANT_WORK,
        write=(str(tree / "rw"),),
        args={"rw": str(tree / "rw")},
    )
    assert results.pop("symlink") == "EACCES"
    assert set(results.values()) == {"OK"}, results
    assert not os.path.lexists(tree / "rw" / "link")


def test_a_symbolic_link_is_made_only_where_the_policy_lists_it(
    lnk_sandbox: Path, tree: Path
) -> None:
    rw = str(tree / "rw")
    results = confined(
        lnk_sandbox, tree, WRITE_GRANT_WORK, write=(rw,), symlink=[rw], args={"rw": rw}
    )
    assert set(results.values()) == {"OK"}, results


def test_write_grant_on_a_single_file_opens_only_that_file(lnk_sandbox: Path, tree: Path) -> None:
    results = confined(
        lnk_sandbox,
        tree,
        """
attempt("append", lambda: open(ARGS["rw"] + "/file", "a").close())
attempt("truncate", lambda: os.truncate(ARGS["rw"] + "/file", 0))
attempt("create sibling", lambda: open(ARGS["rw"] + "/new", "x").close())
attempt("unlink", lambda: os.unlink(ARGS["rw"] + "/file"))
""",
        write=(str(tree / "rw" / "file"),),
        args={"rw": str(tree / "rw")},
    )
    assert results == {
        "append": "OK",
        "truncate": "OK",
        "create sibling": "EACCES",
        "unlink": "EACCES",
    }


def test_making_fifos_and_sockets_in_a_write_grant_is_denied(lnk_sandbox: Path, tree: Path) -> None:
    results = confined(
        lnk_sandbox,
        tree,
        """
attempt("mkfifo", lambda: os.mkfifo(ARGS["rw"] + "/fifo"))
attempt("bind unix", lambda: socket.socket(socket.AF_UNIX).bind(ARGS["rw"] + "/sock"))
attempt("mknod char", lambda: os.mknod(ARGS["rw"] + "/null", 0o600 | 0o020000, os.makedev(1, 3)))
""",
        write=(str(tree / "rw"),),
        args={"rw": str(tree / "rw")},
    )
    assert results == {"mkfifo": "EACCES", "bind unix": "EACCES", "mknod char": "EACCES"}


def test_exec_of_a_binary_not_in_execute_is_denied(lnk_sandbox: Path, tmp_path: Path) -> None:
    results = confined(
        lnk_sandbox,
        tmp_path,
        """
attempt("exec granted", lambda: subprocess.run([ARGS["true"]]).returncode)
attempt("exec not granted", lambda: subprocess.run([ARGS["false"]]).returncode)
""",
        execute=(TRUE,),
        args={"true": TRUE, "false": FALSE},
    )
    assert results == {"exec granted": 0, "exec not granted": "EACCES"}


def test_exec_of_a_dynamic_binary_needs_its_loader_in_execute(
    lnk_sandbox: Path, tmp_path: Path
) -> None:
    # The kernel opens the ELF interpreter for exec too, so Landlock checks EXECUTE on it: with
    # only /usr/bin/true granted (and no loader), the confiner's own execv of it fails.
    policy: dict[str, object] = {
        "read": ["/usr"],
        "write": [],
        "execute": [TRUE],
        "tcp_connect": None,
        "tcp_bind": None,
        "scope_abstract_unix": False,
        "scope_signal": False,
        "block_unix_sockets": False,
        "min_abi": 1,
        "unsafe_pretend_abi": None,
    }
    (tmp_path / "policy").write_text(encode_policy(policy))
    proc = subprocess.run(
        [str(lnk_sandbox), "--policy", str(tmp_path / "policy"), "--", TRUE],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 126
    assert proc.stderr == f"lnk-sandbox: cannot run {TRUE}: Permission denied\n"


def test_gap_loader_runs_a_readable_binary_not_in_execute(
    lnk_sandbox: Path, tmp_path: Path
) -> None:
    # Known gap: the loader maps its argument with mmap(PROT_EXEC), which Landlock does not
    # check. Once the loader is executable, any readable ELF runs through it.
    results = confined(
        lnk_sandbox,
        tmp_path,
        """
attempt("exec false", lambda: subprocess.run([ARGS["false"]]).returncode)
attempt("loader false", lambda: subprocess.run([ARGS["loader"], ARGS["false"]]).returncode)
""",
        args={"loader": LOADER, "false": FALSE},
    )
    assert results == {"exec false": "EACCES", "loader false": 1}


def test_gap_memfd_copy_of_a_binary_executes(lnk_sandbox: Path, tmp_path: Path) -> None:
    # Known gap: a memfd lives on an internal mount that Landlock always allows (the sandbox
    # closes it with vm.memfd_noexec=2 in its pid namespace, see spawn.py).
    results = confined(
        lnk_sandbox,
        tmp_path,
        """
def run_copy():
    fd = os.memfd_create("copy", 0)
    os.write(fd, open(ARGS["false"], "rb").read())
    return subprocess.run([f"/proc/self/fd/{fd}"], pass_fds=(fd,)).returncode
attempt("memfd exec", run_copy)
""",
        read=("/proc",),
        args={"false": FALSE},
    )
    assert results == {"memfd exec": 1}


def test_rename_from_a_write_grant_into_a_read_only_grant_is_denied(
    lnk_sandbox: Path, tree: Path
) -> None:
    results = confined(
        lnk_sandbox,
        tree,
        'attempt("rename", lambda: os.rename(ARGS["rw"] + "/file", ARGS["ro"] + "/moved"))',
        read=(str(tree / "ro"),),
        write=(str(tree / "rw"),),
        args={"ro": str(tree / "ro"), "rw": str(tree / "rw")},
    )
    assert results == {"rename": "EACCES"}
    assert (tree / "rw" / "file").exists()


def test_hard_link_from_outside_into_a_write_grant_is_denied(lnk_sandbox: Path, tree: Path) -> None:
    results = confined(
        lnk_sandbox,
        tree,
        """
attempt("link outside", lambda: os.link(ARGS["secret"], ARGS["rw"] + "/secret"))
attempt("link read-only", lambda: os.link(ARGS["ro"] + "/file", ARGS["rw"] + "/file2"))
""",
        read=(str(tree / "ro"),),
        write=(str(tree / "rw"),),
        args={
            "secret": str(tree / "outside" / "secret"),
            "ro": str(tree / "ro"),
            "rw": str(tree / "rw"),
        },
    )
    assert results == {"link outside": "EXDEV", "link read-only": "EXDEV"}


@pytest.fixture
def listeners() -> Iterator[tuple[int, int]]:
    """Two TCP listeners on loopback: (listed port, unlisted port)."""
    with socket.create_server(("127.0.0.1", 0)) as a, socket.create_server(("127.0.0.1", 0)) as b:
        yield a.getsockname()[1], b.getsockname()[1]


CONNECT = """
def connect(port, proto=0):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto) as s:
        s.connect(("127.0.0.1", port))
"""


def test_tcp_connect_to_an_unlisted_port_is_denied(
    lnk_sandbox: Path, tmp_path: Path, listeners: tuple[int, int]
) -> None:
    listed, unlisted = listeners
    results = confined(
        lnk_sandbox,
        tmp_path,
        CONNECT
        + """
attempt("listed", lambda: connect(ARGS["listed"]))
attempt("unlisted", lambda: connect(ARGS["unlisted"]))
attempt("mptcp to unlisted", lambda: connect(ARGS["unlisted"], 262))
""",
        tcp_connect=[listed],
        args={"listed": listed, "unlisted": unlisted},
    )
    # MPTCP is not covered by TCP rules (landlock-lsm/linux#54): the syscall filter refuses it.
    assert results == {"listed": "OK", "unlisted": "EACCES", "mptcp to unlisted": "EPROTONOSUPPORT"}


def test_tcp_bind_with_an_empty_bind_list_is_denied(lnk_sandbox: Path, tmp_path: Path) -> None:
    results = confined(
        lnk_sandbox,
        tmp_path,
        """
def bind():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
attempt("bind", bind)
""",
        tcp_bind=[],
    )
    assert results == {"bind": "EACCES"}


@pytest.fixture
def abstract_listener() -> Iterator[str]:
    name = f"\0lnk-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(name)
        s.listen()
        yield name


@pytest.mark.parametrize(("scoped", "expected"), [(True, "EPERM"), (False, "OK")])
def test_abstract_unix_connect_to_a_listener_outside_is_denied(
    lnk_sandbox: Path, tmp_path: Path, abstract_listener: str, scoped: bool, expected: str
) -> None:
    results = confined(
        lnk_sandbox,
        tmp_path,
        """
def connect():
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(ARGS["name"])
attempt("connect", connect)
""",
        scope_abstract_unix=scoped,
        args={"name": abstract_listener},
    )
    assert results == {"connect": expected}


@pytest.mark.parametrize(("blocked", "expected"), [(False, "OK"), (True, "EPERM")])
def test_gap_pathname_unix_socket_connect_is_closed_only_by_the_unix_block(
    lnk_sandbox: Path, tmp_path: Path, blocked: bool, expected: str
) -> None:
    # Known gap on this ABI: no Landlock rule covers connect() to a pathname socket, even in a
    # folder with no grant at all; the confiner's unix-socket block (seccomp) closes it.
    path = str(tmp_path / "sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
        s.listen()
        results = confined(
            lnk_sandbox,
            tmp_path,
            """
def connect():
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(ARGS["path"])
attempt("connect", connect)
""",
            block_unix_sockets=blocked,
            args={"path": path},
        )
    assert results == {"connect": expected}


def test_signal_to_a_process_outside_the_domain_is_denied(
    lnk_sandbox: Path, tmp_path: Path
) -> None:
    with subprocess.Popen(["sleep", "60"]) as victim:
        try:
            results = confined(
                lnk_sandbox,
                tmp_path,
                """
attempt("kill outside", lambda: os.kill(ARGS["pid"], signal.SIGTERM))
attempt("probe outside", lambda: os.kill(ARGS["pid"], 0))
def kill_own_child():
    child = subprocess.Popen(["/usr/bin/sleep", "60"])
    child.terminate()
    return child.wait()
attempt("kill own child", kill_own_child)
""",
                execute=("/usr/bin/sleep",),
                scope_signal=True,
                args={"pid": victim.pid},
            )
            assert victim.poll() is None
        finally:
            victim.kill()
    assert results == {
        "kill outside": "EPERM",
        "probe outside": "EPERM",
        "kill own child": -signal.SIGTERM,
    }


PROBE_CHILD = """
import ctypes, errno, sys
sys.path[:0] = sys.argv[1:3]
from lnk_controller import landlock
from lnk_shared.errors import LaunchRefused
lib = ctypes.CDLL("libseccomp.so.2")
lib.seccomp_init.restype = ctypes.c_void_p
ctx = ctypes.c_void_p(lib.seccomp_init(ctypes.c_uint32(0x7FFF0000)))
action = ctypes.c_uint32(0x00050000 | getattr(errno, sys.argv[3]))
assert lib.seccomp_rule_add(ctx, action, ctypes.c_int(444), ctypes.c_uint(0)) == 0
assert lib.seccomp_load(ctx) == 0
try:
    landlock.probe_abi()
except LaunchRefused as exc:
    print(exc)
"""


@pytest.mark.parametrize(
    ("err", "words"),
    [
        ("ENOSYS", "Landlock is not available: ENOSYS (the kernel is built without Landlock"),
        ("EOPNOTSUPP", "Landlock is not available: EOPNOTSUPP (Landlock is disabled at boot"),
    ],
)
def test_probe_without_landlock_is_refused_naming_the_errno(err: str, words: str) -> None:
    # A seccomp filter makes landlock_create_ruleset fail as a kernel without Landlock would.
    import lnk_controller
    import lnk_shared

    paths = [str(Path(pkg.__file__ or "").parent.parent) for pkg in (lnk_controller, lnk_shared)]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE_CHILD, *paths, err],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert words in proc.stdout
