"""The proxy as a sandbox's one way out, end to end: a real box (`lnk box up` starts the proxy
as its own user and the controller), a real sandbox whose relay serves the proxy on
127.0.0.1, and the test internet (`net.py`) as the only hosts there are. The proxy's resolver
is the test table and 198.18.0.0/15 counts as public only in this box's config."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_owner import run_lnk
from internet_box import in_sandbox
from net import NAS, OTHER, PRIVATE, WWW

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

LNK = str(install_prefix.LNK)
CURL = ["curl", "-sS", "--max-time", "10"]

# `internet`, `netbox` (a box of its own on it) and `ca_dir`: tests/e2e/conftest.py. What a
# pause, a stop and a lease's end do to the way out: test_proxy_wall_state.py; urllib, requests
# and pip from inside: test_proxy_wall_clients.py.


def test_an_allowed_host_is_reached_over_http_and_https(
    running_box: RunningBox, netbox: Any, internet: Any, ca_dir: Path
) -> None:
    before = internet.accepted(internet.www)
    result = in_sandbox(
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
    result = in_sandbox(
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
    result = in_sandbox(
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
    result = in_sandbox(
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
    result = in_sandbox(
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
    wire = run_lnk(running_box, "sandbox", "wire", sandbox_id, "--json", box=netbox, timeout=30)
    assert wire.returncode == 0, wire.stderr
    lines = [json.loads(line) for line in wire.stdout.splitlines()]
    assert [(d["decision"], d["rule"]) for d in lines][:2] == [
        ("allowed", "allowed-internet"),
        ("refused", "not-listed"),
    ]
    assert all(len(d["target"]) <= 300 and "\x1b" not in d["target"] for d in lines)
    human = run_lnk(running_box, "sandbox", "wire", sandbox_id, box=netbox, timeout=30)
    assert "not-listed" in human.stdout and "\x1b" not in human.stdout
    other = subprocess.run(
        [LNK, "sandbox", "wire", sandbox_id],
        env={**netbox.env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert other.returncode == 0  # root sees every sandbox's


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
        result = in_sandbox(
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
    listed = in_sandbox(
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
    internet_only = in_sandbox(
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
    narrow = in_sandbox(
        running_box,
        netbox,
        ca_dir,
        f"--lan-host={nas}",
        script=f"curl -sS --max-time 10 -w ' %{{http_code}}' http://{other_lan}/",
    )
    assert "403" in narrow.stdout and "literal-not-allowed" in narrow.stdout, narrow.stdout
