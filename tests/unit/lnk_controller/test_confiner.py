"""The confiner (lnk-sandbox, compiled from lnk_inside/native/) checks again inside: a policy it
cannot read, parse or apply makes it exit 126 before the target runs; with a policy it can apply,
the target runs confined (Landlock, no_new_privs, both seccomp programs, no inherited
descriptor)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk_controller.spawn import POLICY_HEADER, encode_policy

pytestmark = pytest.mark.needs_root

PYTHON = os.path.realpath("/usr/bin/python3")
LOADER = os.path.realpath("/lib64/ld-linux-x86-64.so.2")
TOUCH = "/usr/bin/touch"
UNSHARE = "/usr/bin/unshare"


def _run(
    binary: Path, policy_file: Path, *target: str, pass_fds: tuple[int, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), "--policy", str(policy_file), "--", *target],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        pass_fds=pass_fds,
    )


def _policy(tmp_path: Path, **changes: object) -> dict[str, object]:
    policy: dict[str, object] = {
        "read": ["/usr", "/etc", "/proc", "/dev"],
        "write": [str(tmp_path)],
        "execute": [TOUCH, PYTHON, LOADER],
        "tcp_connect": None,
        "tcp_bind": None,
        "scope_abstract_unix": True,
        "scope_signal": True,
        "block_unix_sockets": True,
        "min_abi": 6,
        "unsafe_pretend_abi": None,
    }
    policy.update(changes)
    return policy


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy"
    path.write_text(text)
    return path


@pytest.fixture
def valid(tmp_path: Path) -> str:
    """An applicable policy's text, for the malformed variants below to start from."""
    return encode_policy(_policy(tmp_path))


