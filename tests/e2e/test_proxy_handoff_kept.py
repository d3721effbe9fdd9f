"""A sender that keeps a copy of the socket it handed over (`lnk_proxy.handoff`,
`lnk_shared.handed_socket`), attacking the proxy's one event loop: the sandbox's program can
connect to its unix listener as the relay does and hand over a TCP socket it made itself. It
keeps its descriptor, clears O_NONBLOCK on the open file description it shares with the
proxy's, asks for a large answer (plain http, and through a tunnel) and never reads. Were any
`send` or `splice` of the proxy to wait in the kernel, every sandbox would stall: another
sandbox's c=1 requests must still be answered within `ANSWERED_S` each, and the attacker's
exchange and tunnel end when its sandbox is stopped (plain http would also end at the proxy's
`IO_TIMEOUT_S` idle bound, 300 s, too long to wait for here).

The sender is root test code in a network namespace of its own (`handoff_senders`), which is
what the proxy sees of a sandbox's program: a unix connection and a descriptor."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from handoff_senders import fresh_connection, hand, make_blocking, own_netns
from net import WWW, TestInternet
from proxy_alone import STOP_SEEN_S, Proxy, alone_proxy, connect_request, get, read_response

from lnk_shared.handed_sockets import HEADER

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

BIG = 256 * 1024 * 1024  # far more than every buffer between the proxy and the attacker
FILLED_S = 1.0  # for the proxy to fill those buffers and be waiting (or stuck) on them
ANSWERED_S = 1.0  # each of the other sandbox's requests, on a shared 2-core machine
REQUESTS = 20  # the other sandbox's, one at a time
RECEIVE_BUFFER = 4096  # the attacker's client end: it holds little of the answer


@pytest.fixture(scope="module")
def proxy(internet: TestInternet) -> Iterator[Proxy]:
    with alone_proxy(internet) as built:
        yield built


@pytest.fixture(scope="module")
def netns() -> Iterator[Path]:
    with own_netns() as path:
        yield path


def one_request(path: Path) -> float:
    """One c=1 request of the other sandbox on a new connection: its time to the answer."""
    started = time.monotonic()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5 * ANSWERED_S)
        sock.connect(str(path))
        sock.sendall(get(WWW))
        head, body = read_response(sock)
    assert head.startswith(b"HTTP/1.1 200") and body == f"{WWW}\n".encode(), head
    return time.monotonic() - started


def kept_hand_off(path: Path, netns: Path) -> tuple[socket.socket, socket.socket]:
    """A connection handed over with the sender's copy kept and made blocking: (client end,
    the kept copy). The client end reads next to nothing."""
    listener, client, accepted = fresh_connection(netns)
    listener.close()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    assert hand(path, HEADER, [accepted.fileno()]) == b""  # taken: set non-blocking by then
    make_blocking(accepted)
    return client, accepted


def test_a_kept_copy_made_blocking_and_never_read_stalls_no_other_sandbox(
    proxy: Proxy, internet: TestInternet, netns: Path
) -> None:
    attacker = proxy.open("sbx-kept", internet=[WWW])
    other = proxy.open("sbx-kept-other", internet=[WWW])
    held: list[socket.socket] = []
    try:
        plain, kept = kept_hand_off(attacker, netns)
        held += [plain, kept]
        plain.sendall(get(WWW, f"/big?bytes={BIG}"))
        tunneled, kept = kept_hand_off(attacker, netns)
        held += [tunneled, kept]
        tunneled.sendall(connect_request(f"{WWW}:80"))
        assert read_response(tunneled)[0] == b"HTTP/1.1 200 Connection Established"
        tunneled.sendall(f"GET /big?bytes={BIG} HTTP/1.1\r\nHost: {WWW}\r\n\r\n".encode())
        time.sleep(FILLED_S)

        times = [one_request(other) for _ in range(REQUESTS)]
        assert max(times) < ANSWERED_S, [round(t, 3) for t in times]

        (proxy.flags / "sbx-kept.stop").write_text("")
        deadline = time.monotonic() + STOP_SEEN_S + 2
        while len(lines := proxy.log("sbx-kept")) < 2:  # each written as its exchange ends
            assert time.monotonic() < deadline, f"the attacker's did not end at stop: {lines}"
            time.sleep(0.1)
        assert all("stopped" in e.get("error", "") for e in lines), lines
    finally:
        for sock in held:
            sock.close()
        with contextlib.suppress(FileNotFoundError):
            (proxy.flags / "sbx-kept.stop").unlink()
        proxy.admin({"op": "close", "sandbox": "sbx-kept"})
        proxy.admin({"op": "close", "sandbox": "sbx-kept-other"})
