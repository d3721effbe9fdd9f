"""The proxy as a sandbox's one way out, end to end: a real box (`lnk box up` starts the proxy
as its own user and the controller), a real sandbox whose relay serves the proxy on
127.0.0.1, and the test internet (`net.py`) as the only hosts there are. The proxy's resolver
is the test table and 198.18.0.0/15 counts as public only in this box's config."""

from __future__ import annotations

import json
import select
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_user import as_user
from net import NAS, OTHER, PRIVATE, WWW, TestInternet

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

LNK = str(install_prefix.LNK)
CURL = ["curl", "-sS", "--max-time", "10"]


@pytest.fixture(scope="module")
def internet() -> Iterator[Any]:
    with TestInternet() as net:
        yield net


@pytest.fixture
def netbox(running_box: RunningBox, private_box: Any, internet: Any) -> Iterator[Any]:
    proxy_config = (
        f'unsafe_public_networks = ["{internet.public_subnet}"]\n'
        f'unsafe_dns_table = "{internet.dns_file}"'
    )
    with private_box(proxy_config=proxy_config) as box:
        yield box


def _owner_env(running_box: RunningBox, box: Any) -> dict[str, str]:
    """The owner's environment, pointed at `box`."""
    return {**running_box.owner_env(), **{k: v for k, v in box.env.items() if k.startswith("LNK_")}}


def _as_owner(running_box: RunningBox, *args: str) -> list[str]:
    """`lnk ARGS` run as the owner (setpriv drops root)."""
    owner = running_box.owner
    return as_user(owner.uid, owner.gid, LNK, *args)


