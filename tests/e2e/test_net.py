"""The test internet itself (`net.py`): its hosts answer from the root namespace over http and
https, count every connection, and leave no namespace, veth, route, process or file behind,
even when setup fails halfway or the run that built it was killed.

No traffic here leaves for a real address: every request goes to a host of a live
TestInternet, whose /24 is routed to its veth (checked at setup) and guarded by an
`unreachable` route while the context lives.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from ipaddress import IPv4Network
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # pytest's importlib mode adds no test dir
import net
from net import (
    ANTHROPIC,
    LAN_RANGE,
    MIXED,
    NAS,
    OPENAI,
    OTHER,
    PUBLIC_RANGE,
    REBIND,
    TELEGRAM,
    WWW,
    Host,
    TestInternet,
)

pytestmark = pytest.mark.needs_root

CURL_TIMEOUT_S = 10


def _curl(net_: TestInternet, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """curl from the root namespace, never through a proxy, trusting only the test CA."""
    return subprocess.run(
        [
            "curl",
            "-sS",
            "--noproxy",
            "*",
            "--max-time",
            "5",
            "--cacert",
            str(net_.ca_file),
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=CURL_TIMEOUT_S,
        check=False,
    )


def _stray_routes() -> list[str]:
    """Routes inside the test ranges that belong to no live TestInternet (of any run)."""
    live = net.live_subnets()
    return [
        dst
        for dst in net.routes_within(PUBLIC_RANGE) + net.routes_within(LAN_RANGE)
        if not any(IPv4Network(dst).subnet_of(s) for s in live)
    ]


def _netns() -> set[str]:
    return set(net.netns_names())


def _links() -> set[str]:
    return set(net.link_names())


def _with_prefix(prefix: str) -> list[str]:
    temp = [str(p) for p in Path("/tmp").glob(f"{net.REGISTRY}{prefix}*")]
    return sorted(n for n in _netns() | _links() if n.startswith(prefix)) + temp


@pytest.fixture
def internet() -> Iterator[TestInternet]:
    assert _stray_routes() == []
    with TestInternet() as built:
        yield built
    assert _stray_routes() == []


def test_hosts_answer_http_from_the_root_namespace(internet: TestInternet) -> None:
    for host in (internet.www, internet.other, internet.nas):
        got = _curl(internet, f"http://{host.address}/")
        assert (got.returncode, got.stdout) == (0, f"{host.name}\n"), got.stderr


def test_hosts_answer_https_by_name_with_the_test_ca(internet: TestInternet) -> None:
    for host in (internet.www, internet.other, internet.nas):
        got = _curl(internet, f"https://{host.name}/", *internet.resolve_args(host.name))
        assert (got.returncode, got.stdout) == (0, f"{host.name}\n"), got.stderr


def test_www_certificate_covers_the_names_that_answer_it_and_no_other(
    internet: TestInternet,
) -> None:
    address = internet.www.address
    for name in (MIXED, REBIND):
        got = _curl(internet, f"https://{name}/", "--resolve", f"{name}:443:{address}")
        assert got.stdout == f"{WWW}\n", got.stderr
    wrong = _curl(internet, f"https://{OTHER}/", "--resolve", f"{OTHER}:443:{address}")
    assert wrong.returncode != 0  # www's certificate does not name other


def test_the_test_ca_is_not_trusted_by_the_system(internet: TestInternet) -> None:
    got = subprocess.run(
        [
            "curl",
            "-sS",
            "--noproxy",
            "*",
            "--max-time",
            "5",
            *internet.resolve_args(WWW),
            f"https://{WWW}/",
        ],
        capture_output=True,
        text=True,
        timeout=CURL_TIMEOUT_S,
        check=False,
    )
    assert got.returncode == 60, got  # SSL certificate problem


def test_each_request_counts_exactly_one_connection_on_its_host(internet: TestInternet) -> None:
    hosts = (internet.www, internet.other, internet.nas)
    assert [internet.accepted(h) for h in hosts] == [0, 0, 0]
    _curl(internet, f"http://{internet.www.address}/")
    assert [internet.accepted(h) for h in hosts] == [1, 0, 0]
    _curl(internet, f"https://{WWW}/", *internet.resolve_args(WWW))
    assert [internet.accepted(h) for h in hosts] == [2, 0, 0]
    assert (internet.accepted(WWW, port=80), internet.accepted(WWW, port=443)) == (1, 1)
    _curl(internet, f"http://{internet.nas.address}/")
    assert [internet.accepted(h) for h in hosts] == [2, 0, 1]
    seen = internet.connections(internet.nas)[0]
    assert (seen.peer, seen.port) == (internet.lan_gateway, 80)


def test_a_bare_connect_counts_even_without_a_tls_handshake(internet: TestInternet) -> None:
    """What a refused CONNECT would leave: the listener must count it, handshake or not."""
    import socket

    with socket.create_connection((internet.other.address, 443), timeout=5):
        pass
    deadline = time.monotonic() + 5
    while internet.accepted(internet.other, port=443) == 0:
        assert time.monotonic() < deadline, "the accept was not logged"
        time.sleep(0.01)
    assert internet.accepted(internet.other) == 1


def test_big_streams_n_bytes_and_post_is_echoed(internet: TestInternet) -> None:
    size = 3 * 1024 * 1024 + 7
    for url, args in (
        (f"http://{internet.www.address}/big?bytes={size}", []),
        (f"https://{WWW}/big?bytes={size}", internet.resolve_args(WWW)),
    ):
        got = subprocess.run(
            ["curl", "-sS", "--noproxy", "*", "--cacert", str(internet.ca_file), *args, url],
            capture_output=True,
            timeout=CURL_TIMEOUT_S,
            check=False,
        )
        assert (got.returncode, len(got.stdout)) == (0, size), got.stderr
        assert got.stdout == bytes(size)
    echoed = subprocess.run(
        [
            "curl",
            "-sS",
            "--noproxy",
            "*",
            "--data-binary",
            "@-",
            f"http://{internet.nas.address}/up",
        ],
        input=b"a\0b\r\n",
        capture_output=True,
        timeout=CURL_TIMEOUT_S,
        check=True,
    )
    assert echoed.stdout == b"a\0b\r\n"
    chunked = _curl(
        internet,
        f"http://{internet.www.address}/x",
        "-H",
        "Transfer-Encoding: chunked",
        "--data-binary",
        "chunks",
    )
    assert chunked.stdout == "chunks"


def test_headers_and_redirect_endpoints(internet: TestInternet) -> None:
    head = subprocess.run(
        [
            "curl",
            "-sS",
            "--noproxy",
            "*",
            "-H",
            "X-Probe: 1",
            f"http://{internet.www.address}/headers",
        ],
        capture_output=True,
        timeout=CURL_TIMEOUT_S,
        check=True,
    ).stdout
    assert head.startswith(b"GET /headers HTTP/1.1\r\n")
    assert b"\r\nX-Probe: 1\r\n" in head
    moved = _curl(
        internet, f"http://{internet.www.address}/redirect?to=http://x.invalid/", "-i"
    )  # not followed: curl follows nothing without -L
    assert moved.stdout.startswith("HTTP/1.1 302")
    assert "Location: http://x.invalid/\n" in moved.stdout


def test_dns_table_names_hostile_answers_and_is_written_as_json(internet: TestInternet) -> None:
    www, nas = internet.www.address, internet.nas.address
    assert IPv4Network(f"{www}/32").subnet_of(PUBLIC_RANGE)
    assert IPv4Network(f"{nas}/32").subnet_of(LAN_RANGE)
    assert internet.dns == {
        WWW: [www],
        OTHER: [internet.other.address],
        NAS: [nas],
        "private.test-public.example": [nas],
        "loop.test-public.example": ["127.0.0.1"],
        MIXED: [www, nas],
        "meta.test-public.example": ["169.254.169.254"],
        REBIND: [www],
        TELEGRAM: [internet.other.address],
        ANTHROPIC: [internet.other.address],
        OPENAI: [internet.other.address],
    }
    assert json.loads(internet.dns_file.read_text()) == internet.dns


def test_dns_table_and_ca_are_readable_by_an_unprivileged_user(internet: TestInternet) -> None:
    """The proxy runs as its own user and reads the table; a sandbox's client reads the CA."""
    for path in (internet.dns_file, internet.ca_file):
        read = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert read.stdout == path.read_text(), read.stderr


