"""'This machine' as the kernel routes it: the proxy runs (as nobody) in a network namespace the
test makes, its "machine", where the test then makes addresses local the ways an administrator
or a container manager does, and a sandbox with `[lan] *` tries to reach a bait server there.

    netns <p>m  (the proxy's machine)  lo: 10.91.1.1/24 (so all of 10.91.1.0/24 is local)
                                       local 10.91.2.0/24 dev lo, local fd91:2::/64 dev lo
                veth <p>ml 10.91.0.1/24 -- netns <p>l 10.91.0.2 (the LAN host: granted)
                bridge <p>br, added after the listener opened: 10.91.3.1/24 and a route
                10.91.4.0/24 dev <p>br, port <p>bp -- netns <p>g 10.91.3.2, 10.91.4.2 (a guest)

Each bait (`BAIT`, in its namespace) listens on every address of port 80 and logs each accepted
connection with the address it was accepted on: a refusal must come back as the proxy's 403
with its rule AND leave the bait without a connection. Every address is inside namespaces the
test owns: nothing reaches the host's network. `unsafe_skip_route_check` reopens the class,
and the same requests then reach the bait (the leak the route check closes).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # pytest's importlib mode adds no test dir
from proxy_alone import (
    CHECKOUT,
    IO_TIMEOUT_S,
    PROXY_UID,
    PYTHON,
    SOURCES,
    START_TIMEOUT_S,
    Proxy,
    ask,
    connect_request,
    get,
)

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

PREFIX = "lnkr"  # not net.py's: its leftover cleanup must never take these
SANDBOX = "sbx-routes"
PORT = 80
READY_S = 10.0  # a bait binds in well under a second
VIEW_FOLLOWS_S = 2.0  # a change message and one `ip` read (ms); the old timer took up to 30 s
LOG_SETTLE_S = 0.2  # a connection the proxy made reaches the bait's log within this
BAIT = r"""
import json, socket, sys, threading
log = open(sys.argv[1], "a", buffering=1)
server = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("::", int(sys.argv[2])))
server.listen(512)
print("ready", flush=True)

def serve(conn):
    with conn:
        conn.settimeout(5)
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbait\n")
        except OSError:
            pass

while True:
    conn, peer = server.accept()
    log.write(json.dumps({"local": conn.getsockname()[0], "peer": peer[0]}) + "\n")
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""
NAMES = {
    "lo-prefix.test-lan.example": ["10.91.1.7"],
    "local-route.test-lan.example": ["10.91.2.9"],
    "local-route6.test-lan.example": ["fd91:2::9"],
    "bridged.test-lan.example": ["10.91.3.2"],
    "bridge-route.test-lan.example": ["10.91.4.2"],
    "nas.test-lan.example": ["10.91.0.2"],
}
# For a proxy on the system resolver (`system_resolver=True`): the LAN host serves DNS.
RESOLV_CONF = "nameserver 10.91.0.2\noptions timeout:30 attempts:1\n"
HOSTS = "127.0.0.1 localhost\n::1 localhost\n10.91.0.2 nas.test-lan.example\n"
LOCAL = [  # (id, host, port form): each is delivered to this machine by the kernel
    ("lo_prefix", "10.91.1.7"),
    ("lo_prefix_by_name", "lo-prefix.test-lan.example"),
    ("local_route", "10.91.2.9"),
    ("local_route_by_name", "local-route.test-lan.example"),
    ("local_route_v6", "[fd91:2::9]"),
    ("local_route_v6_by_name", "local-route6.test-lan.example"),
]


