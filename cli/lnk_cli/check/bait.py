"""The bait `lnk sandbox check` sets up outside a sandbox, as the calling user, and removes.

- a file holding a fresh random secret in the home, in the box's settings (`~/.lnk`), in
  `/var/tmp`, and in each hidden folder at the top of the home, agents' folders among them
  (folders that do not exist yet, `~/.lnk`, `~/.ssh` and the agents', are made for the run and
  removed after, so every run checks them);
- a TCP server on one random port of 127.0.0.1, ::1 and this machine's first address, and an
  abstract unix socket, each logging what it accepted and the first line it was sent;
- a program outside (`cat`, owned by the caller) holding a secret in its environment; it reads
  a pipe from this process, so it ends with it even if this process is killed.

Every bait file is world-readable (0644): only the wall stands between it and a sandbox, never
the file's mode. `remove()` undoes everything that was made, in reverse, and is safe to call
twice; `with Bait.set_up(...)` calls it on the way out, whatever the way out is.

What this does NOT do: block signals (the command does, around `remove`), or survive SIGKILL
of this process (the files stay then; each is named `lnk-check-*`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import selectors
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lnk_shared.errors import StateError
from lnk_shared.paths import AGENT_FOLDERS, USER_SETTINGS_DIR

__all__ = ["Bait", "BaitFile", "BaitServer", "Listener", "machine_networks"]

PREFIX = "lnk-check-"  # every file, folder and socket name the check makes
SECRET_BYTES = 32  # a secret of 64 hex characters: never guessed, never met by chance
BAIT_MODE = 0o644  # world-readable: the wall, not the mode, must keep it in
VAR_TMP = "/var/tmp"  # noqa: S108 - shared scratch space is one of the seed's bait places
PORT_TRIES = 20  # random ports tried until one is free on every listening address
PORT_LOW, PORT_SPAN = 20000, 12000  # below the kernel's ephemeral range (32768-60999)
LINE_LIMIT = 256  # bytes of the first line a connection sends (a probe's id)
LINE_TIMEOUT_S = 2.0  # a probe sends its line at once after connecting
OUTSIDE_PROGRAM = "/bin/cat"  # reads its stdin (our pipe) until we close it or end


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


def _secret() -> str:
    return secrets.token_hex(SECRET_BYTES)


@dataclass(frozen=True)
class BaitFile:
    id: str
    path: str
    secret: str


@dataclass(frozen=True)
class Listener:
    label: str
    host: str
    port: int


@dataclass(frozen=True)
class Accepted:
    label: str
    peer: str
    line: str


def machine_networks() -> list[ipaddress.IPv4Interface]:
    """This machine's global IPv4 addresses with their networks (`ip -j addr`)."""
    try:
        out = subprocess.run(
            ["/usr/bin/ip", "-j", "-4", "addr", "show", "scope", "global"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
        links = json.loads(out or "[]")
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    found = []
    for link in links:
        for info in link.get("addr_info", []):
            with contextlib.suppress(KeyError, ValueError):
                found.append(ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}"))
    return found


class BaitServer:
    """Listeners on one port of several addresses plus an abstract unix socket; a thread logs
    every connection accepted and the first line it sends."""

    def __init__(self, machine_address: str | None, avoid: frozenset[int] = frozenset()) -> None:
        self._avoid = avoid
        self.accepted: list[Accepted] = []
        self.abstract_name = PREFIX + secrets.token_hex(8)
        self._lock = threading.Lock()
        self._readers: list[threading.Thread] = []
        self._sockets: list[tuple[str, socket.socket]] = []
        self._stop_r, self._stop_w = os.pipe()
        self.listeners: list[Listener] = []
        self.port = self._bind_all(machine_address)
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind("\0" + self.abstract_name)
        unix.listen(16)
        self._sockets.append(("abstract", unix))
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _bind_all(self, machine_address: str | None) -> int:
        wanted = [("127.0.0.1", socket.AF_INET)]
        if _has_ipv6_loopback():
            wanted.append(("::1", socket.AF_INET6))
        if machine_address:
            wanted.append((machine_address, socket.AF_INET))
        free = [p for p in range(PORT_LOW, PORT_LOW + PORT_SPAN) if p not in self._avoid]
        for _ in range(PORT_TRIES if free else 0):
            port = secrets.choice(free)
            made: list[tuple[str, socket.socket]] = []
            try:
                for host, family in wanted:
                    s = socket.socket(family, socket.SOCK_STREAM)
                    made.append((host, s))
                    if family == socket.AF_INET6:
                        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                    s.bind((host, port))
                    s.listen(64)
            except OSError:
                for _, s in made:
                    s.close()
                continue
            self._sockets += made
            self.listeners = [Listener(host, host, port) for host, _ in made]
            return port
        raise StateError("no free port for the bait server on this machine's addresses")

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        for label, s in self._sockets:
            s.setblocking(False)
            selector.register(s, selectors.EVENT_READ, label)
        selector.register(self._stop_r, selectors.EVENT_READ, None)
        try:
            while True:
                for key, _ in selector.select():
                    if key.data is None:
                        return
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    with contextlib.suppress(BlockingIOError, OSError):
                        conn, peer = sock.accept()
                        self._start_reader(key.data, conn, peer)
        finally:
            selector.close()

    def _start_reader(self, label: str, conn: socket.socket, peer: object) -> None:
        reader = threading.Thread(target=self._read_line, args=(label, conn, peer), daemon=True)
        self._readers.append(reader)
        reader.start()

    def _read_line(self, label: str, conn: socket.socket, peer: object) -> None:
        line = b""
        with conn:
            conn.setblocking(True)
            conn.settimeout(LINE_TIMEOUT_S)
            with contextlib.suppress(OSError):
                while b"\n" not in line and len(line) < LINE_LIMIT:
                    chunk = conn.recv(LINE_LIMIT)
                    if not chunk:
                        break
                    line += chunk
        with self._lock:
            self.accepted.append(Accepted(label, str(peer), line.split(b"\n")[0].decode("latin-1")))

    def finish(self) -> list[Accepted]:
        """Stop serving, accept what still waits in the backlogs, wait for each first line;
        return the whole log."""
        self._halt()
        for label, s in self._sockets:
            while True:
                try:
                    conn, peer = s.accept()
                except OSError:
                    break
                self._start_reader(label, conn, peer)
        for reader in self._readers:
            reader.join(timeout=LINE_TIMEOUT_S + 1)
        with self._lock:
            return list(self.accepted)

    def _halt(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        self._thread.join(timeout=5)

    def close(self) -> None:
        self._halt()
        for _, s in self._sockets:
            s.close()
        for fd in (self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._sockets = []


LOCAL_TABLES = (
    ("/usr/bin/ip", "-j", "-4", "route", "show", "table", "local", "type", "local"),
    ("/usr/bin/ip", "-j", "-6", "route", "show", "table", "local", "type", "local"),
)
MAX_LOCAL_ROUTED = 4  # addresses probed from local prefixes: one per prefix is the class


def locally_routed(routes: object) -> list[str]:
    """From `ip -j route show table local type local`: one address per local prefix (a prefix
    on `lo`, an AnyIP `local` route) that no interface holds and that is not loopback, i.e.
    one this machine answers that only the kernel's routing says is this machine's."""
    if not isinstance(routes, list):
        return []
    own, prefixes = set(), []
    for route in routes:
        dst = route.get("dst") if isinstance(route, dict) else None
        try:
            network = ipaddress.ip_network(str(dst), strict=False)
        except ValueError:
            continue
        if network.num_addresses == 1:
            own.add(network.network_address)
        elif network.num_addresses >= 4 and not network.network_address.is_loopback:
            prefixes.append(network)
    found = []
    for network in prefixes:
        for offset in range(2, 6):
            candidate = network.network_address + offset
            if candidate not in own:
                found.append(str(candidate))
                break
    return found[:MAX_LOCAL_ROUTED]


def local_routed_addresses() -> list[str]:
    """`locally_routed` of this machine's IPv4 and IPv6 local tables; [] when `ip` fails."""
    found: list[str] = []
    for argv in LOCAL_TABLES:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=True)
            found += locally_routed(json.loads(done.stdout or "[]"))
        except (OSError, subprocess.SubprocessError, ValueError):
            continue
    return found[:MAX_LOCAL_ROUTED]


@dataclass
class Bait:
    """Everything set up outside; `remove()` takes it all away again."""

    home: str
    files: list[BaitFile] = field(default_factory=list)
    made_dirs: list[str] = field(default_factory=list)  # made for the run, removed after
    ssh_dir: str = ""
    ssh_names: list[str] = field(default_factory=list)
    server: BaitServer | None = None
    outside: subprocess.Popen[bytes] | None = None
    outside_secret: str = ""
    leftovers: list[str] = field(default_factory=list)  # paths a probe may have made
    machine: list[ipaddress.IPv4Interface] = field(default_factory=list)
    local_routed: list[str] = field(default_factory=list)  # `locally_routed` addresses
    skipped: list[str] = field(default_factory=list)  # hidden folders the caller cannot write

    @classmethod
    @contextlib.contextmanager
    def set_up(cls, home: str, avoid_ports: frozenset[int] = frozenset()) -> Iterator[Bait]:
        bait = cls(home=home)
        try:
            bait.make(avoid_ports)
            yield bait
        finally:
            bait.remove()

    # -- making ------------------------------------------------------------------------------

    def _file(self, ident: str, folder: str) -> None:
        path = os.path.join(folder, PREFIX + secrets.token_hex(6))
        secret = _secret()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, BAIT_MODE)
        self.files.append(BaitFile(ident, path, secret))  # recorded before a byte is written
        try:
            os.fchmod(fd, BAIT_MODE)  # whatever the umask says
            os.write(fd, f"lnk check bait {secret}\n".encode())
        finally:
            os.close(fd)

    def _folder(self, path: str) -> str:
        """`path`, made (and recorded for removal) if it is missing, parents included."""
        missing = []
        walk = path
        while not os.path.lexists(walk):
            missing.append(walk)
            walk = os.path.dirname(walk)
        for folder in reversed(missing):
            os.mkdir(folder, 0o700)
            self.made_dirs.append(folder)
        return path

    def make(self, avoid_ports: frozenset[int] = frozenset()) -> None:
        """Set everything up; what was made before a failure is recorded for `remove()`."""
        home = self.home
        self.machine = machine_networks()
        self.local_routed = local_routed_addresses()
        self._file("read.home", home)
        self._file("read.settings", self._folder(os.path.join(home, USER_SETTINGS_DIR)))
        self._file("read.var-tmp", VAR_TMP)
        self.ssh_dir = self._folder(os.path.join(home, ".ssh"))
        for folder in AGENT_FOLDERS:
            self._file(f"read.agents:{folder}", self._folder(os.path.join(home, folder)))
        with os.scandir(home) as entries:
            hidden = sorted(
                e.name
                for e in entries
                if e.name.startswith(".") and e.is_dir(follow_symlinks=False)
            )
        for name in hidden:
            if name == USER_SETTINGS_DIR:
                continue
            try:
                self._file(f"read.hidden:~/{name}", os.path.join(home, name))
            except PermissionError:  # not the caller's to write (root's, say): said, not fatal
                self.skipped.append(f"~/{name}")
        self.ssh_names = sorted(os.listdir(self.ssh_dir))
        address = str(self.machine[0].ip) if self.machine else None
        self.server = BaitServer(address, avoid_ports)
        self.outside_secret = _secret()
        self.outside = subprocess.Popen(
            [OUTSIDE_PROGRAM],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", "LNK_CHECK_BAIT": self.outside_secret},
            close_fds=True,
        )

    # -- removing ----------------------------------------------------------------------------

    def remove(self) -> list[str]:
        """Remove every bait and every path a probe may have made; return what could not be."""
        problems: list[str] = []
        if self.outside is not None:
            with contextlib.suppress(OSError):
                self.outside.kill()
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self.outside.wait(timeout=5)
            if self.outside.stdin is not None:
                with contextlib.suppress(OSError):
                    self.outside.stdin.close()
            self.outside = None
        if self.server is not None:
            self.server.close()
            self.server = None
        for path in [*self.leftovers, *(f.path for f in self.files)]:
            problem = remove_path(path)
            if problem:
                problems.append(problem)
        self.leftovers.clear()
        self.files.clear()
        for folder in reversed(self.made_dirs):
            try:
                os.rmdir(folder)
            except FileNotFoundError:
                pass
            except OSError as exc:
                problems.append(f"{folder}: {exc.strerror}")
        self.made_dirs.clear()
        return problems


def remove_path(path: str) -> str | None:
    """Remove a file or folder a probe or the bait made, never following a link in it (a
    sandbox may have planted one); None when done or already gone."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    return None


def listing(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def home_of(uid: int) -> str:
    import pwd

    return str(Path(pwd.getpwuid(uid).pw_dir))
