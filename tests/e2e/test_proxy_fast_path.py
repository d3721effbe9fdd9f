"""The proxy's callback path (`lnk_proxy.fast_exchange`) end to end: a real box, a real sandbox
whose relay serves the proxy on 127.0.0.1, the test internet (`net.py`).

Test boxes answer names from `unsafe_dns_table`, never kept, so a request to a name always
needs a lookup and takes the coroutine path; this box sets `unsafe_dns_table_kept`, so the
table's answers are kept for the system resolver's `ANSWER_CACHE_S` (5 s) and judged again on
every request, as real lookups are. The proof that the callback path decided a request is the
proxy's admin `stats` (`fast_decided`, per sandbox), read before and after; the refusals are
checked there too: a host not granted, a name rebound to a private address, the pause flag
and a stop between two keep-alive requests."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from as_owner import LNK, run_lnk, start_as_owner
from internet_box import proxy_config
from net import OTHER, REBIND, WWW

from lnk_shared.unix import recv_frame, send_frame

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

KEPT_S = 5.0  # lnk_proxy.resolver.ANSWER_CACHE_S: how late a changed answer may be seen
IO_S = 10.0
REQUESTS = 5  # keep-alive GETs on one connection from inside the sandbox


@pytest.fixture
def fastbox(running_box: RunningBox, private_box: Any, internet: Any) -> Iterator[Any]:
    kept = proxy_config(internet, "unsafe_dns_table_kept = true")
    with private_box(proxy_config=kept) as box:
        yield box


def fast_decided(box: Any, sandbox_id: str) -> int:
    """The sandbox's requests the callback path decided, from the proxy's admin socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(IO_S)
        sock.connect(str(box.run_dir / "proxy" / "admin.sock"))
        send_frame(sock, {"op": "stats", "sandbox": sandbox_id})
        reply = recv_frame(sock)[0]
    assert reply.get("ok") is True, reply
    return int(reply["fast_decided"])


