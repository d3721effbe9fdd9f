"""The wall, from inside: a sandbox sees no process outside it, reads no other environment, and
reaches no network and no host socket when it is granted none.

Every attack runs in a real sandbox of the session's box (`running_box`), as its real owner.
Where the attack aims at something outside, the outside end is real too (a process of the owner,
a listening TCP, UDP, DNS or unix socket) and the test checks it was never reached, not only that
the sandbox saw an error.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = pytest.mark.needs_root

PYTHON = "/usr/bin/python3"
OUTSIDE_SLEEP_S = "60"  # outlives every test here; killed in `finally`
EXEC_WAIT_S = 10.0  # how long setpriv may take to become the outside `sleep`


# -- the outside end ------------------------------------------------------------------------


@contextmanager
def _outside_process(box: RunningBox, env: dict[str, str] | None = None) -> Iterator[int]:
    """A `sleep` of the owner's, outside any sandbox; yields its pid."""
    owner = box.owner
    process = subprocess.Popen(
        as_user(owner.uid, owner.gid, "/bin/sleep", OUTSIDE_SLEEP_S),
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )
    try:
        deadline = time.monotonic() + EXEC_WAIT_S
        while os.readlink(f"/proc/{process.pid}/exe") != "/usr/bin/sleep":  # setpriv has exec'd
            assert time.monotonic() < deadline, "the outside sleep did not start"
            time.sleep(0.01)
        yield process.pid
    finally:
        process.kill()
        process.wait(timeout=10)


def _drain_accepts(server: socket.socket) -> int:
    """How many connections reached `server` (a listening socket) so far."""
    server.setblocking(False)
    count = 0
    while True:
        try:
            conn, _ = server.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def _drain_datagrams(server: socket.socket) -> int:
    server.setblocking(False)
    count = 0
    while True:
        try:
            server.recvfrom(65536)
        except BlockingIOError:
            return count
        count += 1


def _host_addresses() -> list[str]:
    """Every IPv4 address of this host: loopback and the others a sandbox could aim at."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    found = re.findall(r"\binet (\d+\.\d+\.\d+\.\d+)/", out)
    return sorted(set(found) | {"127.0.0.1"})


def _inside_python(box: RunningBox, code: str, *flags: str) -> dict[str, Any]:
    """Run `code` with Python in a sandbox; it prints one JSON document, returned here."""
    result = box.run(f"--command={PYTHON}", *flags, cmd=[PYTHON, "-I", "-c", code])
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return doc


# Python run inside: `attempt(name, fn)` records "ok" or the errno's name for each attack.
_PRELUDE = """
import errno, json, os, socket, sys
results = {}
def attempt(name, fn):
    try:
        fn()
        results[name] = "ok"
    except OSError as e:
        results[name] = errno.errorcode.get(e.errno, str(e.errno)) if e.errno else str(e)
    except Exception as e:
        results[name] = type(e).__name__ + ": " + str(e)
"""


# -- processes ------------------------------------------------------------------------------


def test_outside_process_is_not_listed_in_proc(running_box: RunningBox) -> None:
    with _outside_process(running_box) as pid:
        result = running_box.sh(
            "for p in /proc/[0-9]*; do echo ${p#/proc/} $(cat $p/comm); done; ls /proc"
        )
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        listed = {int(n) for n in re.findall(r"^(\d+)$", result.stdout, re.MULTILINE)}
        comms = {line.split()[1] for line in lines if re.match(r"^\d+ \S+$", line)}
        assert pid not in listed
        # Only the sandbox's own: bwrap's init, the shell, and what the shell ran.
        assert comms <= {"bwrap", "sh", "cat", "ls"}, comms
        assert len(listed) <= 4, listed


def test_kill_of_outside_pid_fails_and_it_survives(running_box: RunningBox) -> None:
    with _outside_process(running_box) as pid:
        result = running_box.sh(f"kill -9 {pid}; echo kill=$?; kill -0 {pid}; echo probe=$?")
        assert "kill=0" not in result.stdout, result.stdout
        assert "probe=0" not in result.stdout, result.stdout
        assert "kill=" in result.stdout, result.stderr
        os.kill(pid, 0)  # still alive outside (raises if it is gone)
        assert Path(f"/proc/{pid}").exists()


def test_kill_minus_one_from_inside_spares_outside_processes(running_box: RunningBox) -> None:
    with _outside_process(running_box) as pid:
        result = running_box.sh("kill -9 -1; echo done")
        assert result.returncode in (0, 137), result.stderr
        os.kill(pid, 0)
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            state = next(line for line in f if line.startswith("State:"))
        assert "Z" not in state.split()[1], state


def test_outside_process_environ_is_unreadable(running_box: RunningBox) -> None:
    secret = secrets.token_hex(16)
    with _outside_process(running_box, env={"LNK_TEST_SECRET": secret}) as pid:
        with open(f"/proc/{pid}/environ", "rb") as f:  # control: the secret is there outside
            assert secret.encode() in f.read()
        result = running_box.sh(
            f"cat /proc/{pid}/environ; echo rc=$?; cat /proc/[0-9]*/environ; "
            f"cat /proc/{pid}/cmdline /proc/{pid}/status"
        )
        assert secret not in result.stdout
        assert secret not in result.stderr
        assert "rc=0" not in result.stdout


# -- network --------------------------------------------------------------------------------


def test_tcp_connect_to_host_listener_fails_and_it_sees_nothing(running_box: RunningBox) -> None:
    addresses = _host_addresses()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("0.0.0.0", 0))
        server.listen(16)
        port = server.getsockname()[1]
        code = (
            _PRELUDE
            + f"""
