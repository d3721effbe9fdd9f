"""The filtering proxy run alone, with no box around it: `python -m lnk_proxy` from this
checkout as its own user (nobody), its admin socket answering root as the controller, against
the test internet (`net.py`); and the raw clients its tests reach a listener with, the way a
sandbox's would: curl through a TCP-to-unix relay (what the in-sandbox relay does), and plain
requests over the unix socket itself.

    with alone_proxy(internet) as proxy:        # MAIN opened, granted WWW and the hostile names
        head, body = ask(proxy.socket_of(MAIN), get(WWW))
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from net import LOOP, META, MIXED, PRIVATE, REBIND, WWW, TestInternet

from lnk_shared.unix import recv_frame, send_frame

CHECKOUT = Path(__file__).resolve().parents[2]
SOURCES = ["shared", "services/proxy"]
PYTHON = Path(os.environ.get("LNK_PREFIX", "/opt/lnk")) / "venv" / "bin" / "python"
PROXY_UID = 65534  # nobody: neither root nor a sandbox uid, as the proxy demands
START_TIMEOUT_S = 15.0  # the proxy starts in well under a second
STOP_SEEN_S = 3.0  # the stop watcher polls every 0.5 s
IO_TIMEOUT_S = 10.0
LOG_WAIT_S = 2.0  # an allowed exchange's line follows its last byte by microseconds
SECRET = "e2e-secret-" + "0" * 32
MAIN = "sbx-main"


class Proxy:
    def __init__(self, base: Path, process: subprocess.Popen[bytes]) -> None:
        self.base = base
        self.process = process
        self.run_dir = base / "run"
        self.flags = self.run_dir / "flags"
        self.admin_socket = self.run_dir / "proxy" / "admin.sock"
        self.wire = base / "state" / "wire"

    def admin(self, message: dict[str, Any]) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(IO_TIMEOUT_S)
            sock.connect(str(self.admin_socket))
            send_frame(sock, message)
            return recv_frame(sock)[0]

    def socket_of(self, sandbox: str) -> Path:
        return self.run_dir / "proxy" / "sbx" / f"{sandbox}.sock"

    def open(self, sandbox: str, **grants: Any) -> Path:
        document = {"internet_any": False, "internet": [], "lan_any": False, "lan": []}
        document.update(grants)
        reply = self.admin(
            {
                "op": "open",
                "sandbox": sandbox,
                "socket": str(self.socket_of(sandbox)),
                "grants": document,
                "secret": SECRET,
            }
        )
        assert reply == {"ok": True}, reply
        return self.socket_of(sandbox)

    def log(self, sandbox: str, at_least: int = 0) -> list[dict[str, Any]]:
        """The sandbox's log lines, waiting a little for `at_least` of them: an allowed
        exchange's line is written just after its last byte went back."""
        path = self.wire / f"{sandbox}.log"
        deadline = time.monotonic() + LOG_WAIT_S
        while True:
            text = path.read_text(encoding="ascii") if path.exists() else ""
            lines = [json.loads(line) for line in text.splitlines()]
            if len(lines) >= at_least or time.monotonic() > deadline:
                return lines
            time.sleep(0.01)


@contextlib.contextmanager
def alone_proxy(internet: TestInternet) -> Iterator[Proxy]:
    """The proxy started alone on `internet`, with MAIN's listener open; stopped and its folder
    removed on the way out."""
    base = Path(tempfile.mkdtemp(prefix="lnkp", dir="/tmp"))  # short: unix socket paths
    try:
        os.chmod(base, 0o755)
        (base / "etc").mkdir()
        (base / "etc" / "proxy.toml").write_text(
            'unsafe_public_networks = ["198.18.0.0/15"]\n'
            f'unsafe_dns_table = "{internet.dns_file}"\n'
            "controller_uid = 0\nconnect_timeout_s = 3\n",
            encoding="utf-8",
        )
        for name in ("run", "state"):
            (base / name).mkdir(mode=0o755)
            os.chown(base / name, PROXY_UID, PROXY_UID)
        (base / "run" / "flags").mkdir(mode=0o755)  # the controller's, read by the proxy
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "PYTHONPATH": os.pathsep.join(str(CHECKOUT / s) for s in SOURCES),
            "LNK_CONFIG_DIR": str(base / "etc"),
            "LNK_RUN_DIR": str(base / "run"),
            "LNK_STATE_DIR": str(base / "state"),
        }
        stderr = (base / "proxy.err").open("wb")
        process = subprocess.Popen(
            [str(PYTHON), "-m", "lnk_proxy"],
            env=env,
            user=PROXY_UID,
            group=PROXY_UID,
            extra_groups=[],
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=stderr,
            cwd="/",
        )
        stderr.close()
        built = Proxy(base, process)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not built.admin_socket.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"the proxy did not start:\n{(base / 'proxy.err').read_text()}")
            time.sleep(0.05)
        assert built.admin({"op": "ping"}) == {"ok": True}
        built.open(MAIN, internet=[WWW, PRIVATE, LOOP, MIXED, META, REBIND])
        try:
            yield built
        finally:
            process.terminate()
            process.wait(10)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- clients ---------------------------------------------------------------------------------


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(IO_TIMEOUT_S)
    sock.connect(str(path))
    return sock


def read_response(sock: socket.socket | ssl.SSLSocket) -> tuple[bytes, bytes]:
    """One response with a Content-Length (or none for a 200 to CONNECT): (head, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError(f"closed after {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body


def ask(path: Path, request: bytes) -> tuple[bytes, bytes]:
    with connect(path) as sock:
        sock.sendall(request)
        return read_response(sock)


def get(host: str, path: str = "/", extra: str = "") -> bytes:
    return f"GET http://{host}{path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode()


def connect_request(authority: str) -> bytes:
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()


class Relay:
    """127.0.0.1:port -> the listener's unix socket, byte for byte: the in-sandbox relay."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.threads: list[threading.Thread] = []
        self._start(self._accept)

    def _start(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self._start(self._serve, client)

    def _serve(self, client: socket.socket) -> None:
        with client, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
            upstream.connect(str(self.path))
            down = threading.Thread(target=self._pump, args=(upstream, client))
            down.start()
            self._pump(client, upstream)
            down.join()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self.server.close()
        for thread in self.threads:
            thread.join(IO_TIMEOUT_S)


def curl(
    relay: Relay, internet: TestInternet, url: str, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *("curl", "-sS", "--max-time", "10", "-x", f"http://127.0.0.1:{relay.port}"),
            *("--cacert", str(internet.ca_file), *args, url),
        ],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )


def counts(internet: TestInternet) -> list[int]:
    time.sleep(0.1)  # a connection the proxy made would be logged by now
    return [internet.accepted(h) for h in (internet.www, internet.other, internet.nas)]