def test_rebind_flips_the_answer_in_the_table_and_the_file(internet: TestInternet) -> None:
    assert internet.rebind() == [internet.nas.address]
    assert json.loads(internet.dns_file.read_text())[REBIND] == [internet.nas.address]
    assert internet.rebind() == [internet.www.address]
    assert internet.rebind(private=False) == [internet.www.address]
    assert internet.rebind(private=True) == [internet.nas.address]
    assert json.loads(internet.dns_file.read_text())[REBIND] == [internet.nas.address]


def test_a_vanished_veth_does_not_leak_to_the_default_route(internet: TestInternet) -> None:
    """Asks the kernel where packets would go; sends none."""
    subprocess.run(["ip", "link", "del", internet.public_veth], check=True)
    where = subprocess.run(
        ["ip", "route", "get", internet.www.address], capture_output=True, text=True, check=False
    )
    assert where.returncode != 0
    assert "no route to host" in where.stderr.lower()  # the guard, not eth0


def test_setup_makes_its_hosts_and_teardown_leaves_nothing() -> None:
    # How long a setup takes is not asserted: a timed test fails on a loaded machine and proves
    # nothing a benchmark would not show better.
    with TestInternet() as built:
        names = {built.public_netns, built.lan_netns, built.public_veth, built.lan_veth}
        assert names <= _netns() | _links()
        assert all(len(name) <= 15 for name in names)
        servers = list(built.servers)
        assert all(s.poll() is None for s in servers)
        subnets = [built.public_subnet, built.lan_subnet]
        assert all(net.routes_within(s) for s in subnets)
        tmp = built.tmp
    assert not names & (_netns() | _links())
    assert all(s.poll() is not None for s in servers)
    assert all(net.routes_within(s) == [] for s in subnets)
    assert not tmp.exists()
    assert _stray_routes() == []