def _ip(*args: str, netns: str | None = None) -> None:
    where = ["-n", netns] if netns else []
    done = subprocess.run(["ip", *where, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(where + list(args))}: {done.stderr.strip()}")


class Machine:
    """The namespaces, baits and proxy; `close` undoes all of it, also after a failed setup."""

    def __init__(
        self, *, skip_route_check: bool, system_resolver: bool = False, config: str = ""
    ) -> None:
        self.id = PREFIX + secrets.token_hex(3)
        self.machine, self.lan, self.guest = f"{self.id}m", f"{self.id}l", f"{self.id}g"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.namespaces: list[str] = []
        self.base = Path(tempfile.mkdtemp(prefix="lnkr", dir="/tmp"))  # short: socket paths
        os.chmod(self.base, 0o755)
        self.skip_route_check = skip_route_check
        self.system_resolver = system_resolver  # resolv.conf and hosts of its own (ip netns)
        self.config = config
        self.netns_etc = Path("/etc/netns") / self.machine
        self.baits: dict[str, Path] = {}

    def build(self) -> None:
        for netns in (self.machine, self.lan, self.guest):
            _ip("netns", "add", netns)
            self.namespaces.append(netns)
            _ip("link", "set", "lo", "up", netns=netns)
        m = self.machine
        _ip("addr", "add", "10.91.1.1/24", "dev", "lo", netns=m)
        _ip("route", "add", "local", "10.91.2.0/24", "dev", "lo", netns=m)
        _ip("-6", "route", "add", "local", "fd91:2::/64", "dev", "lo", netns=m)
        _ip(
            "link",
            "add",
            f"{self.id}ml",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            self.lan,
            netns=m,
        )
        _ip("addr", "add", "10.91.0.1/24", "dev", f"{self.id}ml", netns=m)
        _ip("link", "set", f"{self.id}ml", "up", netns=m)
        _ip("addr", "add", "10.91.0.2/24", "dev", "eth0", netns=self.lan)
        _ip("link", "set", "eth0", "up", netns=self.lan)
        for name in (self.machine, self.lan, self.guest):
            self.baits[name] = self._bait(name)
        self._proxy()

    def add_bridge(self) -> None:
        """A guests' bridge with a name no list knows, added while the proxy runs."""
        m, bridge, port = self.machine, f"{self.id}br", f"{self.id}bp"
        _ip("link", "add", bridge, "type", "bridge", netns=m)
        _ip(
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            self.guest,
            netns=m,
        )
        _ip("link", "set", port, "master", bridge, netns=m)
        _ip("addr", "add", "10.91.3.1/24", "dev", bridge, netns=m)
        for link in (bridge, port):
            _ip("link", "set", link, "up", netns=m)
        _ip("route", "add", "10.91.4.0/24", "dev", bridge, netns=m)  # no address of its own
        g = self.guest
        _ip("addr", "add", "10.91.3.2/24", "dev", "eth0", netns=g)
        _ip("addr", "add", "10.91.4.2/24", "dev", "eth0", netns=g)
        _ip("link", "set", "eth0", "up", netns=g)

    def _bait(self, netns: str) -> Path:
        log = self.base / f"bait-{netns}.log"
        log.touch()
        process = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-I", "-c", BAIT, str(log), str(PORT)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        self.processes.append(process)
        assert process.stdout is not None
        assert process.stdout.readline() == b"ready\n", f"the bait in {netns} did not start"
        return log

    def _proxy(self) -> None:
        etc, run, state = self.base / "etc", self.base / "run", self.base / "state"
        etc.mkdir()
        table = self.base / "dns.json"
        table.write_text(json.dumps(NAMES), encoding="utf-8")
        table.chmod(0o644)
        skip = "true" if self.skip_route_check else "false"
        names = "" if self.system_resolver else f'unsafe_dns_table = "{table}"\n'
        (etc / "proxy.toml").write_text(
            f"{names}controller_uid = 0\nconnect_timeout_s = 3\n"
            f"unsafe_skip_route_check = {skip}\n{self.config}",
            encoding="utf-8",
        )
        if self.system_resolver:  # `ip netns exec` binds these over /etc's
            self.netns_etc.mkdir(parents=True)
            (self.netns_etc / "resolv.conf").write_text(RESOLV_CONF, encoding="ascii")
            (self.netns_etc / "hosts").write_text(HOSTS, encoding="ascii")
        for folder in (run, state):
            folder.mkdir(mode=0o755)
            os.chown(folder, PROXY_UID, PROXY_UID)
        (run / "flags").mkdir(mode=0o755)
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "PYTHONPATH": os.pathsep.join(str(CHECKOUT / s) for s in SOURCES),
            "LNK_CONFIG_DIR": str(etc),
            "LNK_RUN_DIR": str(run),
            "LNK_STATE_DIR": str(state),
        }
        nobody = [f"--reuid={PROXY_UID}", f"--regid={PROXY_UID}", "--clear-groups"]
        self.stderr = self.base / "proxy.err"
        with self.stderr.open("wb") as err:
            process = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.machine,
                    "setpriv",
                    *nobody,
                    str(PYTHON),
                    "-m",
                    "lnk_proxy",
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                cwd="/",
            )
        self.processes.append(process)
        self.proxy = Proxy(self.base, process)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.proxy.admin_socket.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the proxy did not start:\n{self.stderr.read_text()}")
            time.sleep(0.05)
        self.socket = self.proxy.open(SANDBOX, lan_any=True)

    def accepted(self, netns: str) -> list[dict[str, Any]]:
        time.sleep(LOG_SETTLE_S)  # nothing to wait on for a connection that must not happen
        lines = self.baits[netns].read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines]

    def close(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(IO_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()
        for netns in self.namespaces:
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", netns)
        shutil.rmtree(self.netns_etc, ignore_errors=True)
        shutil.rmtree(self.base, ignore_errors=True)


@contextlib.contextmanager
def built(*, skip_route_check: bool, **options: Any) -> Iterator[Machine]:
    made = Machine(skip_route_check=skip_route_check, **options)
    try:
        made.build()
        yield made
    finally:
        made.close()


@pytest.fixture(scope="module")
def machine() -> Iterator[Machine]:
    with built(skip_route_check=False) as made:
        yield made


def request_for(host: str, form: str) -> bytes:
    return connect_request(f"{host}:{PORT}") if form == "connect" else get(f"{host}:{PORT}")


def assert_refused(made: Machine, host: str, form: str, rule: str, netns: str) -> None:
    before = len(made.accepted(netns))
    lines = len(made.proxy.log(SANDBOX))
    head, body = ask(made.socket, request_for(host, form))
    assert head.startswith(b"HTTP/1.1 403"), (host, form, head, body)
    assert body == f"lnk: refused ({rule})\n".encode(), (host, form, body)
    assert made.accepted(netns)[before:] == [], f"the bait saw {host} ({form})"
    new = [e for e in made.proxy.log(SANDBOX, lines + 1)[lines:] if e["decision"] == "refused"]
    assert [e["rule"] for e in new] == [rule] and new[0]["reason"]


@pytest.mark.parametrize("form", ["connect", "plain"])
def test_the_lan_host_is_reached(machine: Machine, form: str) -> None:
    for host in ("10.91.0.2", "nas.test-lan.example"):
        before = len(machine.accepted(machine.lan))
        with contextlib.closing(_connect(machine.socket)) as sock:
            sock.sendall(request_for(host, form))
            answer = _read_all(sock, b"bait\n") if form == "plain" else _tunnel(sock)
        assert answer.endswith(b"bait\n"), (host, form, answer)
        seen = machine.accepted(machine.lan)[before:]
        assert [s["local"].removeprefix("::ffff:") for s in seen] == ["10.91.0.2"]


@pytest.mark.parametrize("form", ["connect", "plain"])
@pytest.mark.parametrize("host", [h for _, h in LOCAL], ids=[i for i, _ in LOCAL])
def test_addresses_the_kernel_delivers_here_are_refused(
    machine: Machine, host: str, form: str
) -> None:
    assert_refused(machine, host, form, "never-this-machine", machine.machine)


def test_a_bridge_added_after_the_listener_opened_is_refused(machine: Machine) -> None:
    machine.add_bridge()
    for form in ("connect", "plain"):
        for host in ("10.91.3.2", "bridged.test-lan.example"):  # the bridge's own network
            assert_refused(machine, host, form, "never-local-network", machine.guest)
        for host in ("10.91.4.2", "bridge-route.test-lan.example"):  # a route out of it
            assert_refused(machine, host, form, "never-local-network", machine.guest)


def test_without_the_route_check_the_same_requests_reach_the_machine() -> None:
    """The attack works on a proxy that skips the route check (what the code before it did):
    the assertions above can fail."""
    with built(skip_route_check=True) as made:
        assert "unsafe_skip_route_check" in made.stderr.read_text()
        for host in ("10.91.1.7", "local-route.test-lan.example", "[fd91:2::9]"):
            with contextlib.closing(_connect(made.socket)) as sock:
                sock.sendall(request_for(host, "connect"))
                assert _tunnel(sock).endswith(b"bait\n"), host
        assert len(made.accepted(made.machine)) == 3
        made.add_bridge()
        with contextlib.closing(_connect(made.socket)) as sock:
            sock.sendall(request_for("10.91.4.2", "connect"))
            assert _tunnel(sock).endswith(b"bait\n")
        assert len(made.accepted(made.guest)) == 1
        # The machine view alone still follows the new bridge, told by netlink (no timer):
        # its own network is refused within VIEW_FOLLOWS_S of the change.
        deadline = time.monotonic() + VIEW_FOLLOWS_S
        while True:
            head, body = ask(made.socket, request_for("10.91.3.2", "connect"))
            if body == b"lnk: refused (never-local-network)\n" or time.monotonic() > deadline:
                break
        assert body == b"lnk: refused (never-local-network)\n", (head, body)


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(IO_TIMEOUT_S)
    sock.connect(str(path))
    return sock


def _read_all(sock: socket.socket, until: bytes) -> bytes:
    data = b""
    while not data.endswith(until):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _tunnel(sock: socket.socket) -> bytes:
    """Through an open CONNECT: one request to the bait, its whole answer (the 200 first)."""
    established = _read_all(sock, b"\r\n\r\n")
    if not established.startswith(b"HTTP/1.1 200"):
        return established
    sock.sendall(b"GET / HTTP/1.1\r\nHost: bait\r\n\r\n")
    return _read_all(sock, b"bait\n")


def test_an_interface_made_a_bridge_port_after_it_was_used_is_refused() -> None:
    """The proxy keeps each interface's netlink answer: it must forget it on the change, so the
    LAN's veth, once enslaved to a bridge, is a guests' link from the next request on."""
    with built(skip_route_check=False) as made:
        with contextlib.closing(_connect(made.socket)) as sock:
            sock.sendall(request_for("10.91.0.2", "connect"))
            assert _tunnel(sock).endswith(b"bait\n")  # the veth's answer is kept now
        bridge = f"{made.id}bx"
        _ip("link", "add", bridge, "type", "bridge", netns=made.machine)
        _ip("link", "set", f"{made.id}ml", "master", bridge, netns=made.machine)
        _ip("link", "set", bridge, "up", netns=made.machine)
        assert_refused(made, "10.91.0.2", "connect", "never-local-network", made.lan)
