"""The filtering proxy end to end: `python -m lnk_proxy` running as its own user (nobody), told
by its admin socket to open per-sandbox listeners, against the test internet (`net.py`).

Clients reach a listener the way a sandbox's would: curl through a TCP-to-unix relay (what the
in-sandbox relay does), and raw requests or Python's ssl over the unix socket itself. Every
refusal must come back as the one 403 with its rule id AND leave every host of the test
internet without a new connection. No traffic leaves for a real address: the proxy's resolver
is the test table (`unsafe_dns_table`) and 198.18.0.0/15 counts as public only here
(`unsafe_public_networks`).

Not covered here (no sandbox is involved): that a sandbox has no other way out; see the wall's
tests and issue 4's in-sandbox e2e.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # pytest's importlib mode adds no test dir
from net import LOOP, META, MIXED, NAS, OTHER, PRIVATE, REBIND, WWW, TestInternet

from lnk_shared.unix import recv_frame, send_frame

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

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


@pytest.fixture(scope="module")
def internet() -> Iterator[TestInternet]:
    with TestInternet() as built:
        yield built


@pytest.fixture(scope="module")
def proxy(internet: TestInternet) -> Iterator[Proxy]:
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


# -- allowed ---------------------------------------------------------------------------------


def test_curl_reaches_an_allowed_host_over_http_and_https(
    proxy: Proxy, internet: TestInternet
) -> None:
    relay = Relay(proxy.socket_of(MAIN))
    try:
        before = internet.accepted(internet.www, port=80), internet.accepted(internet.www, 443)
        plain = curl(relay, internet, f"http://{WWW}/")
        assert (plain.returncode, plain.stdout) == (0, f"{WWW}\n"), plain.stderr
        tls = curl(relay, internet, f"https://{WWW}/")
        assert (tls.returncode, tls.stdout) == (0, f"{WWW}\n"), tls.stderr
        after = internet.accepted(internet.www, port=80), internet.accepted(internet.www, 443)
        assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
    finally:
        relay.close()


def test_python_tls_through_a_connect_tunnel(proxy: Proxy, internet: TestInternet) -> None:
    context = ssl.create_default_context(cafile=str(internet.ca_file))
    with connect(proxy.socket_of(MAIN)) as sock:
        sock.sendall(f"CONNECT {WWW}:443 HTTP/1.0\r\n\r\n".encode())  # as http.client sends it
        head, _ = read_response(sock)
        assert head == b"HTTP/1.1 200 Connection Established"
        with context.wrap_socket(sock, server_hostname=WWW) as tls:
            tls.sendall(f"GET /big?bytes=1000000 HTTP/1.1\r\nHost: {WWW}\r\n\r\n".encode())
            head, body = read_response(tls)
    assert head.startswith(b"HTTP/1.1 200")
    assert body == bytes(1_000_000)


def test_keep_alive_judges_each_request_anew(proxy: Proxy, internet: TestInternet) -> None:
    path = proxy.open("sbx-keep", internet=[WWW])
    before = counts(internet)
    try:
        with connect(path) as sock:
            sock.sendall(get(WWW))
            head, body = read_response(sock)
            assert b"Connection: keep-alive" in head and body == f"{WWW}\n".encode()
            sock.sendall(get(WWW, "/headers"))
            head, body = read_response(sock)
            assert body.startswith(b"GET /headers HTTP/1.1\r\nHost: " + WWW.encode())
            sock.sendall(get(OTHER))  # on no list: refused on the same connection
            head, body = read_response(sock)
            assert head.startswith(b"HTTP/1.1 403") and b"(not-listed)" in body
            assert sock.recv(1) == b""  # a refusal closes the connection
        # Both allowed requests went over one pooled origin connection, each judged (the log).
        assert counts(internet) == [before[0] + 1, before[1], before[2]]
        decisions = [(e["decision"], e["rule"]) for e in proxy.log("sbx-keep", 3)]
        assert decisions == [
            ("allowed", "allowed-internet"),
            ("allowed", "allowed-internet"),
            ("refused", "not-listed"),
        ]
    finally:
        proxy.admin({"op": "close", "sandbox": "sbx-keep"})


def test_pooled_origin_connections_are_never_shared_between_sandboxes(
    proxy: Proxy, internet: TestInternet
) -> None:
    """Two sandboxes with the same grant: each dials its own origin connection; the first
    sandbox's next request reuses its own."""
    first = proxy.open("sbx-pool-a", internet=[WWW])
    second = proxy.open("sbx-pool-b", internet=[WWW])
    try:
        before = counts(internet)
        for path in (first, second, first, second):
            _, body = ask(path, get(WWW))
            assert body == f"{WWW}\n".encode()
        assert counts(internet) == [before[0] + 2, before[1], before[2]]
    finally:
        for sandbox in ("sbx-pool-a", "sbx-pool-b"):
            proxy.admin({"op": "close", "sandbox": sandbox})


