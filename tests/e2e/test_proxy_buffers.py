"""A sandbox whose tunnels never read cannot pin the shared proxy's kernel memory: each tunnel's
buffers are fixed (`lnk_proxy.tunnel_buffers`) and a sandbox's tunnels reserve at most its
budget; past it a CONNECT is refused (`too-much-buffer`, in the wire log), never hung, and
another sandbox is still served.

The proxy runs as nobody in a namespace of its own (`test_proxy_routes.Machine`); the LAN host
of that namespace runs `STALLER`: every connection to it is sent bytes without end and never
read. The sandbox's client never reads either and sends until its socket is full, so both
directions of every tunnel stall. The proxy's kernel memory is measured from outside: every
socket the proxy's process holds (`ss -m`: receive, send and send-queue memory, TCP in the
proxy's namespace, unix in this one, where a connecting client's namespace puts the accepted
end) plus the bytes in every pipe it holds (taken with pidfd_getfd, read with FIONREAD).

Before the fix every tunnel was opened and each pinned tens of MiB (the origin socket's receive
buffer autotuned to tcp_rmem's maximum): the count and the bound both failed.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import fcntl
import os
import re
import socket
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # pytest's importlib mode adds no test dir
from proxy_alone import IO_TIMEOUT_S, ask, connect_request, get
from test_proxy_routes import SANDBOX, Machine, _tunnel, built

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

MiB = 1024 * 1024
BUDGET = 32 * MiB  # the proxy's tunnel_buffer_budget_bytes here: small, so the test is quick
# lnk_proxy.tunnel_buffers: a large tunnel reserves 8 MiB, a small one 512 KiB, large ones at
# most a quarter of the budget: 1 large and 48 small fit in 32 MiB.
FITTING = 1 + (BUDGET - 8 * MiB) // (512 * 1024)
TRIED = FITTING + 11
STALLER_PORT = PORT = 9001
HTTP_STALLER_PORT = 9002  # the same, behind an HTTP answer head: plain http's stall
# lnk_proxy.tunnel_buffers.PLAIN's worst case: 256 KiB each way doubled, the unix default send
PLAIN_WORST = 2 * (512 * 1024) + 212_992
PLAIN_FITTING = BUDGET // PLAIN_WORST
PLAIN_TRIED = PLAIN_FITTING + 8
STALL_SETTLED_S = 1.0  # the memory counted no higher for this long: every buffer is full
STALL_DEADLINE_S = 30.0  # full within seconds: 49 tunnels at a few MiB each
SYS_PIDFD_GETFD = 438  # the same number on every architecture (the unified syscall table)
STALLER = r"""
import socket, sys, threading
server = socket.create_server(("0.0.0.0", int(sys.argv[1])), backlog=256)
chunk = b"x" * (1 << 20)
held = []

def flood(conn):
    try:
        while True:
            conn.sendall(chunk)  # blocks once every buffer on the way is full
    except OSError:
        pass

print("ready", flush=True)
while True:
    conn, _ = server.accept()
    held.append(conn)  # never read
    threading.Thread(target=flood, args=(conn,), daemon=True).start()