def connect(host):
    with socket.create_connection((host, {port}), timeout=3):
        pass
for host in {addresses!r}:
    attempt("tcp " + host, lambda: connect(host))
print(json.dumps(results))
"""
        )
        results = _inside_python(running_box, code)
        assert _drain_accepts(server) == 0
        assert set(results) == {f"tcp {a}" for a in addresses}
        assert "ok" not in results.values(), results
        with socket.create_connection(("127.0.0.1", port), timeout=3):  # control: it listens
            pass
        assert _drain_accepts(server) == 1


def test_udp_sendto_host_reaches_nothing(running_box: RunningBox) -> None:
    addresses = _host_addresses()
    outward = [a for a in addresses if not a.startswith("127.")]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("0.0.0.0", 0))
        port = server.getsockname()[1]
        code = (
            _PRELUDE
            + f"""
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for host in {addresses!r} + ["192.0.2.1", "8.8.8.8"]:
    attempt("udp " + host, lambda: s.sendto(b"lnk-wall", (host, {port})))
print(json.dumps(results))
"""
        )
        results = _inside_python(running_box, code)
        assert _drain_datagrams(server) == 0
        # Loopback inside is the sandbox's own; any other address has no route at all.
        for host in [*outward, "192.0.2.1", "8.8.8.8"]:
            assert results[f"udp {host}"] != "ok", results
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:  # control
            client.sendto(b"control", ("127.0.0.1", port))
        assert _drain_datagrams(server) == 1


def test_icmp_and_raw_packet_sockets_are_refused(running_box: RunningBox) -> None:
    code = (
        _PRELUDE
        + """
def icmp(kind):
    s = socket.socket(socket.AF_INET, kind, socket.IPPROTO_ICMP)
    echo = b"\\x08\\x00\\xf7\\xff\\x00\\x00\\x00\\x00"
    s.sendto(echo, ("127.0.0.1", 0))
    s.sendto(echo, ("192.0.2.1", 0))