def _in_sandbox(
    running_box: RunningBox, box: Any, ca_dir: Path, *flags: str, script: str
) -> subprocess.CompletedProcess[str]:
    owner = running_box.owner
    env = _owner_env(running_box, box)
    argv = [
        *_as_owner(running_box),
        "sandbox",
        "run",
        "--yes",
        f"--read={ca_dir}",
        "--command=curl",
        *flags,
        "--",
        "/bin/sh",
        "-c",
        script,
    ]
    return subprocess.run(
        argv, env=env, cwd=str(owner.home), capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def ca_dir(internet: Any) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="lnk-ca-", dir="/srv"))
    folder.chmod(0o755)
    shutil.copy(internet.ca_file, folder / "ca.pem")
    (folder / "ca.pem").chmod(0o644)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_an_allowed_host_is_reached_over_http_and_https(
    running_box: RunningBox, netbox: Any, internet: Any, ca_dir: Path
) -> None:
    before = internet.accepted(internet.www)
    result = _in_sandbox(
        running_box,
        netbox,
        ca_dir,
        f"--internet-host={WWW}",
        script=f"curl -sS --max-time 10 http://{WWW}/ && "
        f"curl -sS --max-time 10 --cacert {ca_dir}/ca.pem https://{WWW}/",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(WWW) == 2
    assert internet.accepted(internet.www) == before + 2


def test_an_unlisted_host_is_refused_and_never_dialed(
    running_box: RunningBox, netbox: Any, internet: Any, ca_dir: Path
) -> None:
    before = internet.accepted(internet.other)
    result = _in_sandbox(
        running_box,
        netbox,
        ca_dir,
        f"--internet-host={WWW}",
        script=f"curl -sS --max-time 10 -w '%{{http_code}}' http://{OTHER}/",
    )
    assert "403" in result.stdout and "not-listed" in result.stdout
    assert internet.accepted(internet.other) == before


def test_a_public_name_answering_a_private_address_is_refused(
    running_box: RunningBox, netbox: Any, internet: Any, ca_dir: Path
) -> None:
    before = internet.accepted(internet.nas)
    result = _in_sandbox(
        running_box,
        netbox,
        ca_dir,
        f"--internet-host={PRIVATE}",
        script=f"curl -sS --max-time 10 -w '%{{http_code}}' http://{PRIVATE}/",
    )
    assert "403" in result.stdout and "internet-not-public" in result.stdout
    assert internet.accepted(internet.nas) == before


def test_egress_around_the_proxy_reaches_nothing(
    running_box: RunningBox, netbox: Any, internet: Any, ca_dir: Path
) -> None:
    before = internet.accepted(internet.www)
    result = _in_sandbox(
        running_box,
        netbox,
        ca_dir,
        f"--internet-host={WWW}",
        script=f"curl -sS --max-time 5 --noproxy '*' http://{internet.www.address}/; echo rc=$?",
    )
    assert f"{WWW}" not in result.stdout.replace("rc=", "")
    assert "rc=0" not in result.stdout
    assert internet.accepted(internet.www) == before


def test_the_proxy_runs_as_its_own_user(netbox: Any) -> None:
    pid = int((netbox.run_dir / "proxy.pid").read_text())
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        uid = int(next(line for line in f if line.startswith("Uid:")).split()[1])
    assert uid not in (0,) and uid < 100_000
    time.sleep(0)


def test_the_wire_log_shows_each_decision_to_its_owner(
    running_box: RunningBox, netbox: Any, internet: Any, ca_dir: Path
) -> None:
    long_name = "a" * 250 + ".\x1b[31m" + "b" * 250 + ".example"
    result = _in_sandbox(
        running_box,
        netbox,
        ca_dir,
        f"--internet-host={WWW}",
        script=f"curl -sS --max-time 10 http://{WWW}/ >/dev/null; "
        f"curl -sS --max-time 10 'http://{OTHER}/' >/dev/null; "
        f"curl -sS --max-time 10 -x http://127.0.0.1:3128 'http://{long_name}/' >/dev/null;"
        " echo $LNK_SANDBOX_ID",
    )
    sandbox_id = result.stdout.strip().splitlines()[-1]
    env = _owner_env(running_box, netbox)
    wire = subprocess.run(
        _as_owner(running_box, "sandbox", "wire", sandbox_id, "--json"),
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert wire.returncode == 0, wire.stderr
    lines = [json.loads(line) for line in wire.stdout.splitlines()]
    assert [(d["decision"], d["rule"]) for d in lines][:2] == [
        ("allowed", "allowed-internet"),
        ("refused", "not-listed"),
    ]
    assert all(len(d["target"]) <= 300 and "\x1b" not in d["target"] for d in lines)
    human = subprocess.run(
        _as_owner(running_box, "sandbox", "wire", sandbox_id),
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert "not-listed" in human.stdout and "\x1b" not in human.stdout
    other = subprocess.run(
        [LNK, "sandbox", "wire", sandbox_id],
        env={**netbox.env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert other.returncode == 0  # root sees every sandbox's


FROZEN_WINDOW_S = 2.0  # long enough for a running shell to read a line and curl to connect


def test_a_paused_sandbox_is_frozen_and_works_again_when_resumed(
    running_box: RunningBox, netbox: Any, internet: Any, ca_dir: Path
) -> None:
    owner = running_box.owner
    env = _owner_env(running_box, netbox)
    as_owner = _as_owner(running_box)
    before = internet.accepted(internet.www)
    client = subprocess.Popen(
        [
            *as_owner,
            "sandbox",
            "run",
            "--yes",
            f"--read={ca_dir}",
            "--command=curl",
            f"--internet-host={WWW}",
            "--",
            "/bin/sh",
            "-c",
            # It waits for the test's word on stdin, which the test gives only once the
            # sandbox is paused: the request can only be made after the pause, whatever the load.
            f"read go; curl -sS --max-time 10 http://{WWW}/",
        ],
        env=env,
        cwd=str(owner.home),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 15
        rows: list[dict[str, Any]] = []
        while not rows and time.monotonic() < deadline:
            listed = subprocess.run(
                [*as_owner, "sandbox", "list", "--json"],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            rows = [r for r in json.loads(listed.stdout or "[]") if r["state"] == "running"]
            time.sleep(0.1)
        assert rows, "the sandbox never showed as running"
        sandbox_id = rows[0]["id"]
        paused = subprocess.run(
            [*as_owner, "sandbox", "pause", sandbox_id],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert paused.returncode == 0, paused.stderr
        assert (netbox.run_dir / "flags" / f"{sandbox_id}.pause").exists()
        assert client.stdin is not None
        client.stdin.write("go\n")
        client.stdin.flush()
        time.sleep(FROZEN_WINDOW_S)  # a window to see nothing happen in, not a synchronisation
        assert internet.accepted(internet.www) == before
        # Frozen, the sandbox sends nothing; a request already on its way (here: written to
        # its listener, as its relay would) meets the pause flag and is refused.
        assert _through_listener(netbox, sandbox_id, WWW).startswith("HTTP/1.1 403 ")
        assert "lnk: refused (paused)" in _through_listener(netbox, sandbox_id, WWW)
        assert internet.accepted(internet.www) == before
        resumed = subprocess.run(
            [*as_owner, "sandbox", "resume", sandbox_id],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert resumed.returncode == 0, resumed.stderr
        out, err = client.communicate(timeout=30)
        assert client.returncode == 0, err
        assert WWW in out
        assert internet.accepted(internet.www) == before + 1
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def _through_listener(box: Any, sandbox_id: str, host: str) -> str:
    """GET http://host/ written straight to the sandbox's proxy listener (root may reach it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(box.run_dir / "proxy" / f"{sandbox_id}.sock"))
        sock.sendall(f"GET http://{host}/ HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):  # a refusal closes the connection
            answer += chunk
    return answer.decode("latin-1")


class _CountingServer:
    """A loopback HTTP server on this machine counting its connections (a `[localhost]` port)."""

    def __init__(self) -> None:
        import http.server
        import threading

        counter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b"served on the host\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            def verify_request(self, request: Any, address: Any) -> bool:
                counter.accepted += 1
                return True

        self.accepted = 0
        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def test_a_localhost_port_is_served_inside_and_others_are_not(
    running_box: RunningBox, netbox: Any, ca_dir: Path
) -> None:
    granted, other = _CountingServer(), _CountingServer()
    try:
        result = _in_sandbox(
            running_box,
            netbox,
            ca_dir,
            f"--port={granted.port}",
            script=(
                f"curl -sS --max-time 5 --noproxy '*' http://127.0.0.1:{granted.port}/; "
                # Through the proxy, asked for explicitly: NO_PROXY names the loopback now
                # (client_proxy_env.py), so the environment alone no longer sends it there
                f"curl -sS --max-time 5 --noproxy '' -x \"$HTTP_PROXY\" "
                f"http://127.0.0.1:{granted.port}/; "
                f"curl -sS --max-time 5 --noproxy '*' http://127.0.0.1:{other.port}/; "
                f"curl -sS --max-time 5 --noproxy '' -x \"$HTTP_PROXY\" -w ' %{{http_code}}' "
                f"http://127.0.0.1:{other.port}/"
            ),
        )
        assert result.stdout.count("served on the host") == 2, (result.stdout, result.stderr)
        assert granted.accepted == 2
        assert "403" in result.stdout and "never-loopback" in result.stdout
        assert other.accepted == 0
    finally:
        granted.close()
        other.close()


def test_lan_rules_hold_from_inside_a_sandbox(
    running_box: RunningBox, netbox: Any, internet: Any, ca_dir: Path
) -> None:
    """A listed LAN name and a listed LAN range are reached; `[internet] *` never reaches the
    LAN, by name or by literal; a LAN literal outside the listed range is refused."""
    nas = internet.nas.address
    before = internet.accepted(internet.nas)
    listed = _in_sandbox(
        running_box,
        netbox,
        ca_dir,
        f"--lan-host={NAS}",
        f"--lan-host={internet.lan_subnet}",
        script=f"curl -sS --max-time 10 http://{NAS}/ && curl -sS --max-time 10 http://{nas}/",
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count(NAS) == 2
    assert internet.accepted(internet.nas) == before + 2

    before = internet.accepted(internet.nas)
    internet_only = _in_sandbox(
        running_box,
        netbox,
        ca_dir,
        "--internet-host=*",
        script=(
            f"curl -sS --max-time 10 -w ' %{{http_code}}\\n' http://{NAS}/; "
            f"curl -sS --max-time 10 -w ' %{{http_code}}\\n' http://{nas}/; "
            f"curl -sS --max-time 10 -w ' %{{http_code}}\\n' http://{PRIVATE}/"
        ),
    )
    assert internet_only.stdout.count("403") == 3, internet_only.stdout
    assert internet.accepted(internet.nas) == before

    other_lan = str(internet.lan_subnet.network_address + 77)
    narrow = _in_sandbox(
        running_box,
        netbox,
        ca_dir,
        f"--lan-host={nas}",
        script=f"curl -sS --max-time 10 -w ' %{{http_code}}' http://{other_lan}/",
    )
    assert "403" in narrow.stdout and "literal-not-allowed" in narrow.stdout, narrow.stdout


# -- common clients from inside a sandbox: Python's urllib, requests, pip --------------------

# Run inside the sandbox by /usr/bin/python3. `requests` and `httpx` are not installed in
# /opt/lnk/venv nor for /usr/bin/python3: the `requests` here is the copy pip vendors
# (pip._vendor.requests), the one pip itself downloads with.
CLIENTS = """
import json, ssl, sys, urllib.error, urllib.request
from pip._vendor import requests
ca, www, other = sys.argv[1:4]
tls = ssl.create_default_context(cafile=ca)
out = {}
for scheme in ("http", "https"):
    with urllib.request.urlopen(f"{scheme}://{www}/", timeout=10, context=tls) as answer:
        out[f"urllib {scheme}"] = answer.read().decode()
    out[f"requests {scheme}"] = requests.get(f"{scheme}://{www}/", verify=ca, timeout=10).text
try:
    urllib.request.urlopen(f"http://{other}/", timeout=10)
except urllib.error.HTTPError as refused:
    out["urllib http other"] = f"{refused.code} {refused.read().decode().strip()}"
for client, call in (
    ("urllib", lambda: urllib.request.urlopen(f"https://{other}/", timeout=10, context=tls)),
    ("requests", lambda: requests.get(f"https://{other}/", verify=ca, timeout=10)),
):
    try:
        call()
        out[f"{client} https other"] = "reached"
    except Exception as refused:
        out[f"{client} https other"] = f"{type(refused).__name__}: {refused}"[:300]
print(json.dumps(out))
"""

PIP = "python3 -m pip --disable-pip-version-check --no-cache-dir"
LIST_DOWNLOADS = 'import os; print(*os.listdir("/tmp/https"), *os.listdir("/tmp/http"))'


def test_python_clients_and_pip_reach_an_allowed_host_and_never_an_unlisted_one(
    running_box: RunningBox, netbox: Any, internet: Any, ca_dir: Path
) -> None:
    """urllib, requests and pip (download over https and http, install) use the proxy from the
    environment; an unlisted host is refused to each of them and its listener sees nothing."""
    (ca_dir / "clients.py").write_text(CLIENTS)
    (ca_dir / "clients.py").chmod(0o644)
    ca = f"{ca_dir}/ca.pem"
    index = f"--index-url https://{WWW}/simple/ --cert {ca}"
    other_index = f"--index-url https://{OTHER}/simple/ --cert {ca}"
    plain_index = f"--index-url http://{WWW}/simple/ --trusted-host {WWW}"
    www_before, other_before = internet.accepted(internet.www), internet.accepted(internet.other)
    result = _in_sandbox(
        running_box,
        netbox,
        ca_dir,
        f"--internet-host={WWW}",
        "--command=python3",
        script=(
            f"python3 {ca_dir}/clients.py {ca} {WWW} {OTHER} && "
            f"{PIP} download --no-deps {index} --dest /tmp/https lnk-demo >/dev/null && "
            f"{PIP} download --no-deps {plain_index} --dest /tmp/http lnk-demo >/dev/null && "
            f"{PIP} install --no-deps {index} --target /tmp/site lnk-demo >/dev/null && "
            f"python3 -c '{LIST_DOWNLOADS}' && "
            "PYTHONPATH=/tmp/site python3 -c 'import lnk_demo; print(lnk_demo.GREETING)' && "
            f"{{ {PIP} download --no-deps --retries 0 {other_index} --dest /tmp/other lnk-demo "
            ">/dev/null 2>&1; echo other-index=$?; }"
        ),
    )
    assert result.returncode == 0, (result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    clients = json.loads(lines[0])
    for client in ("urllib", "requests"):
        for scheme in ("http", "https"):
            assert clients[f"{client} {scheme}"] == f"{WWW}\n", clients
        assert "403" in clients[f"{client} https other"], clients  # the CONNECT's answer
    assert clients["urllib http other"] == "403 lnk: refused (not-listed)"
    wheel = "lnk_demo-1.0-py3-none-any.whl"
    assert f"{wheel} {wheel}" in lines  # downloaded over https and over http
    assert "hello from the test internet" in lines
    assert lines[-1] not in ("other-index=0", "") and lines[-1].startswith("other-index=")
    assert internet.accepted(internet.other) == other_before
    assert internet.accepted(internet.www) > www_before


# -- wire state: stop and an expired lease close a tunnel held open inside ------------------

# Inside the sandbox: a CONNECT tunnel to www:80 through the relay, one request over it to show
# it carries bytes, then held open (idle) until something outside ends it.
HOLD = """
import os, socket, sys, time
www = sys.argv[1]
proxy = os.environ["HTTPS_PROXY"].rsplit(":", 1)
sock = socket.create_connection(("127.0.0.1", int(proxy[1])), timeout=10)
sock.sendall(f"CONNECT {www}:80 HTTP/1.1\\r\\nHost: {www}:80\\r\\n\\r\\n".encode())
answer = b""
while not answer.endswith(b"\\r\\n\\r\\n"):
    answer += sock.recv(1)
sock.sendall(f"GET / HTTP/1.1\\r\\nHost: {www}\\r\\n\\r\\n".encode())
time.sleep(0.5)
body = sock.recv(65536)
print(answer.split(b"\\r\\n")[0].decode(), www in body.decode(), os.environ["LNK_SANDBOX_ID"])
sys.stdout.flush()
sock.settimeout(None)
print("ended by peer", sock.recv(1) == b"", flush=True)
time.sleep(120)
"""


def _hold_a_tunnel(
    running_box: RunningBox, box: Any, internet: Any, ca_dir: Path
) -> tuple[subprocess.Popen[str], str, int]:
    """Start HOLD in a sandbox of `box`; (its client, the sandbox id, the tunnel's port at www)."""
    (ca_dir / "hold.py").write_text(HOLD)
    (ca_dir / "hold.py").chmod(0o644)
    before = len(internet.connections(internet.www))
    client = subprocess.Popen(
        [
            *_as_owner(running_box),
            "sandbox",
            "run",
            "--yes",
            f"--read={ca_dir}",
            "--command=python3",
            f"--internet-host={WWW}",
            "--",
            "python3",
            f"{ca_dir}/hold.py",
            WWW,
        ],
        env=_owner_env(running_box, box),
        cwd=str(running_box.owner.home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert client.stdout is not None
    ready, _, _ = select.select([client.stdout], [], [], 30)
    line = client.stdout.readline() if ready else ""
    if not line.startswith("HTTP/1.1 200 ") or " True sbx-" not in line:
        client.kill()
        _, err = client.communicate(timeout=30)
        pytest.fail(f"the tunnel did not open: {line!r} {err}")
    new = internet.connections(internet.www)[before:]
    assert len(new) == 1 and new[0].port == 80, new  # the tunnel's one connection
    return client, line.split()[-1], new[0].peer_port


def _wait_for_end(internet: Any, peer_port: int, within_s: float) -> float:
    """Seconds until www saw the connection from `peer_port` end; fails past `within_s`."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        if any(c.peer_port == peer_port for c in internet.ended(internet.www)):
            return time.monotonic() - started
        time.sleep(0.1)
    pytest.fail(f"www still holds the tunnel's connection after {within_s} s")


def test_stop_closes_a_tunnel_held_open_inside_the_sandbox(
    running_box: RunningBox, netbox: Any, internet: Any, ca_dir: Path
) -> None:
    client, sandbox_id, peer_port = _hold_a_tunnel(running_box, netbox, internet, ca_dir)
    try:
        time.sleep(1)
        assert not any(c.peer_port == peer_port for c in internet.ended(internet.www))
        stopped = subprocess.run(
            _as_owner(running_box, "sandbox", "stop", sandbox_id),
            env=_owner_env(running_box, netbox),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert stopped.returncode == 0, stopped.stderr
        _wait_for_end(internet, peer_port, within_s=10)
        client.communicate(timeout=30)
        assert client.returncode != 0  # stopped, not finished
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


LEASE_S = 3  # the lease box's: short, so the test sees it run out


def test_an_expired_lease_closes_a_tunnel_held_open_inside_the_sandbox(
    running_box: RunningBox, private_box: Any, internet: Any, ca_dir: Path
) -> None:
    proxy_config = (
        f'unsafe_public_networks = ["{internet.public_subnet}"]\n'
        f'unsafe_dns_table = "{internet.dns_file}"'
    )
    with private_box(f"lease_seconds = {LEASE_S}", proxy_config=proxy_config) as box:
        client, _, peer_port = _hold_a_tunnel(running_box, box, internet, ca_dir)
        try:
            _wait_for_end(internet, peer_port, within_s=LEASE_S + 15)
            client.communicate(timeout=30)
            assert client.returncode != 0
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