def _confined_python(binary: Path, tmp_path: Path, body: str, **changes: object) -> dict[str, Any]:
    """Run `body` in Python under the confiner; return the map of attempt -> "OK" or errno."""
    script = (
        "import ctypes, errno, json, os, socket\nresults = {}\n"
        "def unshare_user():\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    if libc.unshare(0x10000000) != 0:\n"
        "        raise OSError(ctypes.get_errno(), 'unshare')\n"
        "def attempt(label, fn):\n"
        "    try:\n        value = fn()\n"
        "    except OSError as exc:\n        results[label] = errno.errorcode[exc.errno]\n"
        "    else:\n        results[label] = 'OK' if value is None else value\n"
        f"{body}\nprint(json.dumps(results))\n"
    )
    policy_file = _write(tmp_path, encode_policy(_policy(tmp_path, **changes)))
    result = _run(binary, policy_file, PYTHON, "-I", "-S", "-c", script)
    assert result.returncode == 0, result.stderr
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def test_an_applicable_policy_runs_the_target(lnk_sandbox: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    policy_file = _write(tmp_path, encode_policy(_policy(tmp_path)))
    result = _run(lnk_sandbox, policy_file, TOUCH, str(marker))
    assert result.returncode == 0, result.stderr
    assert marker.exists()


def test_the_target_runs_confined_by_every_layer(lnk_sandbox: Path, tmp_path: Path) -> None:
    results = _confined_python(
        lnk_sandbox,
        tmp_path,
        f"""
status = open("/proc/self/status").read()
attempt("no_new_privs", lambda: status.split("NoNewPrivs:")[1].split()[0])
attempt("seccomp filters", lambda: status.split("Seccomp_filters:")[1].split()[0])
attempt("read outside", lambda: open("/root/.profile").read())
attempt("write in a read grant", lambda: open("/etc/lnk-confiner-test", "w").close())
attempt("unshare", unshare_user)
attempt("unix socket", lambda: socket.socket(socket.AF_UNIX).close())
attempt("socketpair", lambda: [s.close() for s in socket.socketpair()] and None)
attempt("write in a write grant", lambda: open({str(tmp_path / "written")!r}, "w").close())
""",
    )
    assert results == {
        "no_new_privs": "1",
        "seccomp filters": "2",
        "read outside": "EACCES",
        "write in a read grant": "EACCES",
        "unshare": "EPERM",
        "unix socket": "EPERM",
        "socketpair": "OK",
        "write in a write grant": "OK",
    }


def test_without_the_unix_block_unix_sockets_can_be_made(lnk_sandbox: Path, tmp_path: Path) -> None:
    results = _confined_python(
        lnk_sandbox,
        tmp_path,
        'attempt("unix socket", lambda: socket.socket(socket.AF_UNIX).close())',
        block_unix_sockets=False,
    )
    assert results == {"unix socket": "OK"}


def test_descriptors_beyond_stdio_are_closed_before_the_target(
    lnk_sandbox: Path, tmp_path: Path
) -> None:
    read_end, write_end = os.pipe()
    try:
        policy_file = _write(tmp_path, encode_policy(_policy(tmp_path)))
        script = "import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd')))"
        result = _run(
            lnk_sandbox, policy_file, PYTHON, "-I", "-S", "-c", script, pass_fds=(read_end,)
        )
    finally:
        os.close(read_end)
        os.close(write_end)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [0, 1, 2, 3]  # 3: the listing's own directory fd


def test_an_older_landlock_abi_stops_the_target_before_it_runs(
    lnk_sandbox: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    policy_file = _write(tmp_path, encode_policy(_policy(tmp_path, unsafe_pretend_abi=5)))
    result = _run(lnk_sandbox, policy_file, TOUCH, str(marker))
    assert result.returncode == 126
    assert result.stderr == (
        "lnk-sandbox: not running /usr/bin/touch: "
        "Landlock ABI 5 is older than the 6 this box requires\n"
    )
    assert not marker.exists()


@pytest.mark.parametrize(
    ("changes", "needs"),
    [
        ({"tcp_connect": [443]}, "Landlock ABI 3 is older than the 4 TCP rules need"),
        ({"tcp_bind": []}, "Landlock ABI 3 is older than the 4 TCP rules need"),
        ({"scope_abstract_unix": True}, "Landlock ABI 3 is older than the 6 abstract unix"),
        ({"scope_signal": True}, "Landlock ABI 3 is older than the 6 abstract unix"),
        ({"min_abi": 4}, "Landlock ABI 3 is older than the 4 this box requires"),
    ],
)
def test_a_policy_needing_a_newer_abi_is_refused(
    lnk_sandbox: Path, tmp_path: Path, changes: dict[str, object], needs: str
) -> None:
    fields: dict[str, object] = {
        "min_abi": 1,
        "scope_abstract_unix": False,
        "scope_signal": False,
        "unsafe_pretend_abi": 3,
    }
    fields.update(changes)
    marker = tmp_path / "ran"
    policy_file = _write(tmp_path, encode_policy(_policy(tmp_path, **fields)))
    result = _run(lnk_sandbox, policy_file, TOUCH, str(marker))
    assert result.returncode == 126
    assert needs in result.stderr
    assert not marker.exists()


def test_pretending_a_newer_abi_than_the_kernel_is_refused(
    lnk_sandbox: Path, tmp_path: Path
) -> None:
    policy_file = _write(tmp_path, encode_policy(_policy(tmp_path, unsafe_pretend_abi=99)))
    result = _run(lnk_sandbox, policy_file, TOUCH, str(tmp_path / "ran"))
    assert result.returncode == 126
    assert "Landlock: cannot pretend ABI 99 above" in result.stderr
    assert not (tmp_path / "ran").exists()


def test_a_grant_that_does_not_exist_stops_the_target(lnk_sandbox: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    policy = _policy(tmp_path, read=["/usr", "/nonexistent-lnk-grant"])
    result = _run(lnk_sandbox, _write(tmp_path, encode_policy(policy)), TOUCH, str(marker))
    assert result.returncode == 126
    assert "Landlock: cannot open grant /nonexistent-lnk-grant: ENOENT" in result.stderr
    assert not marker.exists()


def _swap(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


def _drop_line(text: str, key: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(key))


VERSION = "is not a policy of this version"
HEX = "seccomp is not a BPF program in hex"
MALFORMED: dict[str, tuple[Callable[[str], str], str]] = {
    "the header of version 1": (
        lambda t: _swap(t, POLICY_HEADER, "lnk-confiner-policy 1"),
        VERSION,
    ),
    "no header": (lambda t: t.split("\n", 1)[1], VERSION),
    "no final line break": (lambda t: t[:-1], VERSION),
    "a line without a tab": (lambda t: t + "execute /usr/bin/id\n", "a line without a value"),
    "an unknown key": (lambda t: t + "exec\t/usr/bin/id\n", "unknown line"),
    "a word for a number": (
        lambda t: _swap(t, "min_abi\t6", "min_abi\tsix"),
        "min_abi must be a number",
    ),
    "a negative number": (
        lambda t: _swap(t, "min_abi\t6", "min_abi\t-6"),
        "min_abi must be a number",
    ),
    "a huge number": (
        lambda t: _swap(t, "min_abi\t6", "min_abi\t1234567"),
        "min_abi must be a number",
    ),
    "min_abi 0": (lambda t: _swap(t, "min_abi\t6", "min_abi\t0"), "min_abi 0 is below 1"),
    "a port above 65535": (lambda t: t + "tcp_connect\t70000\n", "port 70000 is not 0-65535"),
    "a flag of 2": (
        lambda t: _swap(t, "scope_signal\t1", "scope_signal\t2"),
        "scope_signal must be 0 or 1",
    ),
    "a flag twice": (lambda t: t + "scope_signal\t0\n", "scope_signal appears twice"),
    "a relative path": (lambda t: t + "read\tusr\n", "read path 'usr' is not absolute"),
    "no min_abi": (lambda t: _drop_line(t, "min_abi"), "min_abi is missing"),
    "no scope_signal": (lambda t: _drop_line(t, "scope_signal"), "scope_signal is missing"),
    "no seccomp": (lambda t: _drop_line(t, "seccomp\t"), "seccomp (the syscall filter) is missing"),
    "no seccomp_unix": (
        lambda t: _drop_line(t, "seccomp_unix"),
        "seccomp_unix (the unix-socket block) is missing",
    ),
    "odd hex": (lambda t: _swap(t, "seccomp\t", "seccomp\t0"), HEX),
    "hex not whole instructions": (lambda t: _swap(t, "seccomp\t", "seccomp\t00"), HEX),
    "not hex": (lambda t: _swap(t, "seccomp\t", "seccomp\tzz000000000000"), HEX),
    "uppercase hex": (lambda t: _swap(t, "seccomp\t", "seccomp\tAA000000000000"), HEX),
    "a relay port without its socket": (
        lambda t: t + "relay_port\t3128\n",
        "relay_socket and relay_port go together",
    ),
    "a bridge socket without its port": (
        lambda t: t + "bridge_socket\t/run/x.sock\n",
        "bridge_socket and bridge_port go together",
    ),
    "a relay on port 0": (
        lambda t: t + "relay_socket\t/run/p.sock\nrelay_port\t0\n",
        "relay port 0 is not 1-65535",
    ),
    "a bridge above 65535": (
        lambda t: t + "bridge_socket\t/run/b.sock\nbridge_port\t65536\n",
        "relay port 65536 is not 1-65535",
    ),
    "a NUL byte": (lambda t: t + "read\t/usr\0/bin\n", "holds a NUL byte"),
    "over 1 MiB": (lambda t: t + ("read\t/usr\n" * 110_000), "the policy is too large"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_policy_stops_the_target(
    lnk_sandbox: Path, tmp_path: Path, valid: str, case: str
) -> None:
    change, words = MALFORMED[case]
    marker = tmp_path / "ran"
    result = _run(lnk_sandbox, _write(tmp_path, change(valid)), TOUCH, str(marker))
    assert result.returncode == 126, result.stderr
    assert result.stderr.startswith("lnk-sandbox: not running /usr/bin/touch: confiner policy: ")
    assert words in result.stderr
    assert not marker.exists()


def test_a_policy_that_cannot_be_read_stops_the_target(lnk_sandbox: Path, tmp_path: Path) -> None:
    result = _run(lnk_sandbox, tmp_path / "missing", TOUCH, str(tmp_path / "ran"))
    assert result.returncode == 126
    assert "cannot read" in result.stderr and "No such file" in result.stderr
    assert not (tmp_path / "ran").exists()


def test_a_seccomp_program_the_kernel_refuses_stops_the_target(
    lnk_sandbox: Path, tmp_path: Path, valid: str
) -> None:
    # One instruction, "return ALLOW" as its last would be fine; a jump past the end is not.
    bad_jump = "05000000ffffffff"  # BPF_JMP|BPF_JA, k = 0xffffffff
    text = "".join(
        f"seccomp\t{bad_jump}\n" if line.startswith("seccomp\t") else line
        for line in valid.splitlines(keepends=True)
    )
    result = _run(lnk_sandbox, _write(tmp_path, text), TOUCH, str(tmp_path / "ran"))
    assert result.returncode == 126
    assert "seccomp filter: cannot load the syscall filter: EINVAL" in result.stderr
    assert not (tmp_path / "ran").exists()


def test_a_program_outside_execute_is_refused_after_confinement(
    lnk_sandbox: Path, tmp_path: Path
) -> None:
    result = _run(lnk_sandbox, _write(tmp_path, encode_policy(_policy(tmp_path))), "/usr/bin/id")
    assert result.returncode == 126
    assert result.stderr == "lnk-sandbox: cannot run /usr/bin/id: Permission denied\n"


def test_a_program_that_does_not_exist_exits_127(lnk_sandbox: Path, tmp_path: Path) -> None:
    policy_file = _write(tmp_path, encode_policy(_policy(tmp_path)))
    result = _run(lnk_sandbox, policy_file, "/usr/bin/lnk-no-such-program")
    assert result.returncode == 127
    assert "cannot run /usr/bin/lnk-no-such-program" in result.stderr


@pytest.mark.parametrize("argv", [[], ["/usr/bin/true"], ["--policy", "/p"], ["-x", "--", "a"]])
def test_a_wrong_command_line_runs_nothing(lnk_sandbox: Path, argv: list[str]) -> None:
    result = subprocess.run(
        [str(lnk_sandbox), *argv], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 126
    assert "usage: lnk-sandbox" in result.stderr


@pytest.fixture
def echo_socket(tmp_path: Path) -> Iterator[str]:
    """A unix socket answering each connection with b"echo:" and what it read, then closing; a
    connection handed over on it (the proxy's port's relay hands each one over, as to the
    proxy: `lnk_proxy.handoff`) is answered on the handed socket."""
    path = str(tmp_path / "bridge.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                with conn:
                    data, fds, _, _ = socket.recv_fds(conn, 100, 1)
                    if not fds:
                        conn.sendall(b"echo:" + data)
                        continue
                    with socket.socket(fileno=fds[0]) as handed:
                        handed.sendall(b"echo:" + handed.recv(100))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    server.shutdown(socket.SHUT_RDWR)
    server.close()
    thread.join(timeout=5)


@pytest.mark.parametrize("kind", ["bridge", "relay"])
def test_the_relay_serves_its_socket_on_loopback_after_the_unix_block(
    lnk_sandbox: Path, tmp_path: Path, echo_socket: str, kind: str
) -> None:
    # In a fresh network namespace (its own loopback), as a sandbox has: the confiner starts the
    # relay before the unix-socket block, so the relay reaches the socket and the target not.
    # A fresh pid namespace too: the target is its init, so the relay ends with it.
    policy = _policy(tmp_path, **{f"{kind}_socket": echo_socket, f"{kind}_port": 3129})
    policy_file = _write(tmp_path, encode_policy(policy))
    script = f"""
import socket
with socket.create_connection(("127.0.0.1", 3129), timeout=10) as s:
    s.sendall(b"ping")
    print(s.recv(100).decode())
try:
    socket.socket(socket.AF_UNIX).connect({echo_socket!r})
except PermissionError:
    print("unix socket refused")
"""
    namespaces = [UNSHARE, "--net", "--pid", "--fork", "--kill-child", "--", "/bin/sh", "-c"]
    confiner = [str(lnk_sandbox), "--policy", str(policy_file), "--", PYTHON, "-I", "-S", "-c"]
    result = subprocess.run(
        [*namespaces, 'ip link set lo up && exec "$@"', "sh", *confiner, script],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "echo:ping\nunix socket refused\n"


def test_a_symbolic_link_is_refused_in_a_write_grant_and_made_where_listed(
    lnk_sandbox: Path, tmp_path: Path
) -> None:
    grant, private = tmp_path / "grant", tmp_path / "private"
    grant.mkdir()
    private.mkdir()
    (grant / "file").write_text("x")
    results = _confined_python(
        lnk_sandbox,
        tmp_path,
        f"""
g, p = {str(grant)!r}, {str(private)!r}
attempt("link in the grant", lambda: os.symlink("/root/.ssh/authorized_keys", g + "/report.txt"))
attempt("file in the grant", lambda: open(g + "/new", "w").close())
attempt("link in the private place", lambda: os.symlink("/usr", p + "/l"))
attempt("link renamed into the grant", lambda: os.rename(p + "/l", g + "/l"))
attempt("hard link into the grant", lambda: os.link(p + "/l", g + "/h", follow_symlinks=False))
""",
        write=[str(grant), str(private)],
        symlink=[str(private)],
    )
    assert results == {
        "link in the grant": "EACCES",
        "file in the grant": "OK",
        "link in the private place": "OK",
        "link renamed into the grant": "EACCES",
        "hard link into the grant": "EACCES",
    }
    assert sorted(p.name for p in grant.iterdir()) == ["file", "new"]


def _run_argv_file(
    binary: Path, policy_file: Path, argv_file: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), "--policy", str(policy_file), "--argv", str(argv_file), "--"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_programs_argv_from_a_file_runs_it_and_leaves_no_command_line(
    lnk_sandbox: Path, tmp_path: Path
) -> None:
    """Another user reads every process's /proc/PID/cmdline: the confiner's holds only `--`,
    the program's own holds its arguments (an empty one and one with a tab kept as given)."""
    policy_file = _write(tmp_path, encode_policy(_policy(tmp_path)))
    argv = [PYTHON, "-I", "-S", "-c", "import sys; print(repr(sys.argv[1:]))", "", "a\tb"]
    argv_file = tmp_path / "argv"
    argv_file.write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    result = _run_argv_file(lnk_sandbox, policy_file, argv_file)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "['', 'a\\tb']\n"


@pytest.mark.parametrize("data", [b"", b"\0", b"/usr/bin/touch", b"\0/usr/bin/touch\0"], ids=repr)
def test_an_argv_file_without_a_program_runs_nothing(
    lnk_sandbox: Path, tmp_path: Path, data: bytes
) -> None:
    policy_file = _write(tmp_path, encode_policy(_policy(tmp_path)))
    argv_file = tmp_path / "argv"
    argv_file.write_bytes(data)
    result = _run_argv_file(lnk_sandbox, policy_file, argv_file)
    assert result.returncode == 126
    assert "does not hold a program and its arguments" in result.stderr


def test_a_missing_argv_file_runs_nothing(lnk_sandbox: Path, tmp_path: Path) -> None:
    policy_file = _write(tmp_path, encode_policy(_policy(tmp_path)))
    result = _run_argv_file(lnk_sandbox, policy_file, tmp_path / "none")
    assert result.returncode == 126
    assert "cannot read its arguments" in result.stderr


def _run_held(
    binary: Path, policy_file: Path, release: bytes | None, *target: str
) -> subprocess.CompletedProcess[str]:
    """The confiner told to wait on a pipe's read end (`--release-fd`), the pipe written
    `release` (None: nothing) and closed by this side before it is read."""
    read_end, write_end = os.pipe()
    try:
        if release is not None:
            os.write(write_end, release)
        os.close(write_end)
        write_end = -1
        held = [str(binary), "--policy", str(policy_file), "--release-fd", str(read_end), "--"]
        return subprocess.run(
            [*held, *target],
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            pass_fds=(read_end,),
        )
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def test_a_released_start_runs_the_target_without_the_release_descriptor(
    lnk_sandbox: Path, tmp_path: Path
) -> None:
    policy_file = _write(tmp_path, encode_policy(_policy(tmp_path)))
    script = "import os; print(sorted(os.listdir('/proc/self/fd')))"
    result = _run_held(lnk_sandbox, policy_file, b"R", PYTHON, "-I", "-S", "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "['0', '1', '2', '3']\n"  # 3: the listing's own descriptor


@pytest.mark.parametrize("release", [None, b"X", b"\0"], ids=["end of file", "X", "NUL"])
def test_a_start_the_controller_does_not_release_runs_nothing(
    lnk_sandbox: Path, tmp_path: Path, release: bytes | None
) -> None:
    """The controller abandoned the launch (a placeholder did not seal) or died: the pipe's
    end, or anything but the release byte, and the target never runs."""
    marker = tmp_path / "ran"
    policy_file = _write(tmp_path, encode_policy(_policy(tmp_path)))
    result = _run_held(lnk_sandbox, policy_file, release, TOUCH, str(marker))
    assert result.returncode == 126
    assert "the controller did not release it" in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize("value", ["", "2", "-1", "x3", "99999999"])
def test_a_wrong_release_descriptor_runs_nothing(lnk_sandbox: Path, value: str) -> None:
    result = subprocess.run(
        [str(lnk_sandbox), "--release-fd", value, "--", TOUCH, "/tmp/lnk-never"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 126
    assert "--release-fd must be a descriptor number" in result.stderr
    assert not os.path.exists("/tmp/lnk-never")