attempt("icmp raw", lambda: icmp(socket.SOCK_RAW))
attempt("icmp ping socket", lambda: icmp(socket.SOCK_DGRAM))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0x0300))
attempt("raw ipv6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_RAW, 58))
print(json.dumps(results))
"""
    )
    results = _inside_python(running_box, code)
    assert len(results) == 4
    assert "ok" not in results.values(), results


def test_dev_tcp_in_bash_reaches_no_host_listener(running_box: RunningBox) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        port = server.getsockname()[1]
        result = running_box.run(
            "--command=/bin/bash",
            cmd=[
                "/bin/bash",
                "-c",
                f"echo hi > /dev/tcp/127.0.0.1/{port} && echo CONNECTED; "
                f"exec 3<>/dev/tcp/localhost/{port} && echo CONNECTED",
            ],
        )
        assert "CONNECTED" not in result.stdout, result.stdout
        assert result.returncode != 0
        assert _drain_accepts(server) == 0


def _dns_answer(query: bytes) -> bytes:
    """A minimal DNS reply: the query echoed with QR set and one A record 192.0.2.77."""
    header = query[:2] + b"\x81\x80" + query[4:6] + b"\x00\x01\x00\x00\x00\x00"
    answer = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + bytes([192, 0, 2, 77])
    return header + query[12:] + answer


def test_dns_lookup_reaches_no_resolver(running_box: RunningBox) -> None:
    """Inside has no resolv.conf, so glibc asks 127.0.0.1:53: a resolver listens there on the
    host, and answers anyone who reaches it. Also a direct query to the host's own resolvers."""
    with open("/etc/resolv.conf", encoding="utf-8") as f:
        nameservers = re.findall(r"^nameserver\s+(\d+\.\d+\.\d+\.\d+)", f.read(), re.MULTILINE)
    outward = [n for n in nameservers if not n.startswith("127.")]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        udp.bind(("127.0.0.1", 53))
        tcp.bind(("127.0.0.1", 53))
        tcp.listen(16)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # control: it answers
            probe.settimeout(3)
            probe.sendto(
                b"\x12\x34\x01\x00\x00\x01" + b"\x00" * 6 + b"\x01x\x00\x00\x01\x00\x01",
                ("127.0.0.1", 53),
            )
            query, peer = udp.recvfrom(512)
            udp.sendto(_dns_answer(query), peer)
            assert probe.recvfrom(512)[0].endswith(bytes([192, 0, 2, 77]))
        query = (
            b"\xab\xcd\x01\x00\x00\x01" + b"\x00" * 6 + b"\x07example\x03com\x00\x00\x01\x00\x01"
        )
        code = (
            _PRELUDE
            + f"""
attempt("getaddrinfo", lambda: socket.getaddrinfo("lnk-wall-test.example.com", 80))
attempt("gethostbyname", lambda: socket.gethostbyname("example.com"))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for ns in {outward!r}:
    attempt("query " + ns, lambda: s.sendto({query!r}, (ns, 53)))
print(json.dumps(results))
"""
        )
        results = _inside_python(running_box, code)
        assert _drain_datagrams(udp) == 0
        assert _drain_accepts(tcp) == 0
        assert "ok" not in results.values(), results
        assert len(results) == 2 + len(outward)
    finally:
        udp.close()
        tcp.close()


# -- unix sockets ---------------------------------------------------------------------------


def test_connect_to_host_abstract_unix_socket_fails(running_box: RunningBox) -> None:
    name = f"lnk-test-{secrets.token_hex(6)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind("\0" + name)
        server.listen(16)
        code = (
            _PRELUDE
            + f"""
def stream():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect("\\0{name}")
def dgram():
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"x", "\\0{name}")
attempt("abstract stream", stream)
attempt("abstract dgram", dgram)
print(json.dumps(results))
"""
        )
        results = _inside_python(running_box, code)
        assert _drain_accepts(server) == 0
        assert set(results) == {"abstract stream", "abstract dgram"}
        assert "ok" not in results.values(), results
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:  # control
            client.connect("\0" + name)
        assert _drain_accepts(server) == 1


def test_connect_to_host_unix_socket_in_a_granted_folder_fails(running_box: RunningBox) -> None:
    folder = running_box.owner.home / "project" / "out"
    path = folder / f"s{secrets.token_hex(3)}.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        os.chmod(path, 0o777)
        server.listen(16)
        code = (
            _PRELUDE
            + f"""
import stat
results["visible"] = stat.S_ISSOCK(os.stat({str(path)!r}).st_mode)
def stream():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect({str(path)!r})
def dgram():
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"x", {str(path)!r})
attempt("path stream", stream)
attempt("path dgram", dgram)
print(json.dumps(results))
"""
        )
        results = _inside_python(running_box, code, f"--write={folder}")
        assert results.pop("visible") is True  # the socket is there, in a write grant
        assert _drain_accepts(server) == 0
        assert set(results) == {"path stream", "path dgram"}
        assert "ok" not in results.values(), results
    finally:
        server.close()
        with suppress(FileNotFoundError):
            path.unlink()


def test_socketpair_still_works_inside(running_box: RunningBox) -> None:
    code = """
import json, socket
a, b = socket.socketpair()
a.sendall(b"ping")
print(json.dumps({"got": b.recv(4).decode()}))
"""
    assert _inside_python(running_box, code) == {"got": "ping"}