def test_proxy_headers_never_reach_the_origin(proxy: Proxy) -> None:
    extra = "Proxy-Authorization: Basic eDp5\r\nProxy-Connection: keep-alive\r\nX-Kept: 1\r\n"
    _, body = ask(proxy.socket_of(MAIN), get(WWW, "/headers", extra))
    assert b"X-Kept: 1" in body
    assert b"proxy-" not in body.lower()


def test_a_redirect_is_passed_back_never_followed(proxy: Proxy, internet: TestInternet) -> None:
    before = counts(internet)
    target = f"http://{OTHER}/"
    head, _ = ask(proxy.socket_of(MAIN), get(WWW, f"/redirect?to={target}"))
    assert head.startswith(b"HTTP/1.1 302")
    assert f"Location: {target}".encode() in head
    after = counts(internet)  # www: one new connection at most (a pooled one may carry it)
    assert after[0] - before[0] in (0, 1) and after[1:] == before[1:]


def test_request_bodies_reach_the_origin(proxy: Proxy) -> None:
    sized = f"POST http://{WWW}/up HTTP/1.1\r\nHost: {WWW}\r\nContent-Length: 5\r\n\r\nhello"
    assert ask(proxy.socket_of(MAIN), sized.encode())[1] == b"hello"
    chunked = (
        f"POST http://{WWW}/up HTTP/1.1\r\nHost: {WWW}\r\nTransfer-Encoding: chunked\r\n\r\n"
        "3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n"
    )
    assert ask(proxy.socket_of(MAIN), chunked.encode())[1] == b"abcde"


def test_an_allowed_host_that_does_not_answer_is_a_502(proxy: Proxy) -> None:
    lines = len(proxy.log(MAIN))
    head, _ = ask(proxy.socket_of(MAIN), connect_request(f"{WWW}:81"))
    assert head.startswith(b"HTTP/1.1 502")
    new = proxy.log(MAIN, lines + 1)[lines:]  # a line of the test before may land here too
    (entry,) = [e for e in new if e["target"] == f"{WWW}:81"]
    assert (entry["decision"], entry["rule"]) == ("allowed", "allowed-internet")
    assert "dial failed" in entry["error"]


# -- refused ---------------------------------------------------------------------------------

REFUSALS: list[tuple[str, str, str]] = [
    # (test id, CONNECT authority or http:// URL with {www}/{nas}/{gateway} filled in, rule)
    ("unlisted_host", f"{OTHER}:443", "not-listed"),
    ("unlisted_lan_name", f"{NAS}:80", "not-listed"),
    ("public_ip_literal", "{www}:443", "literal-not-allowed"),
    ("public_ip_literal_http", "http://{www}/", "literal-not-allowed"),
    ("private_by_name", f"{PRIVATE}:443", "internet-not-public"),
    ("private_by_literal", "{nas}:80", "literal-not-allowed"),
    ("mixed_answer", f"{MIXED}:443", "internet-not-public"),
    ("loopback_by_name", f"{LOOP}:443", "never-loopback"),
    ("localhost", "localhost:443", "never-this-machine"),
    ("localhost_trailing_dot", "http://LOCALHOST./", "never-this-machine"),
    ("loopback_literal", "127.0.0.1:443", "never-loopback"),
    ("loopback_short", "127.1:443", "never-loopback"),
    ("loopback_hex", "http://0x7f000001/", "never-loopback"),
    ("loopback_decimal", "2130706433:80", "never-loopback"),
    ("loopback_octal", "0177.0.0.1:80", "never-loopback"),
    ("loopback_v6", "[::1]:443", "never-loopback"),
    ("loopback_v4_mapped", "[::ffff:127.0.0.1]:443", "never-loopback"),
    ("loopback_nat64", "[64:ff9b::7f00:1]:443", "never-loopback"),
    ("this_machine_zero", "0.0.0.0:443", "never-this-machine"),
    ("this_machines_gateway", "{gateway}:80", "literal-not-allowed"),
    ("metadata_by_name", f"{META}:80", "never-metadata"),
    ("metadata_literal", "169.254.169.254:80", "never-metadata"),
    ("metadata_google_name", "http://metadata.google.internal/", "never-metadata"),
    ("metadata_aws_v6", "[fd00:ec2::254]:80", "never-metadata"),
    ("metadata_alibaba", "100.100.100.200:80", "never-metadata"),
]


