"""No sandbox starves another in the shared proxy: the proxy (as nobody, in a namespace of its
own: `test_proxy_routes.Machine`) on the system resolver, whose DNS server (`DNS`, on the LAN
host of that namespace) holds or drops the queries the test picks.

- 400 concurrent CONNECTs from one sandbox to a name whose answer is held: the tunnel cap is
  reserved before the lookup's await, so exactly the cap are opened once the answer comes, and
  every other one is refused at once (`too-many-tunnels`), not queued.
- A sandbox whose lookups never answer holds only its own lookup threads (`too-many-lookups`
  past its cap); another sandbox's launch and its lookup of a name from /etc/hosts are served
  within `FAIR_BOUND_S` meanwhile (before, they waited behind the shared pool: 5 s, then failed).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # pytest's importlib mode adds no test dir
from proxy_alone import IO_TIMEOUT_S, ask, connect_request, get, read_response
from test_proxy_routes import SANDBOX, Machine, built

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

TUNNEL_CAP = 16  # the proxy's max_tunnels_per_sandbox here: small, so the test is quick
CONCURRENT = 400
DROPPED = 40  # lookups that never answer, from one sandbox
LOOKUP_CAP = 16  # lnk_proxy.resolver.MAX_LOOKUPS
FAIR_BOUND_S = 1.0  # a launch and a hosts-file lookup take milliseconds; 5 s before the fix
QUERY_SEEN_S = 10.0  # the proxy's first query reaches the DNS server in milliseconds
AGGREGATE_WINDOW_S = 5.0  # lnk_proxy.wire_log's
COUNT_SEEN_S = 2.0  # the proxy writes a window's count within 0.5 s of its end
LOG_BOUND = 256 * 1024  # the flood test's wire_log_max_bytes
FLOOD = 3000  # refusals, about 200 bytes of log each: 600 KB offered to a 256 KiB log
DNS = r"""
import json, select, socket, struct, sys
log = open(sys.argv[1], "a", buffering=1)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("0.0.0.0", 53))
held, released = [], False

def answer(query, peer):
    qid, = struct.unpack_from("!H", query)
    end = 12
    while query[end]:
        end += query[end] + 1
    question = query[12 : end + 5]
    qtype, = struct.unpack_from("!H", query, end + 1)
    count = 1 if qtype == 1 else 0
    reply = struct.pack("!HHHHHH", qid, 0x8180, 1, count, 0, 0) + question
    if count:
        reply += struct.pack("!HHHIH", 0xC00C, 1, 1, 60, 4) + socket.inet_aton("10.91.0.2")
    udp.sendto(reply, peer)

def name_of(query):
    labels, at = [], 12
    while query[at]:
        labels.append(query[at + 1 : at + 1 + query[at]].decode("ascii", "replace"))
        at += query[at] + 1
    return ".".join(labels).lower()

print("ready", flush=True)
while True:
    ready, _, _ = select.select([udp, sys.stdin], [], [])
    if sys.stdin in ready:
        if not sys.stdin.readline():
            break
        for query, peer in held:
            answer(query, peer)
        held.clear()
        released = True  # from now on answered at once
        continue
    query, peer = udp.recvfrom(4096)
    name = name_of(query)
    log.write(json.dumps({"name": name}) + "\n")
    if name.endswith(".dropped.test-lan.example"):
        continue
    if name == "held.test-lan.example" and not released:
        held.append((query, peer))
        continue
    answer(query, peer)
