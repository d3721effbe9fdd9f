"""A test internet: hosts in network namespaces the test makes, reached from the root namespace
over veth pairs, and the DNS answer table the proxy's resolver uses in tests. Nothing here
sends a packet anywhere but into those namespaces.

    with TestInternet() as net:
        curl --noproxy '*' http://{net.www.address}/          # "www.test-public.example\n"
        curl --resolve {WWW}:443:{net.www.address} --cacert {net.ca_file} https://{WWW}/
        assert net.accepted(net.www) == 2

Layout (X and Y picked at random among the /24s no route, address or live TestInternet uses):

    netns <p><id>pub  198.18.X.2 www.test-public.example    veth <p><id>pr 198.18.X.1/24 (root)
                      198.18.X.3 other.test-public.example
    netns <p><id>lan  10.77.Y.2  nas.test-lan.example       veth <p><id>lr 10.77.Y.1/24  (root)

Each host runs `net_server.py` in its namespace: HTTP on 80, HTTPS on 443 (certificate from a
CA made at setup, `net_certs.py`, PEM in `net.ca_file`), and logs every accepted TCP
connection, so a test can assert that a target saw none (`net.accepted`). The namespaces have
no default route. While the context lives, root also holds an `unreachable` route per /24
(proto 76, metric 4095): should a veth vanish, traffic to its hosts fails here instead of
leaving by the default route.

`net.dns` (also `net.dns_file`, JSON `{name: [address, ...]}`) names the hosts plus hostile
answers: a public-looking name answering the LAN host, loopback, the metadata address, a mixed
answer, and `rebind.test-public.example`, which `net.rebind()` flips between www and the LAN.

Teardown (an ExitStack, also run when setup fails halfway) stops the servers, deletes the
namespaces, veths and guard routes, and removes the temp dir. A killed run's leftovers are
found by `cleanup_leftovers`, run at every setup: each instance's temp dir (`/tmp/<p><id>-*`)
holds `owner.json` (pid, start time, names, subnets), and whatever carries the prefix but no
live owner is removed. Choosing names and subnets is serialized by flock on LOCK_PATH, the one
file that stays (empty) after a run, waited for LOCK_WAIT_S at most (then the holder is named).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path
from types import TracebackType
from typing import Any

from net_certs import Certs

PREFIX = "lnkn"  # every netns, veth and temp dir of a TestInternet starts with it
MAX_PREFIX = 6  # prefix + 6 hex id + 3 = 15, the kernel's limit for interface names
LOCK_PATH = Path("/run/lnk-testnet.lock")
# Choosing names and subnets holds it for well under a second; a loaded machine's leftover
# clean-up a few seconds. Past two minutes its holder is stuck.
LOCK_WAIT_S = 120.0
LOCK_POLL_S = 0.05
OWNER_FILE = "owner.json"
REGISTRY = "lnk-testnet-"  # temp dirs: /tmp/lnk-testnet-<prefix><id>-*, each with OWNER_FILE
SERVER = Path(__file__).with_name("net_server.py")
PUBLIC_RANGE = IPv4Network("198.18.0.0/15")  # benchmarking range, standing in for the internet
LAN_RANGE = IPv4Network("10.77.0.0/16")
GUARD_PROTO = "76"  # marks our `unreachable` guard routes so leftovers can be found
GUARD_METRIC = "4095"  # above the connected route's 0, so the guard only acts once it is gone
HTTP_PORT = 80
HTTPS_PORT = 443
# Servers bind in ~0.1 s on a quiet machine; a Python start importing ssl and cryptography, a few
# at once, takes seconds on a loaded 2-core one (load 12 seen): past a minute, something is broken.
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 2.0  # a server answers SIGTERM at once; then SIGKILL

WWW = "www.test-public.example"
OTHER = "other.test-public.example"
NAS = "nas.test-lan.example"
PRIVATE = "private.test-public.example"  # public-looking name, private answer (the LAN host)
LOOP = "loop.test-public.example"  # answers 127.0.0.1
MIXED = "mixed.test-public.example"  # answers www and the LAN host
META = "meta.test-public.example"  # answers the cloud metadata address
REBIND = "rebind.test-public.example"  # answers www, or the LAN host after net.rebind()
TELEGRAM = "api.telegram.org"  # answers the other host: a Bot API shape (service rules' tests)
ANTHROPIC = "api.anthropic.com"  # answers the other host: its /v1/... is net_models.py's API
OPENAI = "api.openai.com"  # the same, OpenAI's shape
METADATA_ADDRESS = "169.254.169.254"


class NetSetupError(Exception):
    """The test internet could not be built; the message says which step failed and why."""


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    netns: str
    log: Path  # one JSON line per accepted connection

    def url(self, scheme: str = "http", path: str = "/") -> str:
        return f"{scheme}://{self.name}{path}"


@dataclass(frozen=True)
class Accepted:
    time: float
    peer: str
    peer_port: int
    port: int


class TestInternet:
    __test__ = False  # a library class, not a pytest test class

    def __init__(self, prefix: str = PREFIX) -> None:
        if not prefix.isalnum() or len(prefix) > MAX_PREFIX:
            raise ValueError(f"prefix must be 1-{MAX_PREFIX} letters or digits: {prefix!r}")
        self.prefix = prefix
        self._stack = ExitStack()
        self.hosts: dict[str, Host] = {}
        self.dns: dict[str, list[str]] = {}
        self.servers: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> TestInternet:
        try:
            self._build()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.close()

    # -- what a test uses ----------------------------------------------------------------

    @property
    def www(self) -> Host:
        return self.hosts[WWW]

    @property
    def other(self) -> Host:
        return self.hosts[OTHER]

    @property
    def nas(self) -> Host:
        return self.hosts[NAS]

    def host(self, which: Host | str) -> Host:
        """A host by Host, name or address."""
        if isinstance(which, Host):
            return which
        for host in self.hosts.values():
            if which in (host.name, host.address):
                return host
        raise KeyError(f"no host {which!r} in this test internet")

    def connections(self, which: Host | str) -> list[Accepted]:
        """Every TCP connection the host's listeners accepted, on any port, oldest first."""
        lines = self.host(which).log.read_text(encoding="utf-8").splitlines()
        return [Accepted(**json.loads(line)) for line in lines if line.endswith("}")]

    def requests(self, which: Host | str) -> list[dict[str, Any]]:
        """The Bot API and Authorization-carrying requests that reached `which` (its record)."""
        path = Path(f"{self.host(which).log}.requests")
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def model_requests(self, which: Host | str | None = None) -> list[dict[str, Any]]:
        """The hosted model API requests that reached `which` (default: the other host, which
        answers ANTHROPIC and OPENAI), oldest first: its own record (`net_models.py`)."""
        path = Path(f"{self.host(which or self.other).log}.models")
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def release(self, tag: str) -> None:
        """Let a streamed answer held on `hold:TAG` go on (`net_models.held`)."""
        (self.tmp / f"release-{tag}").touch()

    def accepted(self, which: Host | str, port: int | None = None) -> int:
        return sum(1 for c in self.connections(which) if port is None or c.port == port)

    def ended(self, which: Host | str) -> list[Accepted]:
        """The connections of `connections` that have ended (the host closed its side)."""
        path = self.host(which).log.with_name(self.host(which).log.name + ".ended")
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        return [Accepted(**json.loads(line)) for line in lines if line.endswith("}")]

    def rebind(self, private: bool | None = None) -> list[str]:
        """Flip REBIND's answer (or set it: private=True gives the LAN host); returns it."""
        now_private = self.dns[REBIND] == [self.nas.address]
        to_private = not now_private if private is None else private
        self.dns[REBIND] = [self.nas.address if to_private else self.www.address]
        self._write_dns()
        return self.dns[REBIND]

    def resolve_args(self, name: str, port: int = HTTPS_PORT) -> list[str]:
        """curl's `--resolve name:port:address` for a name with one answer."""
        (address,) = self.dns[name]
        return ["--resolve", f"{name}:{port}:{address}"]

    # -- building ------------------------------------------------------------------------

    def _build(self) -> None:
        with _locked():
            _cleanup_leftovers(self.prefix)
            claimed = {s for r in _live_records() for s in r["subnets"]}
            self.id = _new_id(self.prefix)
            self.public_subnet = _free_subnet(PUBLIC_RANGE, claimed)
            self.lan_subnet = _free_subnet(LAN_RANGE, claimed)
            base = f"{self.prefix}{self.id}"
            self.public_netns, self.lan_netns = f"{base}pub", f"{base}lan"
            self.public_veth, self.lan_veth = f"{base}pr", f"{base}lr"
            self.tmp = Path(tempfile.mkdtemp(prefix=f"{REGISTRY}{base}-"))
            self._stack.callback(shutil.rmtree, self.tmp, ignore_errors=True)
            self.tmp.chmod(0o755)  # the proxy's user reads dns.json, a sandbox's clients ca.pem
            owner = {
                "pid": os.getpid(),
                "start": _start_time(os.getpid()),
                "names": [self.public_netns, self.lan_netns, self.public_veth, self.lan_veth],
                "subnets": [str(self.public_subnet), str(self.lan_subnet)],
            }
            _write_atomically(self.tmp / OWNER_FILE, json.dumps(owner))
        pub, lan = self.public_subnet, self.lan_subnet
        self.hosts = {
            WWW: Host(WWW, str(pub[2]), self.public_netns, self.tmp / "www.log"),
            OTHER: Host(OTHER, str(pub[3]), self.public_netns, self.tmp / "other.log"),
            NAS: Host(NAS, str(lan[2]), self.lan_netns, self.tmp / "nas.log"),
        }
        self.public_gateway, self.lan_gateway = str(pub[1]), str(lan[1])
        self.dns = {
            WWW: [self.www.address],
            OTHER: [self.other.address],
            NAS: [self.nas.address],
            PRIVATE: [self.nas.address],
            LOOP: ["127.0.0.1"],
            MIXED: [self.www.address, self.nas.address],
            META: [METADATA_ADDRESS],
            REBIND: [self.www.address],
            TELEGRAM: [self.other.address],
            ANTHROPIC: [self.other.address],
            OPENAI: [self.other.address],
        }
        self.dns_file = self.tmp / "dns.json"
        self._write_dns()
        self._segment(self.public_netns, self.public_veth, pub, [self.www, self.other])
        self._segment(self.lan_netns, self.lan_veth, lan, [self.nas])
        self.ca_file = self.tmp / "ca.pem"
        certs = Certs(self.id)
        _write_atomically(self.ca_file, certs.pem)
        self._start_servers(certs)

    def _segment(self, netns: str, outer: str, subnet: IPv4Network, hosts: list[Host]) -> None:
        """A namespace holding `hosts`, its veth to root, root's side on subnet's first address."""
        inner = outer[:-1] + "n"
        guard = ("route", "del", "unreachable", str(subnet), "proto", GUARD_PROTO)
        self._stack.callback(_ip, *guard, "metric", GUARD_METRIC, check=False)
        self._stack.callback(_ip, "link", "del", outer, check=False)
        self._stack.callback(_ip, "netns", "del", netns, check=False)
        prefixlen = subnet.prefixlen
        _ip_batch(
            [
                f"route add unreachable {subnet} proto {GUARD_PROTO} metric {GUARD_METRIC}",
                f"netns add {netns}",
                f"link add {outer} type veth peer name {inner} netns {netns}",
                f"addr add {subnet[1]}/{prefixlen} dev {outer}",
                f"link set {outer} up",
            ]
        )
        _ip_batch(
            ["link set lo up"]
            + [f"addr add {h.address}/{prefixlen} dev {inner}" for h in hosts]
            + [f"link set {inner} up"],
            netns=netns,
        )
        for host in hosts:
            route = _ip_json("route", "get", host.address)
            if not route or route[0].get("dev") != outer:
                raise NetSetupError(f"{host.address} is not routed to {outer}: {route}")

    def _start_servers(self, certs: Certs) -> None:
        for host in self.hosts.values():
            cert, key = certs.issue(host, self._cert_names(host), self.tmp)
            config = self.tmp / f"{host.log.stem}.json"
            https = {"cert": str(cert), "key": str(key)}
            config.write_text(
                json.dumps(
                    {
                        "name": host.name,
                        "address": host.address,
                        "ports": {str(HTTP_PORT): None, str(HTTPS_PORT): https},
                        "log": str(host.log),
                        "parent_pid": os.getpid(),
                    }
                )
            )
            host.log.touch()
            err = os.open(self.tmp / f"{host.log.stem}.err", os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                argv = ["ip", "netns", "exec", host.netns, sys.executable, "-I", str(SERVER)]
                server = subprocess.Popen(
                    [*argv, str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=err,
                )
            finally:
                os.close(err)
            self._stack.callback(_stop, server)
            self.servers.append(server)
        deadline = time.monotonic() + READY_TIMEOUT_S
        for host, server in zip(self.hosts.values(), self.servers, strict=True):
            line = _read_line(server, deadline)
            if line != b"ready\n":
                stderr = (self.tmp / f"{host.log.stem}.err").read_text(errors="replace")
                try:  # a server whose stdout closed is ending: its status says why
                    status: int | None = server.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    status = None
                why = (
                    f"ended with status {status}"
                    if status is not None
                    else f"was not ready within {READY_TIMEOUT_S:.0f} s (it said {line!r})"
                )
                raise NetSetupError(f"the server of {host.name} did not start: it {why}\n{stderr}")

    def _cert_names(self, host: Host) -> list[str]:
        """Every name that answers the host's address, now or after a rebind."""
        names = [name for name, answer in self.dns.items() if host.address in answer]
        if host is self.nas:
            names.append(REBIND)
        return sorted(names)

    def _write_dns(self) -> None:
        _write_atomically(self.dns_file, json.dumps(self.dns, indent=1))


# -- leftovers -------------------------------------------------------------------------------


def cleanup_leftovers(prefix: str = PREFIX) -> list[str]:
    """Remove what a killed run left (namespaces, veths, guard routes, temp dirs whose owner
    process is gone, and their processes); a live TestInternet's are kept. Returns what went."""
    with _locked():
        return _cleanup_leftovers(prefix)


def live_subnets() -> set[IPv4Network]:
    """The subnets of every TestInternet (of any prefix) whose owner process still runs."""
    return {IPv4Network(s) for r in _live_records() for s in r["subnets"]}


def routes_within(network: IPv4Network) -> list[str]:
    """Every route of every table inside `network` (the default route is not inside)."""
    return [r["dst"] for r in _ip_json("route", "show", "table", "all", "root", str(network))]


def netns_names() -> list[str]:
    return [entry["name"] for entry in _ip_json("netns", "list")]


def link_names() -> list[str]:
    """Interfaces of the root namespace."""
    return [link["ifname"] for link in _ip_json("link", "show")]


def _cleanup_leftovers(prefix: str) -> list[str]:
    removed = []
    for directory in Path(tempfile.gettempdir()).glob(f"{REGISTRY}{prefix}*-*"):
        record = _read_owner(directory)
        if record is None or not _alive(record):
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(str(directory))
    records = _live_records()  # of every prefix: a shorter prefix must not take a longer's
    live_names = {name for r in records for name in r["names"]}
    live = {subnet for r in records for subnet in r["subnets"]}
    for netns in netns_names():
        if netns.startswith(prefix) and netns not in live_names:
            for pid in _ip("netns", "pids", netns, check=False).stdout.split():
                with suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", netns, check=False)
            removed.append(f"netns {netns}")
    for name in link_names():
        if name.startswith(prefix) and name not in live_names:
            _ip("link", "del", name, check=False)
            removed.append(f"link {name}")
    for route in _ip_json("route", "show", "table", "all", "proto", GUARD_PROTO):
        dst = route["dst"]
        if route.get("type") == "unreachable" and dst not in live:
            _ip("route", "del", "unreachable", dst, "proto", GUARD_PROTO, check=False)
            removed.append(f"route {dst}")
    return removed


def _live_records() -> list[dict[str, Any]]:
    records = []
    for directory in Path(tempfile.gettempdir()).glob(f"{REGISTRY}*-*"):
        record = _read_owner(directory)
        if record is not None and _alive(record):
            records.append(record)
    return records


def _read_owner(directory: Path) -> dict[str, Any] | None:
    try:
        record: dict[str, Any] = json.loads((directory / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record


def _alive(record: dict[str, Any]) -> bool:
    return bool(_start_time(int(record["pid"])) == record["start"])


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat): pid plus start
    time names one process, even after its pid is reused. None once it has died (a zombie
    not yet reaped has died too)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


# -- plumbing --------------------------------------------------------------------------------


@contextmanager
def _locked(path: Path = LOCK_PATH, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """`path` flocked for the block, waited for at most `wait_s`: a holder that never lets go
    (a run stopped under a debugger, a hung `ip`) fails the setup, naming itself, instead of
    hanging every test internet on the machine."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:  # flock has no timeout of its own; each try is one call that never blocks
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    held = ", ".join(_lock_holders(fd)) or "a process this namespace cannot see"
                    raise NetSetupError(
                        f"{path} is still locked after {wait_s:g} s, by {held}: another "
                        "TestInternet is choosing names and subnets; end it if it is stuck"
                    ) from None
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)


def _lock_holders(fd: int) -> list[str]:
    """Who holds a lock on the file open at `fd`: `pid N (its command line)` for each holder in
    /proc/locks (the kernel's table of every lock, by device and inode), waiters left out."""
    info = os.fstat(fd)
    node = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    holders = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[5] != node:
            continue
        pid = fields[4]
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip()
        except OSError:
            argv = b"?"
        holders.append(f"pid {pid} ({argv.decode(errors='replace')})")
    return holders


def _new_id(prefix: str) -> str:
    taken = set(netns_names()) | set(link_names())
    while True:
        tag = secrets.token_hex(3)
        if not any(name.startswith(prefix + tag) for name in taken):
            return tag


def _free_subnet(within: IPv4Network, claimed: set[str]) -> IPv4Network:
    """A random /24 of `within` that no route (but the default), address or live instance
    covers or overlaps."""
    candidates = list(within.subnets(new_prefix=24))
    for _ in range(64):
        subnet = secrets.choice(candidates)
        if str(subnet) in claimed:
            continue
        inside = routes_within(subnet)
        covering = [
            r["dst"]
            for r in _ip_json("route", "show", "table", "all", "match", str(subnet))
            if r["dst"] != "default"
        ]
        if not inside and not covering:
            return subnet
    raise NetSetupError(f"no free /24 in {within}: clean up with cleanup_leftovers()")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise NetSetupError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def _ip_batch(commands: list[str], netns: str | None = None) -> None:
    """Several `ip` commands in one process (each fork of `ip` costs ~2 ms)."""
    where = ["-n", netns] if netns else []
    result = subprocess.run(
        ["ip", *where, "-batch", "-"],
        input="\n".join(commands) + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise NetSetupError(f"ip {' '.join(where)} -batch failed: {result.stderr.strip()}")


def _ip_json(*args: str) -> list[dict[str, Any]]:
    out = _ip("-j", *args).stdout.strip()
    parsed: list[dict[str, Any]] = json.loads(out) if out else []
    return parsed


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.chmod(0o644)  # public test data, read by the proxy's own user
    partial.replace(path)


def _read_line(server: subprocess.Popen[bytes], deadline: float) -> bytes:
    """The server's first line of stdout, or what it said by then if it ends or the deadline
    passes first: never a wait past the deadline (select bounds every read)."""
    assert server.stdout is not None
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([server.stdout], [], [], left)[0]:
            return line
        chunk = os.read(server.stdout.fileno(), 64)
        if not chunk:
            return line
        line += chunk
    return line


def _stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if server.stdout is not None:
        server.stdout.close()