"""
# An origin whose every answer is a head, then a body without end (the request never read on).
HEAD_FIRST = b"HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n"
HTTP_STALLER = STALLER.replace(
    "    held.append(conn)  # never read\n",
    f"    held.append(conn)\n    conn.recv(65536)\n    conn.sendall({HEAD_FIRST!r})\n",
)


@pytest.fixture
def machine() -> Iterator[Machine]:
    config = f"max_tunnels_per_sandbox = {2 * TRIED}\ntunnel_buffer_budget_bytes = {BUDGET}\n"
    with built(skip_route_check=False, config=config) as made:
        for program, port in ((STALLER, PORT), (HTTP_STALLER, HTTP_STALLER_PORT)):
            process = subprocess.Popen(
                ["ip", "netns", "exec", made.lan, sys.executable, "-I", "-c", program, str(port)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
            )
            made.processes.append(process)  # ended by made.close()
            assert process.stdout is not None
            assert process.stdout.readline() == b"ready\n", "the staller did not start"
        yield made


def _skmem(args: list[str], pid: int) -> int:
    """Receive, send and send-queue bytes of every socket `ss` lists for `pid`."""
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    entries = re.split(r"\n(?=\S)", out)  # a continuation line starts with whitespace
    total = 0
    for entry in entries:
        if f"pid={pid}," not in entry:
            continue
        mem = re.search(r"skmem:\(r(\d+),rb\d+,t(\d+),tb\d+,f\d+,w(\d+)", entry)
        assert mem is not None, entry
        total += sum(int(n) for n in mem.groups())
    return total


def _pipe_bytes(pid: int) -> int:
    """The bytes in every pipe `pid` holds (each pipe once, whichever end)."""
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    pidfd = os.pidfd_open(pid)
    seen: set[str] = set()
    total = 0
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{name}")
            except FileNotFoundError:
                continue  # closed meanwhile
            if not link.startswith("pipe:") or link in seen:
                continue
            seen.add(link)
            local = syscall(SYS_PIDFD_GETFD, pidfd, int(name), 0)
            if local < 0:
                continue  # closed meanwhile
            try:
                count = array.array("i", [0])
                fcntl.ioctl(local, termios.FIONREAD, count)
                total += count[0]
            finally:
                os.close(local)
    finally:
        os.close(pidfd)
    return total


def kernel_memory(made: Machine) -> int:
    pid = made.proxy.process.pid  # `ip netns exec` and setpriv exec: the proxy's own
    tcp = ["ip", "netns", "exec", made.machine, "ss", "-t", "-m", "-p", "-n", "-H"]
    unix = ["ss", "-x", "-m", "-p", "-n", "-H"]
    return _skmem(tcp, pid) + _skmem(unix, pid) + _pipe_bytes(pid)


def _stall(sock: socket.socket) -> None:
    """Send until the socket is full: nothing on the way reads."""
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:
            sock.send(b"y" * 65536)


def _head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(1)  # one at a time: nothing of the tunnel's bytes is taken
        if not more:
            break
        data += more
    return data


def _peak(made: Machine, idle: int) -> int:
    """The proxy's kernel memory once every buffer on the way is full (counted no higher for
    STALL_SETTLED_S), less what it held idle."""
    peak, settled_at = 0, time.monotonic()
    deadline = time.monotonic() + STALL_DEADLINE_S
    while time.monotonic() - settled_at < STALL_SETTLED_S:
        assert time.monotonic() < deadline, f"still growing at {peak} bytes"
        now = kernel_memory(made) - idle
        if now > peak:
            peak, settled_at = now, time.monotonic()
    return peak


def test_unread_plain_http_answers_keep_the_proxys_kernel_memory_under_the_budget(
    machine: Machine,
) -> None:
    """Plain http GETs whose answers never end and are never read: each exchange reserves its
    origin socket's fixed buffers from the same budget. Before, their origin sockets autotuned
    (tens of MiB each) and nothing counted them: every one was served."""
    made = machine
    idle = kernel_memory(made)
    with contextlib.ExitStack() as stack:
        heads = []
        for _ in range(PLAIN_TRIED):
            sock = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            sock.settimeout(IO_TIMEOUT_S)
            sock.connect(str(made.socket))
            sock.sendall(get(f"10.91.0.2:{HTTP_STALLER_PORT}"))
            heads.append(_head(sock))  # then never read again
        served = [h for h in heads if h.startswith(b"HTTP/1.1 200")]
        refused = [h for h in heads if h.startswith(b"HTTP/1.1 403")]
        assert len(served) == PLAIN_FITTING, [h[:40] for h in heads]
        assert len(refused) == PLAIN_TRIED - PLAIN_FITTING
        peak = _peak(made, idle)
        assert peak <= BUDGET, f"{peak / MiB:.1f} MiB pinned by unread plain http answers"
        assert peak > PLAIN_FITTING * 256 * 1024, peak  # the stall is real
    refusals = [e for e in made.proxy.log(SANDBOX) if e["rule"] == "too-much-buffer"]
    assert len(refusals) >= 1 and refusals[0]["method"] == "GET", refusals


def test_unread_tunnels_keep_the_proxys_kernel_memory_under_the_budget(machine: Machine) -> None:
    made = machine
    idle = kernel_memory(made)
    with contextlib.ExitStack() as stack:
        heads = []
        for _ in range(TRIED):
            sock = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            sock.settimeout(IO_TIMEOUT_S)
            sock.connect(str(made.socket))
            sock.sendall(connect_request(f"10.91.0.2:{STALLER_PORT}"))
            head = _head(sock)
            heads.append(head)
            if head.startswith(b"HTTP/1.1 200"):
                _stall(sock)
        opened = [h for h in heads if h.startswith(b"HTTP/1.1 200")]
        refused = [h for h in heads if h.startswith(b"HTTP/1.1 403")]
        assert len(opened) == FITTING, heads
        assert len(refused) == TRIED - FITTING
        # Every buffer on the way fills; the most it holds is what is counted.
        peak, settled_at = 0, time.monotonic()
        deadline = time.monotonic() + STALL_DEADLINE_S
        while time.monotonic() - settled_at < STALL_SETTLED_S:
            assert time.monotonic() < deadline, f"still growing at {peak} bytes"
            now = kernel_memory(made) - idle
            if now > peak:
                peak, settled_at = now, time.monotonic()
        assert peak <= BUDGET, f"{peak / MiB:.1f} MiB pinned by unread tunnels"
        assert peak > FITTING * 64 * 1024, peak  # the stall is real: every tunnel holds bytes
        # Another sandbox is served meanwhile: a plain request and a tunnel of its own.
        other = made.proxy.open("sbx-other", lan_any=True)
        head, body = ask(other, get("nas.test-lan.example"))
        assert (head.split(b"\r\n")[0], body) == (b"HTTP/1.1 200 OK", b"bait\n")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(IO_TIMEOUT_S)
            sock.connect(str(other))
            sock.sendall(connect_request("10.91.0.2:80"))
            assert _tunnel(sock).endswith(b"bait\n")
    refusals = [e for e in made.proxy.log(SANDBOX) if e["rule"] == "too-much-buffer"]
    assert refusals and refusals[0]["decision"] == "refused", refusals
    assert "sbx-other" not in str(refusals)