def test_two_at_once_get_their_own_names_and_subnets() -> None:
    with TestInternet() as one, TestInternet() as two:
        assert one.id != two.id
        assert one.public_subnet != two.public_subnet
        assert one.lan_subnet != two.lan_subnet
        for built in (one, two):
            for host in (built.www, built.nas):
                got = _curl(built, f"http://{host.address}/")
                assert got.stdout == f"{host.name}\n", got.stderr
        assert one.accepted(one.www) == two.accepted(two.www) == 1


def test_setup_failing_halfway_removes_what_it_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    prefix = "lx" + secrets.token_hex(2)
    monkeypatch.setattr(net, "SERVER", tmp_path / "no-such-server.py")
    with (
        pytest.raises(net.NetSetupError, match="did not start: it ended with status 2"),
        TestInternet(prefix),
    ):
        pass
    assert _with_prefix(prefix) == []
    assert _stray_routes() == []


HOLD_LOCK = (
    "import fcntl, os, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDWR)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"  # held until the test closes its stdin
)


def test_a_lock_held_past_its_bound_fails_naming_the_lock_and_its_holder(tmp_path: Path) -> None:
    """A holder that never lets go (here: a process that took the lock and waits on its stdin)
    fails the wait after its bound, with the lock's path and the holder's pid and command line,
    where the wait had no bound; once it lets go, the lock is taken."""
    lock = tmp_path / "testnet.lock"
    lock.touch()
    holder = subprocess.Popen(
        [sys.executable, "-I", "-c", HOLD_LOCK, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(net.NetSetupError) as refused, net._locked(lock, wait_s=0.2):
            pytest.fail("the lock was taken while another process held it")
        said = str(refused.value)
        assert said.startswith(f"{lock} is still locked after 0.2 s, by pid {holder.pid} (")
        assert "fcntl.flock" in said  # its command line
        holder.stdin.close()
        assert holder.wait(timeout=30) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        for pipe in (holder.stdin, holder.stdout):
            if pipe is not None:
                pipe.close()
    with net._locked(lock, wait_s=30):  # let go: taken
        pass


def test_cleanup_leftovers_removes_a_killed_runs_network_and_keeps_live_ones() -> None:
    prefix = "lk" + secrets.token_hex(2)
    script = (
        "import json, sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import net\n"
        f"built = net.TestInternet({prefix!r}).__enter__()\n"
        "print(json.dumps([p.pid for p in built.servers]), flush=True)\n"
        "time.sleep(60)\n"
    )
    with TestInternet(prefix) as live:
        run = subprocess.Popen(
            [sys.executable, "-I", "-c", script], stdout=subprocess.PIPE, text=True
        )
        try:
            assert run.stdout is not None
            servers = json.loads(run.stdout.readline())
        finally:
            os.kill(run.pid, signal.SIGKILL)
            run.wait()
            if run.stdout is not None:
                run.stdout.close()
        left = _with_prefix(prefix)
        assert len(left) == 2 * 5  # each run: 2 netns, 2 root-side veths, 1 temp dir
        removed = net.cleanup_leftovers(prefix)
        assert removed
        mine = {live.public_netns, live.lan_netns, live.public_veth, live.lan_veth}
        assert set(_with_prefix(prefix)) == mine | {str(live.tmp)}
        for pid in servers:
            assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid)
        got = _curl(live, f"http://{live.www.address}/")
        assert got.stdout == f"{WWW}\n"
        assert _stray_routes() == []
    assert _with_prefix(prefix) == []


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_host_lookup_by_name_address_and_host(internet: TestInternet) -> None:
    www: Host = internet.www
    assert internet.host(WWW) is www
    assert internet.host(www.address) is www
    assert internet.host(www) is www
    assert www.url("https", "/big?bytes=1") == f"https://{WWW}/big?bytes=1"
    with pytest.raises(KeyError):
        internet.host("nowhere.example")
