"""The in-sandbox relay in C (lnk_inside/native/relay.c), run for real against unix-socket servers
here.

`lnk-sandbox --relay SOCKET PORT` (conftest builds it once per session) serves the way the
proxy benchmark runs it; a small harness compiled from relay.c calls `relay_start` as the
confiner does, for the `[localhost]` CONNECT handshake and the detached relay process. No
network namespace is needed: the relay listens on 127.0.0.1 of this one.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from lnk_shared.native_build import CFLAGS, CONFINER, native_folder, sources_of

TIMEOUT_S = 10.0
PAYLOAD = 3 << 20  # random bytes each way: several pipe-fulls, so the pipe grows
IDLE_CONNECTIONS = 200
IDLE_KIB_PER_CONNECTION = 64  # loose: its thread's few touched stack pages measure ~5
STARTED = "relay started"

# relay_start as the confiner calls it: `harness SOCKET PORT:LOCALHOST...` listens on each
# PORT (LOCALHOST 0: the proxy itself), detaches the relay, checks the listeners were closed
# here, and exits, leaving the relay running in this process group. HANDSHAKE_MS in its
# environment shortens the wait for a `[localhost]` answer (the confiner's is RELAY_HANDSHAKE_MS).
HARNESS = r"""
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include "relay.h"

int main(int argc, char **argv) {
    int listeners[8] = {0}, ports[8] = {0};
    size_t count = 0;
    for (int i = 2; i < argc && count < 8; i++, count++) {
        int port;
        if (sscanf(argv[i], "%d:%d", &port, &ports[count]) != 2)
            return 2;
        if ((listeners[count] = relay_listen(port)) < 0) {
            perror("relay_listen");
            return 1;
        }
    }
    const char *handshake = getenv("HANDSHAKE_MS");
    int handshake_ms = handshake != NULL ? atoi(handshake) : RELAY_HANDSHAKE_MS;
    if (relay_start(argv[1], listeners, ports, count, handshake_ms) != 0) {
        perror("relay_start");
        return 1;
    }
    for (size_t i = 0; i < count; i++)
        if (fcntl(listeners[i], F_GETFD) != -1 || errno != EBADF)
            return 3;
    puts("relay started");
    return 0;
}
"""


@pytest.fixture(scope="session")
def relay_binary(lnk_sandbox: Path) -> Path:
    """lnk-sandbox from this checkout (conftest builds it once per session)."""
    return lnk_sandbox


@pytest.fixture(scope="session")
def harness_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("harness")
    (folder / "harness.c").write_text(HARNESS)
    out = folder / "relay-harness"
    # the confiner's sources but its main: the relay and what it links
    relay = [path for path in sources_of(CONFINER) if Path(path).name != "lnk_sandbox.c"]
    include = native_folder("lnk_inside")
    subprocess.run(
        ["cc", *CFLAGS, f"-I{include}", "-o", str(out), f"{folder}/harness.c", *relay],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    """Until the port is in LISTEN state (read from /proc: a probe connection would reach the
    server behind the relay and count as a client)."""
    entry = f"0100007F:{port:04X} 00000000:0000 0A"
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if entry in Path("/proc/net/tcp").read_text():
            return
        assert process.poll() is None, "the relay exited"
        time.sleep(0.01)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


Handler = Callable[[socket.socket], None]


class UnixServer:
    """A real unix-socket server (the proxy's place): each connection to its own handler."""

    def __init__(self, path: Path, handler: Handler) -> None:
        self.path, self.handler = path, handler
        self.accepted = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(512)
        self.threads: list[threading.Thread] = []
        self.closing = False
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            thread = threading.Thread(target=self._run, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _run(self, conn: socket.socket) -> None:
        with conn, suppress(OSError):
            conn.settimeout(TIMEOUT_S)
            self.handler(conn)

    def close(self) -> None:
        with suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.acceptor.join(TIMEOUT_S)
        for thread in self.threads:
            thread.join(TIMEOUT_S)


@contextmanager
def unix_server(path: Path, handler: Handler) -> Iterator[UnixServer]:
    server = UnixServer(path, handler)
    try:
        yield server
    finally:
        server.close()


@contextmanager
def relay(binary: Path, socket_path: Path, *prefix: str) -> Iterator[tuple[int, int]]:
    """`lnk-sandbox --relay SOCKET PORT` on a free port: (port, pid); killed at the end.
    `prefix`: a command that execs it (prlimit), so the pid is still the relay's."""
    port = free_port()
    process = subprocess.Popen(
        [*prefix, str(binary), "--relay", str(socket_path), str(port)],
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, process)
        yield port, process.pid
    finally:
        process.kill()
        process.wait(TIMEOUT_S)


@contextmanager
def detached_relay(
    harness: Path, socket_path: Path, *pairs: str, handshake_ms: int | None = None
) -> Iterator[None]:
    """relay_start through the harness; the detached relay is killed with its process group."""
    process = subprocess.Popen(
        [str(harness), str(socket_path), *pairs],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        start_new_session=True,
        env={} if handshake_ms is None else {"HANDSHAKE_MS": str(handshake_ms)},
    )
    try:
        # EOF on stdout while the relay lives: it kept none of the caller's stdio.
        out, _ = process.communicate(timeout=TIMEOUT_S)
        assert process.returncode == 0, f"harness exited {process.returncode}"
        assert out.decode().strip() == STARTED
        yield
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(TIMEOUT_S)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), TIMEOUT_S)