class KeptConnection:
    """One keep-alive connection straight to the sandbox's listener, as its relay makes."""

    def __init__(self, box: Any, sandbox_id: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(IO_S)
        self.sock.connect(str(box.run_dir / "proxy" / f"{sandbox_id}.sock"))
        self.buffer = b""

    def get(self, host: str) -> tuple[int, bytes]:
        """One GET; its status and body ((0, b"") when the proxy closed instead)."""
        self.sock.sendall(f"GET http://{host}/ HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                return 0, b""
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(self.buffer) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.buffer += chunk
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, body

    def close(self) -> None:
        self.sock.close()


def _running_sandbox(running_box: RunningBox, box: Any) -> tuple[subprocess.Popen[str], str]:
    """A sandbox granted www and the rebinding name, whose shell waits for the test's word,
    then makes REQUESTS keep-alive GETs on one connection and one to a host not granted."""
    urls = " ".join([f"-o /dev/null http://{WWW}/"] * REQUESTS)  # curl's -o is per URL
    script = (
        "read go; "
        f"curl -sS --max-time 10 -w '%{{http_code}} %{{num_connects}}\\n' {urls}; "
        f"curl -sS --max-time 10 -o /dev/null -w '%{{http_code}}\\n' http://{OTHER}/; "
        "echo done; read end"
    )
    client = start_as_owner(
        running_box,
        [
            LNK,
            "sandbox",
            "run",
            "--yes",
            "--command=curl",
            f"--internet-host={WWW}",
            f"--internet-host={REBIND}",
            "--",
            "/bin/sh",
            "-c",
            script,
        ],
        box=box,
    )
    deadline = time.monotonic() + 30
    rows: list[dict[str, Any]] = []
    while not rows and time.monotonic() < deadline:
        listed = run_lnk(running_box, "sandbox", "list", "--json", box=box)
        rows = [r for r in json.loads(listed.stdout or "[]") if r["state"] == "running"]
        if not rows:
            time.sleep(0.1)  # polling `sandbox list`: the start has no event to wait on
    if not rows:
        _end(client)
        raise AssertionError("the sandbox never showed as running")
    return client, rows[0]["id"]


def _end(client: subprocess.Popen[str]) -> None:
    """The sandbox's `lnk sandbox run` ended (killed if still running), its pipes closed."""
    if client.poll() is None:
        client.kill()
    client.communicate(timeout=IO_S * 3)


def _say(client: subprocess.Popen[str], word: str) -> None:
    assert client.stdin is not None
    client.stdin.write(word + "\n")
    client.stdin.flush()


def test_keep_alive_requests_from_inside_are_decided_on_the_callback_path(
    running_box: RunningBox, fastbox: Any, internet: Any
) -> None:
    client, sandbox_id = _running_sandbox(running_box, fastbox)
    try:
        before = fast_decided(fastbox, sandbox_id)
        other_before = internet.accepted(internet.other)
        _say(client, "go")
        assert client.stdout is not None
        lines = [client.stdout.readline().strip() for _ in range(REQUESTS + 2)]
        # curl's -w per URL: the code and the connections it opened for it (one in all).
        assert lines[:REQUESTS] == ["200 1"] + ["200 0"] * (REQUESTS - 1), lines
        assert lines[REQUESTS:] == ["403", "done"], lines
        decided = fast_decided(fastbox, sandbox_id) - before
        # The first GET needed the lookup and the dial (the coroutine path); the other four
        # went on the kept answer and the pooled connection; the refusal of the host not
        # granted needs no lookup at all: 4 + 1.
        assert decided >= REQUESTS, decided
        assert internet.accepted(internet.other) == other_before  # never dialed
        wire = run_lnk(
            running_box, "sandbox", "wire", sandbox_id, "--json", box=fastbox, timeout=30
        )
        assert wire.returncode == 0, wire.stderr
        rows = [json.loads(line) for line in wire.stdout.splitlines()]
        assert [(r["decision"], r["rule"]) for r in rows] == [
            *[("allowed", "allowed-internet")] * REQUESTS,
            ("refused", "not-listed"),
        ]
    finally:
        _end(client)


def test_rebinding_pause_and_stop_hold_on_the_callback_path(
    running_box: RunningBox, fastbox: Any, internet: Any
) -> None:
    client, sandbox_id = _running_sandbox(running_box, fastbox)
    internet.rebind(private=False)
    kept = KeptConnection(fastbox, sandbox_id)
    try:
        nas_before = internet.accepted(internet.nas)
        assert kept.get(REBIND)[0] == 200  # looked up, kept, dialed
        before = fast_decided(fastbox, sandbox_id)
        assert kept.get(REBIND)[0] == 200
        assert fast_decided(fastbox, sandbox_id) == before + 1
        # The name now answers the LAN host: once the kept answer is older than KEPT_S the
        # next request looks it up again and is refused; until then it reaches www, as a
        # real answer's TTL would let it.
        internet.rebind(private=True)
        changed = time.monotonic()
        status = 200
        while status == 200 and time.monotonic() < changed + KEPT_S + IO_S:
            status = kept.get(REBIND)[0]
        assert status == 403
        assert time.monotonic() - changed < KEPT_S + IO_S
        kept.close()
        # The refused answer is the kept one now: a new connection's request is refused on
        # the callback path, and the LAN host saw nothing.
        kept = KeptConnection(fastbox, sandbox_id)
        before = fast_decided(fastbox, sandbox_id)
        status, body = kept.get(REBIND)
        assert status == 403 and b"lnk: refused" in body
        assert fast_decided(fastbox, sandbox_id) == before + 1
        assert internet.accepted(internet.nas) == nas_before
        kept.close()

        # Pause between two keep-alive requests: the second is refused on the callback path.
        kept = KeptConnection(fastbox, sandbox_id)
        assert kept.get(WWW)[0] == 200
        assert kept.get(WWW)[0] == 200
        before = fast_decided(fastbox, sandbox_id)
        paused = run_lnk(running_box, "sandbox", "pause", sandbox_id, box=fastbox)
        assert paused.returncode == 0, paused.stderr
        status, body = kept.get(WWW)
        assert status == 403 and b"lnk: refused (paused)" in body
        assert fast_decided(fastbox, sandbox_id) == before + 1
        kept.close()
        resumed = run_lnk(running_box, "sandbox", "resume", sandbox_id, box=fastbox)
        assert resumed.returncode == 0, resumed.stderr

        # A stop between two keep-alive requests: the first on the callback path, the second
        # never reaches the origin (refused, or the connection closed with the listener).
        kept = KeptConnection(fastbox, sandbox_id)
        assert kept.get(WWW)[0] == 200
        before = fast_decided(fastbox, sandbox_id)
        assert kept.get(WWW)[0] == 200
        assert fast_decided(fastbox, sandbox_id) == before + 1
        stopped = run_lnk(running_box, "sandbox", "stop", sandbox_id, box=fastbox, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        try:
            status, _ = kept.get(WWW)
        except OSError:  # the listener closed: reset
            status = 0
        assert status in (0, 403)  # never the origin's 200
    finally:
        kept.close()
        internet.rebind(private=False)
        _end(client)


def test_the_admin_stats_of_a_sandbox_with_no_listener_is_an_error(fastbox: Any) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(IO_S)
        sock.connect(str(fastbox.run_dir / "proxy" / "admin.sock"))
        send_frame(sock, {"op": "stats", "sandbox": "no-such-sandbox"})
        reply = recv_frame(sock)[0]
    assert reply["ok"] is False and "no-such-sandbox" in reply["error"]
