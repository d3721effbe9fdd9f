"""A real sandbox's relay hands each connection of the proxy's port to the proxy
(`lnk_proxy.handoff`): a box of its own on the test internet, curl inside. Plain http and a
CONNECT tunnel (https) are answered, keep-alive holds on the handed connection, a 1 GiB
download through a tunnel arrives whole (TLS over the tunnel: a byte changed, lost or reordered
fails its record's MAC), and the proxy's admin `stats` counts the hand-offs (the proof that no
byte went through the relay). The relay is not dumpable: the program inside, the same user,
cannot take the relay's descriptors with `pidfd_getfd` (it could keep a handed socket or send
the proxy one of its own). Forged senders: test_proxy_handoff.py."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from as_owner import LNK, run_lnk, start_as_owner
from net import WWW

from lnk_shared.unix import recv_frame, send_frame

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

IO_S = 10.0
GIB = 1 << 30
START_S = 30.0  # a sandbox shows as running within seconds
TRANSFER_S = 300  # 1 GiB through TLS on two loaded cores: tens of seconds at worst


def _stats(box: Any, sandbox_id: str) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(IO_S)
        sock.connect(str(box.run_dir / "proxy" / "admin.sock"))
        send_frame(sock, {"op": "stats", "sandbox": sandbox_id})
        reply = recv_frame(sock)[0]
    assert reply.get("ok") is True, reply
    return reply


def _run_until_done(
    running_box: RunningBox, box: Any, flags: list[str], script: str, timeout: float = IO_S * 6
) -> tuple[list[str], dict[str, Any], str]:
    """`script` in a sandbox of `box`; the lines it printed before `done`, the proxy's stats
    for it then (its listener still open: the shell waits), and its stderr."""
    argv = [LNK, "sandbox", "run", "--yes", "--command=curl", *flags, "--"]
    client = start_as_owner(
        running_box, [*argv, "/bin/sh", "-c", f"{script}; echo done; read end"], box=box
    )
    try:
        assert client.stdout is not None and client.stdin is not None
        lines: list[str] = []
        deadline = time.monotonic() + timeout
        while (line := client.stdout.readline()) not in ("done\n", ""):
            lines.append(line.rstrip("\n"))
            assert time.monotonic() < deadline, lines
        listed = run_lnk(running_box, "sandbox", "list", "--json", box=box)
        rows = [r for r in json.loads(listed.stdout or "[]") if r["state"] == "running"]
        assert len(rows) == 1, listed.stdout
        stats = _stats(box, rows[0]["id"])
        client.stdin.write("end\n")
        client.stdin.flush()
        _, err = client.communicate(timeout=IO_S * 3)
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate()
    return lines, stats, err


def test_plain_http_keep_alive_and_a_tunnel_are_served_on_handed_connections(
    running_box: RunningBox, netbox: Any, internet: Any, ca_dir: Path
) -> None:
    before = internet.accepted(internet.www)
    two = f"-o /dev/null http://{WWW}/ -o /dev/null http://{WWW}/"  # one connection, two GETs
    script = (
        f"curl -sS --max-time 10 -w '%{{http_code}} %{{num_connects}}\\n' {two}; "
        f"curl -sS --max-time 10 --cacert {ca_dir}/ca.pem -o /dev/null -w '%{{http_code}}\\n' "
        f"https://{WWW}/"
    )
    lines, stats, err = _run_until_done(
        running_box, netbox, [f"--read={ca_dir}", f"--internet-host={WWW}"], script
    )
    assert lines == ["200 1", "200 0", "200"], err  # the second GET reused the connection
    assert stats["handed"] == 2, stats  # curl's two connections, none relayed byte by byte
    assert internet.accepted(internet.www) > before


def test_a_1_gib_download_through_a_handed_tunnel_arrives_whole(
    running_box: RunningBox, netbox: Any, ca_dir: Path
) -> None:
    url = f"https://{WWW}/big?bytes={GIB}"
    script = (
        f"curl -sS --max-time {TRANSFER_S} --cacert {ca_dir}/ca.pem -o /dev/null "
        f"-w '%{{http_code}} %{{size_download}}\\n' '{url}'; echo $?"
    )
    lines, stats, err = _run_until_done(
        running_box,
        netbox,
        [f"--read={ca_dir}", f"--internet-host={WWW}"],
        script,
        timeout=TRANSFER_S + IO_S,
    )
    assert lines == [f"200 {GIB}", "0"], err  # curl checked every TLS record
    assert stats["handed"] == 1, stats


# The relay's descriptors asked for by the program inside: every process of the sandbox's
# user that is not this one, each descriptor number up to 64. pidfd_getfd is syscall 438.
TAKE = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
took, refused = 0, set()
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == os.getpid():
        continue
    try:
        comm = open(f"/proc/{name}/comm").read().strip()
    except OSError:
        continue
    if comm != "lnk-sandbox":
        continue
    pidfd = os.pidfd_open(int(name))
    for fd in range(64):
        got = libc.syscall(438, pidfd, fd, 0)
        if got >= 0:
            took += 1
            os.close(got)
        else:
            refused.add(errno.errorcode[ctypes.get_errno()])
print("took", took, "refused", ",".join(sorted(refused)))
"""


def test_the_program_cannot_take_the_relays_descriptors(
    running_box: RunningBox, netbox: Any
) -> None:
    script = f"/usr/bin/python3 -c '{TAKE}'"
    lines, _, err = _run_until_done(
        running_box, netbox, ["--command=/usr/bin/python3", f"--internet-host={WWW}"], script
    )
    assert len(lines) == 1 and lines[0].startswith("took 0 refused EPERM"), (lines, err)
    assert lines[0] == "took 0 refused EPERM", lines  # not EBADF alone: it was asked
