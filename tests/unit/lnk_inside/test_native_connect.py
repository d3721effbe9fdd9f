"""The box's ssh connector in C (lnk_inside/native/lnk_connect.c), run for real against a stand-in
proxy on 127.0.0.1 here: its argument handling (a table, each bad one refused before it connects),
the one CONNECT it sends, the bytes both ways (the server's first bytes arriving with the proxy's
answer, a half-close), and a refusal said on stderr. What the proxy decides is tested with the
proxy (test_policy.py) and end to end (tests/e2e/test_git_ssh.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lnk_shared.native_build import CONNECTOR

TIMEOUT_S = 10.0
BANNER = b"SSH-2.0-standin\r\n"  # an ssh server speaks first
PAYLOAD = os.urandom(1 << 20)  # several pipe-fulls: the non-blocking path is exercised


@pytest.fixture(scope="module")
def connector(native_dir: Path) -> Path:
    return native_dir / CONNECTOR


@dataclass
class StandIn:
    port: int
    heads: list[bytes] = field(default_factory=list)
    accepted: int = 0


Answer = Callable[[socket.socket], None]


def _echo_after_eof(conn: socket.socket) -> None:
    """200, the banner in the same write, then everything read until EOF sent back."""
    conn.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n" + BANNER)
    got = b""
    while chunk := conn.recv(65536):
        got += chunk
    conn.sendall(got)


def _refuse(conn: socket.socket) -> None:
    body = b"lnk: refused (port-not-listed)\n"
    conn.sendall(
        b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
        % (len(body), body)
    )


@contextmanager
def stand_in(answer: Answer) -> Iterator[StandIn]:
    """A proxy stand-in on 127.0.0.1: records each request head, then `answer`s."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(TIMEOUT_S)
    state = StandIn(server.getsockname()[1])

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            state.accepted += 1
            with conn:
                conn.settimeout(TIMEOUT_S)
                head = b""
                while b"\r\n\r\n" not in head and (chunk := conn.recv(1)):
                    head += chunk
                state.heads.append(head)
                answer(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        # close() alone does not wake a thread blocked in accept() (it waited out TIMEOUT_S
        # at every test's end); shutdown() of a listening socket does, on Linux.
        with suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(TIMEOUT_S)
        assert not thread.is_alive()


def run(
    connector: Path, *args: str, proxy: str | None, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    env = {"PATH": "/usr/bin:/bin"} | ({"HTTP_PROXY": proxy} if proxy is not None else {})
    return subprocess.run(
        [str(connector), *args],
        input=stdin,
        env=env,
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )


# arguments, the exit status, what stderr says: each refused before anything is dialed
BAD_ARGUMENTS = [
    pytest.param((), 2, "expected two arguments", id="none"),
    pytest.param(("git.example",), 2, "expected two arguments", id="one"),
    pytest.param(("git.example", "22", "x"), 2, "expected two arguments", id="three"),
    pytest.param(("", "22"), 2, "HOST is not", id="empty-host"),
    pytest.param(("git example", "22"), 2, "HOST is not", id="space"),
    pytest.param(("git.example\r\nHost: x", "22"), 2, "HOST is not", id="crlf"),
    pytest.param(("user@git.example", "22"), 2, "HOST is not", id="userinfo"),
    pytest.param(("git.example/x", "22"), 2, "HOST is not", id="slash"),
    pytest.param(("[git.example]", "22"), 2, "HOST is not", id="bracketed-name"),
    pytest.param(("[::1", "22"), 2, "HOST is not", id="unbalanced"),
    pytest.param(("a" * 256, "22"), 2, "HOST is not", id="too-long"),
    pytest.param(("git.example", "0"), 2, "PORT is not", id="port-zero"),
    pytest.param(("git.example", "65536"), 2, "PORT is not", id="port-too-big"),
    pytest.param(("git.example", "-22"), 2, "PORT is not", id="port-negative"),
    pytest.param(("git.example", "+22"), 2, "PORT is not", id="port-sign"),
    pytest.param(("git.example", "22 "), 2, "PORT is not", id="port-space"),
    pytest.param(("git.example", "0x16"), 2, "PORT is not", id="port-hex"),
    pytest.param(("git.example", "000022"), 2, "PORT is not", id="port-six-digits"),
    pytest.param(("git.example", ""), 2, "PORT is not", id="port-empty"),
]


@pytest.mark.parametrize(("args", "status", "said"), BAD_ARGUMENTS)
def test_bad_arguments_are_refused_before_anything_is_dialed(
    connector: Path, args: tuple[str, ...], status: int, said: str
) -> None:
    with stand_in(_echo_after_eof) as proxy:
        done = run(connector, *args, proxy=f"http://127.0.0.1:{proxy.port}")
    assert done.returncode == status, done.stderr
    assert said in done.stderr.decode(), done.stderr
    assert b"usage: lnk-connect HOST PORT" in done.stderr
    assert done.stdout == b"" and proxy.accepted == 0


@pytest.mark.parametrize(
    "proxy",
    [
        None,
        "",
        "http://10.0.0.1:3128",  # not the sandbox's loopback relay
        "https://127.0.0.1:3128",
        "http://127.0.0.1:3128/x",
        "http://127.0.0.1:",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:3128@evil",
    ],
)
def test_without_the_sandboxs_proxy_it_says_so(connector: Path, proxy: str | None) -> None:
    done = run(connector, "git.example", "22", proxy=proxy)
    assert done.returncode == 1
    assert b"HTTP_PROXY is not a sandbox's proxy" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("host", "target"),
    [
        ("git.example", b"git.example:22"),
        ("GIT.Example.", b"GIT.Example.:22"),  # as ssh gave it: the proxy normalizes
        ("2001:db8::1", b"[2001:db8::1]:22"),  # a bare IPv6 literal is bracketed
        ("[2001:db8::1]", b"[2001:db8::1]:22"),
        ("192.0.2.7", b"192.0.2.7:22"),
    ],
)
def test_one_connect_then_bytes_both_ways(connector: Path, host: str, target: bytes) -> None:
    with stand_in(_echo_after_eof) as proxy:
        done = run(connector, host, "22", proxy=f"http://127.0.0.1:{proxy.port}/", stdin=PAYLOAD)
    assert done.returncode == 0, done.stderr
    assert proxy.heads == [b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)]
    # the banner that came with the answer first, then the echo sent after stdin's EOF
    # reached the server as a half-close
    assert done.stdout == BANNER + PAYLOAD
    assert done.stderr == b""


def test_a_refusal_is_said_with_its_rule_and_nothing_reaches_ssh(connector: Path) -> None:
    with stand_in(_refuse) as proxy:
        done = run(connector, "git.example", "22", proxy=f"http://127.0.0.1:{proxy.port}")
    assert done.returncode == 1
    assert done.stdout == b""
    said = done.stderr.decode()
    assert "did not open git.example:22: HTTP/1.1 403 Forbidden" in said, said
    assert "lnk: refused (port-not-listed)" in said


def test_a_proxy_that_is_not_there_is_named(connector: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = run(connector, "git.example", "22", proxy=f"http://127.0.0.1:{port}")
    assert done.returncode == 1
    assert f"cannot reach the sandbox's proxy at 127.0.0.1:{port}".encode() in done.stderr
