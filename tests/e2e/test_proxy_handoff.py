"""A sandbox's connection handed to the proxy (`lnk_proxy.handoff`), attacked by a forged sender:
root test code connecting to a sandbox's listener of the proxy run alone (`proxy_alone.py`), as
the relay would, and sending each descriptor the proxy must refuse (each carrying a request
for a granted host that the proxy would dial if it served it): the unix connection gets the
403 naming the rule, the wire log the rule, nothing is dialed, and nothing is written to the
handed socket. Then the granted path: a TCP connection of another network namespace (a netns
the test makes, as a sandbox's is), handed over the same way, is served as the sandbox's own
(plain http, keep-alive, a CONNECT tunnel), and counted by the admin `stats`.

Real sandboxes (whose relay hands every connection over): test_proxy_handoff_sandbox.py."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from handoff_senders import IO_S, fresh_connection, hand, inside, own_netns
from net import WWW, TestInternet
from proxy_alone import Proxy, alone_proxy, connect_request, counts, get, read_response

from lnk_shared.handed_sockets import HEADER

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]


@pytest.fixture(scope="module")
def proxy(internet: TestInternet) -> Iterator[Proxy]:
    with alone_proxy(internet) as built:
        yield built


@pytest.fixture(scope="module")
def netns() -> Iterator[Path]:
    with own_netns() as path:
        yield path


@dataclass
class Made:
    """What a case made: the descriptors to send, the client end that wrote the request (if
    any), and everything to close afterwards."""

    fds: list[int]
    client: socket.socket | None = None
    keep: list[socket.socket] = field(default_factory=list)
    raw: list[int] = field(default_factory=list)

    def close(self) -> None:
        for sock in self.keep:
            sock.close()
        for fd in self.raw:
            with contextlib.suppress(OSError):
                os.close(fd)


def tcp_connection(namespace: Path | None) -> tuple[socket.socket, socket.socket, socket.socket]:
    """(listener, client, accepted) on 127.0.0.1 of `namespace`, the client's request sent."""
    with inside(namespace):
        listener = socket.create_server(("127.0.0.1", 0))
        client = socket.socket()
    client.settimeout(IO_S)
    client.connect(listener.getsockname())
    accepted, _ = listener.accept()
    client.sendall(connect_request(f"{WWW}:80"))
    return listener, client, accepted


def _pipe(_: Path) -> Made:
    read_end, write_end = os.pipe()
    os.write(write_end, connect_request(f"{WWW}:80"))
    return Made([read_end], raw=[read_end, write_end])


def _unix(_: Path) -> Made:
    near, far = socket.socketpair()
    far.sendall(connect_request(f"{WWW}:80"))
    return Made([near.fileno()], far, keep=[near, far])


def _seqpacket(_: Path) -> Made:
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    far.sendall(connect_request(f"{WWW}:80"))
    return Made([near.fileno()], far, keep=[near, far])


def _netlink(_: Path) -> Made:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    return Made([sock.fileno()], keep=[sock])


def _packet(_: Path) -> Made:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    return Made([sock.fileno()], keep=[sock])


def _udp(namespace: Path) -> Made:
    with inside(namespace):
        server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    sock.connect(server.getsockname())
    server.connect(sock.getsockname())
    server.send(connect_request(f"{WWW}:80"))
    return Made([sock.fileno()], server, keep=[server, sock])


def _listening(namespace: Path) -> Made:
    listener, client, accepted = tcp_connection(namespace)  # a connection waits on it too
    return Made([listener.fileno()], client, keep=[listener, client, accepted])


def _unconnected(namespace: Path) -> Made:
    with inside(namespace):
        sock = socket.socket()
    return Made([sock.fileno()], keep=[sock])


def _host_namespace(_: Path) -> Made:
    listener, client, accepted = tcp_connection(None)  # the proxy's own: this machine's
    return Made([accepted.fileno()], client, keep=[listener, client, accepted])


def _two(namespace: Path) -> Made:
    first, second = tcp_connection(namespace), tcp_connection(namespace)
    return Made([first[2].fileno(), second[2].fileno()], first[1], keep=[*first, *second])


def _good(namespace: Path) -> Made:
    """A descriptor the proxy would serve: refused only for what comes beside it."""
    listener, client, accepted = tcp_connection(namespace)
    return Made([accepted.fileno()], client, keep=[listener, client, accepted])