"""


class Dns:
    def __init__(self, made: Machine) -> None:
        self.log = made.base / "dns.log"
        self.log.touch()
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", made.lan, sys.executable, "-I", "-c", DNS, str(self.log)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        made.processes.append(self.process)  # ended by made.close()
        assert self.process.stdout is not None
        assert self.process.stdout.readline() == b"ready\n", "the DNS server did not start"

    def asked(self) -> list[str]:
        return [json.loads(line)["name"] for line in self.log.read_text().splitlines()]

    def wait_asked(self, name: str) -> None:
        deadline = time.monotonic() + QUERY_SEEN_S
        while not any(n == name or n.endswith(name) for n in self.asked()):
            assert time.monotonic() < deadline, f"the proxy never asked for {name}"
            time.sleep(0.01)

    def release(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"release\n")
        self.process.stdin.flush()


@pytest.fixture
def machine() -> Iterator[tuple[Machine, Dns]]:
    config = f"max_tunnels_per_sandbox = {TUNNEL_CAP}\n"
    with built(skip_route_check=False, system_resolver=True, config=config) as made:
        yield made, Dns(made)


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))  # blocking: waits for room in the listener's backlog
    sock.settimeout(IO_TIMEOUT_S)
    return sock


def test_concurrent_connects_never_open_more_than_the_cap(machine: tuple[Machine, Dns]) -> None:
    made, dns = machine
    before = len(made.accepted(made.lan))
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(_connect(made.socket)) for _ in range(CONCURRENT)]
        for sock in socks:
            sock.sendall(connect_request("held.test-lan.example:80"))
        dns.wait_asked("held.test-lan.example")
        dns.release()
        heads = [read_response(sock) for sock in socks]
        opened = [h for h, _ in heads if h.startswith(b"HTTP/1.1 200")]
        refused = [b for h, b in heads if h.startswith(b"HTTP/1.1 403")]
        assert len(opened) == TUNNEL_CAP, [h for h, _ in heads if not h.startswith(b"HTTP/1.1 ")]
        assert refused == [b"lnk: refused (too-many-tunnels)\n"] * (CONCURRENT - TUNNEL_CAP)
        assert len(made.accepted(made.lan)) - before == TUNNEL_CAP
    # Aggregated: the first refusal at once, the repeats as one count when the window ends.
    deadline = time.monotonic() + AGGREGATE_WINDOW_S + COUNT_SEEN_S
    while True:
        lines = [e for e in made.proxy.log(SANDBOX) if e["rule"] == "too-many-tunnels"]
        logged = sum(e.get("repeated") or 1 for e in lines)  # a count line: its repeats
        if logged >= CONCURRENT - TUNNEL_CAP or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert logged == CONCURRENT - TUNNEL_CAP and len(lines) == 2, lines


def test_a_refusal_flood_leaves_allowed_decisions_logged_and_the_log_bounded() -> None:
    config = f"wire_log_max_bytes = {LOG_BOUND}\n"
    with built(skip_route_check=False, config=config) as made:
        for i in range(FLOOD):  # every target new: aggregation cannot fold them
            _, body = ask(made.socket, connect_request(f"h{i}.nowhere.test-lan.example:80"))
            assert body == b"lnk: refused (no-address)\n"
        path = made.proxy.wire / f"{SANDBOX}.log"
        assert path.stat().st_size <= LOG_BOUND * 3 // 4  # the last quarter kept
        before = len(made.accepted(made.lan))
        allowed = 0
        while True:
            head, body = ask(made.socket, get("nas.test-lan.example"))
            if not head.startswith(b"HTTP/1.1 200"):
                break
            allowed += 1
            assert allowed < FLOOD, "the log never filled"
        assert body == b"lnk: refused (log-full)\n"
        assert len(made.accepted(made.lan)) - before == allowed  # the refused one went nowhere
        logged = [e for e in made.proxy.log(SANDBOX) if e["decision"] == "allowed"]
        assert len(logged) == allowed > 0  # every exchange that went out is in the log
        assert path.stat().st_size <= LOG_BOUND


def test_lookups_that_never_answer_delay_no_other_sandbox(machine: tuple[Machine, Dns]) -> None:
    made, dns = machine
    with contextlib.ExitStack() as stack:
        flood = [stack.enter_context(_connect(made.socket)) for _ in range(DROPPED)]
        for i, sock in enumerate(flood):
            sock.sendall(get(f"n{i}.dropped.test-lan.example"))  # plain: no tunnel slot
        dns.wait_asked(".dropped.test-lan.example")
        started = time.monotonic()
        other = made.proxy.open("sbx-other", lan_any=True)  # a launch, meanwhile
        launched = time.monotonic() - started
        started = time.monotonic()
        head, body = ask(other, get("nas.test-lan.example"))  # from /etc/hosts
        looked_up = time.monotonic() - started
        assert (head.split(b"\r\n")[0], body) == (b"HTTP/1.1 200 OK", b"bait\n")
        assert launched < FAIR_BOUND_S and looked_up < FAIR_BOUND_S, (launched, looked_up)
        answers = [read_response(sock)[1] for sock in flood]  # the held ones time out (5 s)
    busy = answers.count(b"lnk: refused (too-many-lookups)\n")
    assert busy == DROPPED - LOOKUP_CAP, answers
    assert answers.count(b"lnk: refused (no-address)\n") == LOOKUP_CAP