def refused_request(template: str, internet: TestInternet) -> bytes:
    filled = template.format(
        www=internet.www.address, nas=internet.nas.address, gateway=internet.public_gateway
    )
    if filled.startswith("http://"):
        host = filled.removeprefix("http://").split("/")[0]
        return f"GET {filled} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    return connect_request(filled)


@pytest.mark.parametrize(
    ("template", "rule"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_refused_targets_get_the_rule_and_no_connection(
    proxy: Proxy, internet: TestInternet, template: str, rule: str
) -> None:
    before = counts(internet)
    lines = len(proxy.log(MAIN))
    head, body = ask(proxy.socket_of(MAIN), refused_request(template, internet))
    assert head.startswith(b"HTTP/1.1 403 Forbidden")
    assert body == f"lnk: refused ({rule})\n".encode()
    assert counts(internet) == before
    new = proxy.log(MAIN, lines + 1)[lines:]  # a line of the test before may land here too
    (entry,) = [e for e in new if e["decision"] == "refused"]
    assert (entry["decision"], entry["rule"], entry["address"]) == ("refused", rule, "")
    assert entry["reason"]


@pytest.mark.parametrize(
    ("request_bytes", "rule"),
    [
        (f"GET / HTTP/1.1\r\nHost: {WWW}\r\n\r\n", "origin-form"),
        (f"GET https://{WWW}/ HTTP/1.1\r\nHost: {WWW}\r\n\r\n", "bad-scheme"),
        (f"CONNECT {WWW}:443/x HTTP/1.1\r\n\r\n", "connect-with-path"),
        (f"GET http://{WWW}/ HTTP/1.1\r\nHost: {OTHER}\r\n\r\n", "host-mismatch"),
        (f"CONNECT user@{WWW}:443 HTTP/1.1\r\n\r\n", "userinfo"),
        (
            f"POST http://{WWW}/ HTTP/1.1\r\nHost: {WWW}\r\nContent-Length: 3\r\n"
            "Transfer-Encoding: chunked\r\n\r\n",
            "ambiguous-framing",
        ),
    ],
    ids=["origin_form", "https_scheme", "connect_path", "host_mismatch", "userinfo", "cl_te"],
)
def test_malformed_requests_are_refused_before_any_lookup(
    proxy: Proxy, internet: TestInternet, request_bytes: str, rule: str
) -> None:
    before = counts(internet)
    head, body = ask(proxy.socket_of(MAIN), request_bytes.encode())
    assert head.startswith(b"HTTP/1.1 403") and body == f"lnk: refused ({rule})\n".encode()
    assert counts(internet) == before


def test_a_rebinding_name_is_judged_on_every_request(proxy: Proxy, internet: TestInternet) -> None:
    try:
        internet.rebind(private=False)
        _, body = ask(proxy.socket_of(MAIN), get(REBIND))
        assert body == f"{WWW}\n".encode()
        internet.rebind(private=True)
        before = counts(internet)
        _, body = ask(proxy.socket_of(MAIN), get(REBIND))
        assert body == b"lnk: refused (internet-not-public)\n"
        assert counts(internet) == before
    finally:
        internet.rebind(private=False)


# -- [lan] -----------------------------------------------------------------------------------


def test_lan_grants_reach_the_lan_host_by_name_and_address_only(
    proxy: Proxy, internet: TestInternet
) -> None:
    nas = internet.nas.address
    path = proxy.open("sbx-lan", lan=[NAS, nas])
    try:
        assert ask(path, get(NAS))[1] == f"{NAS}\n".encode()
        assert ask(path, get(nas))[1] == f"{NAS}\n".encode()
        before = counts(internet)
        for target, rule in ((WWW, "not-listed"), (PRIVATE, "not-listed")):
            assert ask(path, get(target))[1] == f"lnk: refused ({rule})\n".encode()
        assert counts(internet) == before
    finally:
        assert proxy.admin({"op": "close", "sandbox": "sbx-lan"}) == {"ok": True}


def test_lan_any_dials_a_name_only_at_a_private_address(
    proxy: Proxy, internet: TestInternet
) -> None:
    path = proxy.open("sbx-lan-any", lan_any=True)
    try:
        assert ask(path, get(PRIVATE))[1] == f"{NAS}\n".encode()  # answers the LAN host
        before = counts(internet)
        assert ask(path, get(WWW))[1] == b"lnk: refused (lan-not-private)\n"
        assert ask(path, get(MIXED))[1] == b"lnk: refused (lan-not-private)\n"
        assert counts(internet) == before
    finally:
        proxy.admin({"op": "close", "sandbox": "sbx-lan-any"})


def test_empty_grants_open_nothing(proxy: Proxy, internet: TestInternet) -> None:
    path = proxy.open("sbx-empty")
    try:
        before = counts(internet)
        assert ask(path, get(WWW))[1] == b"lnk: refused (not-listed)\n"
        assert ask(path, connect_request(f"{internet.nas.address}:80"))[1] == (
            b"lnk: refused (literal-not-allowed)\n"
        )
        assert counts(internet) == before
    finally:
        proxy.admin({"op": "close", "sandbox": "sbx-empty"})


# -- wire state: stop, pause, close ------------------------------------------------------------


def open_tunnel(path: Path) -> socket.socket:
    """A CONNECT tunnel to www:80 that has carried one request."""
    sock = connect(path)
    sock.sendall(connect_request(f"{WWW}:80"))
    assert read_response(sock)[0] == b"HTTP/1.1 200 Connection Established"
    sock.sendall(f"GET / HTTP/1.1\r\nHost: {WWW}\r\n\r\n".encode())
    assert read_response(sock)[1] == f"{WWW}\n".encode()
    return sock


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_stop_flag_closes_open_tunnels_and_refuses_new_requests(proxy: Proxy) -> None:
    path = proxy.open("sbx-stop", internet=[WWW])
    flag = proxy.flags / "sbx-stop.stop"
    try:
        tunnel = open_tunnel(path)
        idle = connect(path)  # a keep-alive connection between requests
        flag.touch()
        assert closed_within(tunnel, STOP_SEEN_S)
        assert closed_within(idle, STOP_SEEN_S)
        tunnel.close()
        idle.close()
        assert ask(path, get(WWW))[1] == b"lnk: refused (stopped)\n"
        entries = proxy.log("sbx-stop", 2)
        assert [e["rule"] for e in entries] == ["allowed-internet", "stopped"]
        assert "stopped" in entries[0]["error"]
        assert entries[0]["up"] > 0 and entries[0]["down"] > 0
    finally:
        flag.unlink(missing_ok=True)
        proxy.admin({"op": "close", "sandbox": "sbx-stop"})


def test_a_pause_refuses_new_requests_keeps_open_tunnels_and_resume_works(
    proxy: Proxy,
) -> None:
    path = proxy.open("sbx-pause", internet=[WWW])
    flag = proxy.flags / "sbx-pause.pause"
    try:
        tunnel = open_tunnel(path)
        flag.touch()
        assert ask(path, get(WWW))[1] == b"lnk: refused (paused)\n"
        assert ask(path, connect_request(f"{WWW}:443"))[1] == b"lnk: refused (paused)\n"
        # An open tunnel stays open while paused (documented): only a stop closes it.
        tunnel.sendall(f"GET / HTTP/1.1\r\nHost: {WWW}\r\n\r\n".encode())
        assert read_response(tunnel)[1] == f"{WWW}\n".encode()
        flag.unlink()
        assert ask(path, get(WWW))[1] == f"{WWW}\n".encode()  # resumed, no restart
        tunnel.close()
    finally:
        flag.unlink(missing_ok=True)
        proxy.admin({"op": "close", "sandbox": "sbx-pause"})


def test_closing_a_listener_closes_its_tunnels_and_socket(proxy: Proxy) -> None:
    path = proxy.open("sbx-close", internet=[WWW])
    tunnel = open_tunnel(path)
    assert proxy.admin({"op": "close", "sandbox": "sbx-close"}) == {"ok": True}
    assert closed_within(tunnel, STOP_SEEN_S)
    tunnel.close()
    assert not path.exists()


# -- the wire's log --------------------------------------------------------------------------


def test_the_log_has_one_line_per_decision(proxy: Proxy, internet: TestInternet) -> None:
    path = proxy.open("sbx-log", internet=[WWW])
    try:
        ask(path, get(WWW))
        proxy.log("sbx-log", 1)  # lines come in the order exchanges end, not begin
        ask(path, get(OTHER))
        ask(path, connect_request("127.0.0.1:22"))
        entries = proxy.log("sbx-log", 3)
        assert [(e["decision"], e["rule"]) for e in entries] == [
            ("allowed", "allowed-internet"),
            ("refused", "not-listed"),
            ("refused", "never-loopback"),
        ]
        assert entries[0]["address"] == internet.www.address
        assert entries[0]["target"] == f"http://{WWW}/"
        assert entries[0]["method"] == "GET" and entries[0]["down"] > 0
        mode = (proxy.wire / "sbx-log.log").stat().st_mode & 0o777
        assert mode == 0o640
    finally:
        proxy.admin({"op": "close", "sandbox": "sbx-log"})


def test_a_10_kb_hostname_and_escape_sequences_are_cut_and_cleaned(
    proxy: Proxy, internet: TestInternet
) -> None:
    path = proxy.open("sbx-names", internet=[WWW])
    try:
        before = counts(internet)
        huge = "a" * 10_000 + ".example"
        assert ask(path, connect_request(f"{huge}:443"))[1] == b"lnk: refused (head-too-large)\n"
        long = ".".join(["b" * 60] * 100) + ".example"  # ~6 kB, under the line limit
        assert ask(path, connect_request(f"{long}:443"))[1] == b"lnk: refused (bad-host)\n"
        escape = f"CONNECT \x1b[31m\x1b]0;pwned\x07{WWW}:443 HTTP/1.1\r\n\r\n".encode()
        assert ask(path, escape)[1] == b"lnk: refused (bad-request-line)\n"
        assert counts(internet) == before
        entries = proxy.log("sbx-names", 3)
        assert [e["rule"] for e in entries] == ["head-too-large", "bad-host", "bad-request-line"]
        for entry in entries:
            assert len(entry["target"]) <= 300
            for text in (entry["target"], entry["reason"]):
                assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)
        assert len(entries[0]["target"]) == 300 and entries[0]["target"].startswith("aaaa")
        assert len(entries[1]["target"]) == 300
        assert "pwned" in entries[2]["target"] and "\x1b" not in entries[2]["target"]
    finally:
        proxy.admin({"op": "close", "sandbox": "sbx-names"})


# -- the service -----------------------------------------------------------------------------


def test_the_admin_socket_answers_only_the_controller(proxy: Proxy) -> None:
    """nobody owns the socket (it can connect) but is not the controller: closed, no answer."""
    script = (
        "import socket,sys\n"
        f"sys.path[:0] = {[str(CHECKOUT / s) for s in SOURCES]!r}\n"
        "from lnk_shared.unix import send_frame, recv_frame\n"
        "s = socket.socket(socket.AF_UNIX); s.settimeout(15)\n"
        f"s.connect({str(proxy.admin_socket)!r})\n"
        # The proxy may close before the frame is even sent: a broken pipe is "closed" too.
        "try:\n    send_frame(s, {'op': 'close', 'sandbox': 'sbx-main'})\n"
        "    print(recv_frame(s)[0])\n"
        "except (EOFError, ConnectionResetError, BrokenPipeError):\n    print('closed')\n"
    )
    done = subprocess.run(
        [str(PYTHON), "-I", "-c", script],
        user=PROXY_UID,
        group=PROXY_UID,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.stdout.strip() == "closed", done.stderr
    assert proxy.socket_of(MAIN).exists()  # the close was not carried out


def test_bad_admin_commands_get_an_error(proxy: Proxy) -> None:
    reply = proxy.admin(
        {"op": "open", "sandbox": "../x", "socket": "/", "grants": {}, "secret": ""}
    )
    assert reply["ok"] is False and "sandbox" in reply["error"]
    reply = proxy.admin({"op": "reboot"})
    assert reply["ok"] is False


def test_sockets_are_reached_only_through_the_proxys_0700_folder(proxy: Proxy) -> None:
    assert proxy.socket_of(MAIN).stat().st_mode & 0o777 == 0o666  # the sandbox is another uid
    assert proxy.admin_socket.stat().st_mode & 0o777 == 0o600
    for folder in (proxy.run_dir / "proxy", proxy.socket_of(MAIN).parent):
        info = folder.stat()
        assert (info.st_mode & 0o777, info.st_uid) == (0o700, PROXY_UID)


def test_the_proxy_refuses_to_run_as_root(tmp_path: Path) -> None:
    env = {
        "PYTHONPATH": os.pathsep.join(str(CHECKOUT / s) for s in SOURCES),
        "LNK_CONFIG_DIR": str(tmp_path),
        "LNK_RUN_DIR": str(tmp_path / "run"),
        "LNK_STATE_DIR": str(tmp_path / "state"),
    }
    done = subprocess.run(
        [str(PYTHON), "-m", "lnk_proxy"],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == 2
    assert "lnk_proxy runs as its own system user" in done.stderr
    assert not (tmp_path / "run").exists()
