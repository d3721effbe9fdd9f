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

import os
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from net import OTHER, WWW, TestInternet
from proxy_alone import (
    CHECKOUT,
    MAIN,
    PROXY_UID,
    PYTHON,
    SOURCES,
    Proxy,
    Relay,
    alone_proxy,
    ask,
    connect,
    connect_request,
    counts,
    curl,
    get,
    read_response,
)

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

# The proxy and its clients: proxy_alone.py. Its refusals: test_proxy_server_refusals.py; a
# stop, a pause and a close on the wire, and the wire's log: test_proxy_server_wire.py.


@pytest.fixture(scope="module")
def proxy(internet: TestInternet) -> Iterator[Proxy]:
    with alone_proxy(internet) as built:
        yield built


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