def _none(_: Path) -> Made:
    return Made([])


# (the attack, what it sends, the bytes beside it, the rule that refuses it)
CASES: list[tuple[str, Callable[[Path], Made], bytes, str]] = [
    ("not_a_socket", _pipe, HEADER, "handoff-not-socket"),
    ("a_unix_socket", _unix, HEADER, "handoff-family"),
    ("a_seqpacket_socket", _seqpacket, HEADER, "handoff-family"),
    ("a_netlink_socket", _netlink, HEADER, "handoff-family"),
    ("a_packet_socket", _packet, HEADER, "handoff-family"),
    ("a_udp_socket", _udp, HEADER, "handoff-type"),
    ("a_listening_socket", _listening, HEADER, "handoff-listening"),
    ("an_unconnected_socket", _unconnected, HEADER, "handoff-unconnected"),
    ("a_socket_of_the_proxys_own_namespace", _host_namespace, HEADER, "handoff-namespace"),
    ("two_descriptors", _two, HEADER, "handoff-descriptors"),
    ("a_header_without_a_descriptor", _none, HEADER, "handoff-descriptors"),
    ("a_descriptor_with_a_request_beside_it", _good, HEADER + get(WWW), "handoff-bytes"),
]


@pytest.mark.parametrize(("attack", "make", "data", "rule"), CASES, ids=[c[0] for c in CASES])
def test_a_forged_hand_off_is_refused_and_nothing_is_dialed(
    proxy: Proxy,
    internet: TestInternet,
    netns: Path,
    attack: str,
    make: Callable[[Path], Made],
    data: bytes,
    rule: str,
) -> None:
    sandbox = f"sbx-h{[c[0] for c in CASES].index(attack)}"
    path = proxy.open(sandbox, internet=[WWW])
    made = make(netns)
    try:
        before = counts(internet)
        answer = hand(path, data, made.fds)
        assert answer.startswith(b"HTTP/1.1 403 ") and f"({rule})".encode() in answer, answer
        for sock in made.keep:  # the sender's copies: only the proxy's could still be open
            if sock is not made.client:
                sock.close()
        if made.client is not None and made.client.type == socket.SOCK_STREAM:
            made.client.settimeout(IO_S)
            with contextlib.suppress(ConnectionResetError):
                assert made.client.recv(65536) == b"", "the proxy wrote to a refused socket"
        assert counts(internet) == before, "a refused hand-off was dialed"
        lines = proxy.log(sandbox, 1)
        assert [(e["decision"], e["rule"]) for e in lines] == [("refused", rule)], lines
        assert proxy.admin({"op": "stats", "sandbox": sandbox})["handed"] == 0
    finally:
        made.close()
        proxy.admin({"op": "close", "sandbox": sandbox})


def test_a_connection_of_another_namespace_is_served_as_the_sandboxs_own(
    proxy: Proxy, internet: TestInternet, netns: Path
) -> None:
    """Plain http twice on the handed connection (keep-alive), then a tunnel on a second one."""
    path = proxy.open("sbx-handed", internet=[WWW])
    try:
        before = internet.accepted(internet.www)
        listener, client, accepted = fresh_connection(netns)
        with listener, client:
            assert hand(path, HEADER, [accepted.fileno()]) == b""  # nothing on the unix side
            accepted.close()  # the sender keeps no copy
            for _ in range(2):
                client.sendall(get(WWW))
                head, body = read_response(client)
                assert head.startswith(b"HTTP/1.1 200") and body == f"{WWW}\n".encode()
        listener, client, accepted = tcp_connection(netns)  # its CONNECT already sent
        with listener, client:
            hand(path, HEADER, [accepted.fileno()])
            accepted.close()
            assert read_response(client)[0] == b"HTTP/1.1 200 Connection Established"
            client.sendall(f"GET / HTTP/1.1\r\nHost: {WWW}\r\n\r\n".encode())
            assert read_response(client)[1] == f"{WWW}\n".encode()
        assert internet.accepted(internet.www) > before
        assert proxy.admin({"op": "stats", "sandbox": "sbx-handed"})["handed"] == 2
        rules = [(e["decision"], e["rule"]) for e in proxy.log("sbx-handed", 3)]
        assert rules == [("allowed", "allowed-internet")] * 3, rules
    finally:
        proxy.admin({"op": "close", "sandbox": "sbx-handed"})