def receive_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def received_until_closed(sock: socket.socket) -> bytes:
    """Bytes until the peer closed: a close with unread bytes arrives as a reset."""
    chunks = []
    with suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def echo(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_bytes_both_ways_arrive_intact(relay_binary: Path, tmp_path: Path) -> None:
    sent_up, sent_down = os.urandom(PAYLOAD), os.urandom(PAYLOAD)
    received_up: list[bytes] = []
    upward_ended = threading.Event()  # the server read the client's end of stream

    def read_upward(conn: socket.socket) -> None:
        received_up.append(receive_all(conn))
        upward_ended.set()

    def handler(conn: socket.socket) -> None:
        reader = threading.Thread(target=read_upward, args=(conn,))
        reader.start()
        conn.sendall(sent_down)
        conn.shutdown(socket.SHUT_WR)
        reader.join(TIMEOUT_S)

    path = tmp_path / "proxy.sock"
    with (
        unix_server(path, handler),
        relay(relay_binary, path) as (port, _),
        connect(port) as client,
    ):
        writer = threading.Thread(target=client.sendall, args=(sent_up,))
        writer.start()
        received_down = receive_all(client)
        writer.join(TIMEOUT_S)
        assert not writer.is_alive(), "the relay stopped taking the client's bytes"
        # The relay is torn down only once the server has read everything up to the client's
        # end: torn down earlier, bytes still in flight would be lost by the test, not the relay.
        client.shutdown(socket.SHUT_WR)
        assert upward_ended.wait(TIMEOUT_S), "the client's end of stream never reached the server"
    assert digest(received_down) == digest(sent_down)
    assert [digest(data) for data in received_up] == [digest(sent_up)]


def test_half_close_is_passed_on_each_way(relay_binary: Path, tmp_path: Path) -> None:
    seen: list[bytes] = []

    def handler(conn: socket.socket) -> None:
        seen.append(receive_all(conn))  # ends only when the client's half-close arrives
        conn.sendall(b"answer after your end")
        conn.shutdown(socket.SHUT_WR)
        seen.append(conn.recv(1))  # nothing more: the relay closed its side

    path = tmp_path / "proxy.sock"
    with unix_server(path, handler) as server, relay(relay_binary, path) as (port, _):
        with connect(port) as client:
            client.sendall(b"request")
            client.shutdown(socket.SHUT_WR)
            assert receive_all(client) == b"answer after your end"
        server.close()
    assert seen == [b"request", b""]


@pytest.mark.parametrize("state", ["absent", "refused"])
def test_no_proxy_socket_closes_the_client_and_the_relay_goes_on(
    relay_binary: Path, tmp_path: Path, state: str
) -> None:
    path = tmp_path / "proxy.sock"
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if state == "refused":  # a socket file nobody listens on: ECONNREFUSED
        bound.bind(str(path))
    with bound, relay(relay_binary, path) as (port, _):
        with connect(port) as client:
            client.sendall(b"GET http://example.com/ HTTP/1.1\r\n\r\n")
            assert received_until_closed(client) == b""
        bound.close()
        path.unlink(missing_ok=True)
        with unix_server(path, echo), connect(port) as client:
            client.sendall(b"later")
            assert client.recv(5) == b"later"


def read_head(conn: socket.socket) -> bytes | None:
    """The relay's CONNECT head, byte by byte (nothing after it is read); None at EOF."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(1)
        if not chunk:
            return None
        head += chunk
    return head


def localhost_proxy(answer: bytes, requests: list[bytes], *, relays: bool) -> Handler:
    """A proxy's side of `[localhost]`: read the CONNECT head, answer; then echo (`relays`),
    or end its side and record what the relay sent after the answer."""

    def handler(conn: socket.socket) -> None:
        head = read_head(conn)
        if head is None:
            return
        requests.append(head)
        if relays:
            conn.sendall(answer)
            echo(conn)
            return
        with suppress(OSError):  # a relay that gave up early may have closed already
            conn.sendall(answer)
            conn.shutdown(socket.SHUT_WR)
        requests.append(received_until_closed(conn))

    return handler


def test_localhost_port_relays_after_the_proxys_200(harness_binary: Path, tmp_path: Path) -> None:
    """The CONNECT names the port; bytes the proxy sends right after its answer (a server that
    speaks first) reach the client; then bytes flow both ways."""
    requests: list[bytes] = []
    answer = b"HTTP/1.1 200 Connection established\r\n\r\nSSH-2.0-banner\r\n"
    path, proxy_port, localhost_port = tmp_path / "proxy.sock", free_port(), free_port()
    pairs = (f"{proxy_port}:0", f"{localhost_port}:5432")
    with (
        unix_server(path, localhost_proxy(answer, requests, relays=True)),
        detached_relay(harness_binary, path, *pairs),
        connect(localhost_port) as client,
    ):
        received = b""
        while len(received) < len(b"SSH-2.0-banner\r\n"):
            received += client.recv(64)
        assert received == b"SSH-2.0-banner\r\n"
        client.sendall(b"hello")
        assert client.recv(5) == b"hello"
    expected = b"CONNECT localhost:5432 HTTP/1.1\r\nHost: localhost:5432\r\n\r\n"
    assert requests == [expected]


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 9\r\n\r\nrefused\r\n",
        b"HTTP/1.1 2000 Odd\r\n\r\n",
        b"HTTP/2 200\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * 5000 + b"\r\n\r\n",  # past 4096 bytes of head
        b"HTTP/1.1 200 OK\r\n",  # then the proxy closes, the head unfinished
    ],
    ids=["403", "2000", "http2", "head-too-long", "head-cut"],
)
def test_localhost_port_refused_closes_without_relaying_a_byte(
    harness_binary: Path, tmp_path: Path, answer: bytes
) -> None:
    requests: list[bytes] = []
    path, port = tmp_path / "proxy.sock", free_port()
    with (
        unix_server(path, localhost_proxy(answer, requests, relays=False)),
        detached_relay(harness_binary, path, f"{port}:8080"),
    ):
        with connect(port) as client:
            client.sendall(b"client bytes that must not pass")
            assert received_until_closed(client) == b""
        deadline = time.monotonic() + TIMEOUT_S
        while len(requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert requests == [b"CONNECT localhost:8080 HTTP/1.1\r\nHost: localhost:8080\r\n\r\n", b""]


def test_a_proxy_that_never_answers_localhost_is_given_up_on(
    harness_binary: Path, tmp_path: Path
) -> None:
    """No answer to the CONNECT within the handshake time: the relay closes both sides (its
    thread ends) instead of waiting as long as the sandbox lives; not a byte is relayed."""
    heads: list[bytes] = []
    after: list[bytes] = []

    def silent_proxy(conn: socket.socket) -> None:
        head = read_head(conn)
        if head is None:
            return
        heads.append(head)
        after.append(received_until_closed(conn))  # the relay hangs up: EOF, nothing else

    path, port = tmp_path / "proxy.sock", free_port()
    with (
        unix_server(path, silent_proxy),
        detached_relay(harness_binary, path, f"{port}:8080", handshake_ms=300),
        connect(port) as client,
    ):
        client.sendall(b"client bytes that must not pass")
        began = time.monotonic()
        assert received_until_closed(client) == b""
        waited = time.monotonic() - began
        deadline = time.monotonic() + TIMEOUT_S
        while not after and time.monotonic() < deadline:
            time.sleep(0.01)
    assert heads == [b"CONNECT localhost:8080 HTTP/1.1\r\nHost: localhost:8080\r\n\r\n"]
    assert after == [b""]
    assert waited < TIMEOUT_S  # given up on, not left hanging until the test's own timeout


def test_the_proxy_port_of_a_detached_relay_relays_raw(
    harness_binary: Path, tmp_path: Path
) -> None:
    path, port = tmp_path / "proxy.sock", free_port()
    with (
        unix_server(path, echo),
        detached_relay(harness_binary, path, f"{port}:0"),
        connect(port) as client,
    ):
        client.sendall(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n")
        assert client.recv(100) == b"CONNECT example.com:443 HTTP/1.1\r\n\r\n"


def test_many_concurrent_connections_each_intact(relay_binary: Path, tmp_path: Path) -> None:
    count, size = 100, 256 * 1024
    failures: list[str] = []

    def one(number: int) -> None:
        data = os.urandom(size)
        try:
            with connect(port) as client:
                writer = threading.Thread(target=client.sendall, args=(data,))
                writer.start()
                client_received = b""
                while len(client_received) < size:
                    chunk = client.recv(65536)
                    if not chunk:
                        break
                    client_received += chunk
                writer.join(TIMEOUT_S)
            if digest(client_received) != digest(data):
                failures.append(f"{number}: {len(client_received)} bytes back")
        except OSError as error:
            failures.append(f"{number}: {error}")

    path = tmp_path / "proxy.sock"
    with unix_server(path, echo) as server, relay(relay_binary, path) as (port, _):
        clients = [threading.Thread(target=one, args=(n,)) for n in range(count)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(TIMEOUT_S * 3)
        assert server.accepted == count
    assert failures == []


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_idle_connections_cost_little_memory(relay_binary: Path, tmp_path: Path) -> None:
    release = threading.Event()
    path = tmp_path / "proxy.sock"

    def hold(conn: socket.socket) -> None:
        release.wait(TIMEOUT_S * 6)

    with unix_server(path, hold) as server, relay(relay_binary, path) as (port, pid):
        clients: list[socket.socket] = []
        try:
            clients.append(connect(port))  # the first connection's one-time costs (malloc)
            wait_accepted(server, 1)
            before = rss_kib(pid)
            clients += [connect(port) for _ in range(IDLE_CONNECTIONS)]
            wait_accepted(server, IDLE_CONNECTIONS + 1)
            time.sleep(0.2)  # every connection's thread reaches its poll
            after = rss_kib(pid)
        finally:
            release.set()
            for client in clients:
                client.close()
    per_connection = (after - before) / IDLE_CONNECTIONS
    assert per_connection < IDLE_KIB_PER_CONNECTION, f"{before} -> {after} KiB"


def wait_accepted(server: UnixServer, count: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while server.accepted < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.accepted == count


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_out_of_descriptors_the_relay_waits_without_spinning(
    relay_binary: Path, tmp_path: Path
) -> None:
    """With its descriptors used up, a queued connection waits (the relay does not spin on a
    failing accept), and is served once a descriptor is free again."""
    path = tmp_path / "proxy.sock"
    # stdio, the listener, the relaying thread's epoll set and hand-over pipe (3), one
    # connection's two sockets and two pipes
    limit = "--nofile=13:13"
    with (
        unix_server(path, echo),
        relay(relay_binary, path, "prlimit", limit) as (port, pid),
        connect(port) as first,
    ):
        first.sendall(b"one")
        assert first.recv(3) == b"one"
        with connect(port) as second:  # queued: the kernel completes the handshake
            second.sendall(b"two")
            start = cpu_seconds(pid)
            time.sleep(1.0)
            assert cpu_seconds(pid) - start < 0.3  # a spinning accept would use ~1 s
            first.close()
            assert second.recv(3) == b"two"


PIDFD_GETFD = 438  # the same number on x86_64 and the generic table (aarch64)


def relays_socket_to(pid: int, client: socket.socket) -> socket.socket:
    """The relay's own end of `client`'s TCP connection, copied out of it (pidfd_getfd: this
    test is the relay's parent, as root or its own user may)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            fd = libc.syscall(PIDFD_GETFD, pidfd, int(name), 0)
            if fd < 0:
                continue
            copy = socket.socket(fileno=fd) if stat.S_ISSOCK(os.fstat(fd).st_mode) else None
            if copy is None:
                os.close(fd)
                continue
            with suppress(OSError):
                if copy.family == socket.AF_INET and copy.getpeername() == client.getsockname():
                    return copy
            copy.close()
    finally:
        os.close(pidfd)
    raise AssertionError("the relay holds no socket of this connection")


def test_the_sandbox_side_has_nodelay_and_many_small_round_trips_stay_whole(
    relay_binary: Path, tmp_path: Path
) -> None:
    """The accepted TCP socket has TCP_NODELAY (an answer written in two pieces is not held
    back by Nagle); and small round trips of every size up to past a pipe-full, each answered
    at once, arrive whole (the relay goes back to epoll after a short read: nothing waits)."""
    path = tmp_path / "proxy.sock"
    with unix_server(path, echo), relay(relay_binary, path) as (port, pid), connect(port) as sock:
        sock.sendall(b"hello")
        assert sock.recv(5) == b"hello"
        theirs = relays_socket_to(pid, sock)
        with theirs:
            assert theirs.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        for size in (1, 2, 90, 160, 4095, 4096, 4097, 65535, 65536, 65537, 200_000, 3):
            message = os.urandom(size)
            sock.sendall(message)
            got = b""
            while len(got) < size:
                chunk = sock.recv(size - len(got))
                assert chunk, f"closed after {len(got)} of {size}"
                got += chunk
            assert got == message
