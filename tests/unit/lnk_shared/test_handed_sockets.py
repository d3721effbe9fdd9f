"""lnk_shared.handed_sockets: the hand-off's judgement as tables (pure), then `receive` and `take`
on real descriptors of this process: each bad kind is refused with its rule and closed."""

from __future__ import annotations

import array
import os
import socket
from collections.abc import Iterator

import pytest

from lnk_shared.handed_sockets import (
    HANDED_BUFFER,
    HEADER,
    HandOffRefused,
    Received,
    SocketFacts,
    judge_message,
    judge_socket,
    own_netns_cookie,
    receive,
    take,
)

INET, INET6, UNIX = socket.AF_INET, socket.AF_INET6, socket.AF_UNIX
STREAM, DGRAM, SEQPACKET = socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET
TCP, UDP, SCTP, MPTCP = socket.IPPROTO_TCP, socket.IPPROTO_UDP, 132, 262
ESTABLISHED, CLOSE_WAIT, LISTEN, SYN_SENT, CLOSE = 1, 8, 10, 2, 7
OWN, OTHER = 4096, 8192  # network namespaces' cookies
GOOD = SocketFacts(True, INET, STREAM, TCP, False, ESTABLISHED, True, True, OTHER)


def _facts(**changed: object) -> SocketFacts:
    values = {**GOOD.__dict__, **changed}
    return SocketFacts(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("data", "fds", "truncated", "rule"),
    [
        (HEADER, 1, False, None),
        (HEADER, 0, False, "handoff-descriptors"),
        (HEADER, 2, False, "handoff-descriptors"),
        (HEADER, 1, True, "handoff-descriptors"),  # more than the control buffer held
        (HEADER, 0, True, "handoff-descriptors"),
        (HEADER + b"GET http://www/ HTTP/1.1\r\n\r\n", 1, False, "handoff-bytes"),
        (b"GET http://www/ HTTP/1.1\r\n\r\n" + HEADER, 1, False, "handoff-bytes"),
        (b"GET http://www/ HTTP/1.1\r\n\r\n", 1, False, "handoff-bytes"),
        (HEADER[:-1], 1, False, "handoff-bytes"),
        (b"", 1, False, "handoff-bytes"),
    ],
)
def test_a_message_is_exactly_the_header_and_one_descriptor(
    data: bytes, fds: int, truncated: bool, rule: str | None
) -> None:
    refused = judge_message(data, fds, truncated)
    assert (refused.rule if refused else None) == rule


@pytest.mark.parametrize(
    ("facts", "own", "rule"),
    [
        (GOOD, OWN, None),
        (_facts(family=INET6), OWN, None),
        (_facts(tcp_state=CLOSE_WAIT), OWN, None),  # a client that half-closed after its request
        (SocketFacts(is_socket=False), OWN, "handoff-not-socket"),
        (_facts(family=UNIX, protocol=0), OWN, "handoff-family"),
        (_facts(family=socket.AF_NETLINK, type=socket.SOCK_RAW, protocol=0), OWN, "handoff-family"),
        (_facts(family=socket.AF_PACKET, type=socket.SOCK_RAW), OWN, "handoff-family"),
        (_facts(family=UNIX, type=SEQPACKET, protocol=0), OWN, "handoff-family"),
        (_facts(type=DGRAM, protocol=UDP), OWN, "handoff-type"),
        (_facts(type=SEQPACKET, protocol=SCTP), OWN, "handoff-type"),
        (_facts(type=socket.SOCK_RAW, protocol=TCP), OWN, "handoff-type"),
        (_facts(protocol=SCTP), OWN, "handoff-protocol"),
        (_facts(protocol=MPTCP), OWN, "handoff-protocol"),
        (_facts(listening=True, tcp_state=LISTEN), OWN, "handoff-listening"),
        (_facts(tcp_state=CLOSE, peer_loopback=False), OWN, "handoff-unconnected"),
        (_facts(tcp_state=SYN_SENT), OWN, "handoff-unconnected"),
        (_facts(peer_loopback=False), OWN, "handoff-not-loopback"),
        (_facts(local_loopback=False), OWN, "handoff-not-loopback"),
        (_facts(netns_cookie=OWN), OWN, "handoff-namespace"),  # the host's network, forged
        (_facts(netns_cookie=None), OWN, "handoff-namespace"),  # a kernel before 5.14
        (GOOD, None, "handoff-namespace"),
    ],
)
def test_a_handed_socket_is_a_connected_tcp_socket_of_another_namespace(
    facts: SocketFacts, own: int | None, rule: str | None
) -> None:
    refused = judge_socket(facts, own)
    assert (refused.rule if refused else None) == rule


@pytest.fixture
def unix_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    pair = socket.socketpair()
    yield pair
    for sock in pair:
        sock.close()


def _send(sender: socket.socket, data: bytes, fds: list[int]) -> None:
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sender.sendmsg([data], rights)


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_receive_takes_the_header_and_its_descriptor(
    unix_pair: tuple[socket.socket, socket.socket],
) -> None:
    sender, receiver = unix_pair
    with socket.socket() as carried:
        _send(sender, HEADER, [carried.fileno()])
        received = receive(receiver, 65536)
    assert received.data == HEADER and len(received.fds) == 1 and not received.truncated
    assert received.is_handoff
    received.close()
    assert not _open(received.fds[0])


def test_receive_of_an_ordinary_connection_is_its_bytes(
    unix_pair: tuple[socket.socket, socket.socket],
) -> None:
    sender, receiver = unix_pair
    sender.sendall(b"GET http://www/ HTTP/1.1\r\n\r\n")
    received = receive(receiver, 65536)
    assert received == Received(b"GET http://www/ HTTP/1.1\r\n\r\n", (), False)
    assert not received.is_handoff


def test_receive_never_waits(unix_pair: tuple[socket.socket, socket.socket]) -> None:
    with pytest.raises(BlockingIOError):
        receive(unix_pair[1], 65536)


def test_three_descriptors_install_at_most_two_and_are_refused(
    unix_pair: tuple[socket.socket, socket.socket],
) -> None:
    sender, receiver = unix_pair
    carried = [socket.socket() for _ in range(3)]
    try:
        _send(sender, HEADER, [s.fileno() for s in carried])
        received = receive(receiver, 65536)
    finally:
        for sock in carried:
            sock.close()
    assert len(received.fds) <= 2 and received.truncated
    refused = take(received)
    assert isinstance(refused, HandOffRefused) and refused.rule == "handoff-descriptors"
    assert not any(_open(fd) for fd in received.fds)


def _tcp_pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    """A listener and a loopback connection through it (client, accepted): this namespace's."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    return listener, client, accepted


def _bad_kinds(keep: list[socket.socket]) -> list[tuple[str, int, str]]:
    """(what, its descriptor, the rule refusing it); every socket made is in `keep`."""
    read_end, write_end = os.pipe()
    os.close(write_end)
    listener, client, accepted = _tcp_pair()
    udp = socket.socket(INET, DGRAM)
    udp.connect(("127.0.0.1", 9))
    unix, seqpacket = socket.socketpair(), socket.socketpair(UNIX, SEQPACKET)
    unconnected = socket.socket()
    keep += [listener, client, accepted, udp, *unix, *seqpacket, unconnected]
    return [
        ("a pipe", read_end, "handoff-not-socket"),
        ("a unix socket", unix[0].fileno(), "handoff-family"),
        ("a unix seqpacket socket", seqpacket[0].fileno(), "handoff-family"),
        ("UDP", udp.fileno(), "handoff-type"),
        ("a listening socket", listener.fileno(), "handoff-listening"),
        ("an unconnected socket", unconnected.fileno(), "handoff-unconnected"),
        ("this namespace's connection", accepted.fileno(), "handoff-namespace"),
    ]


@pytest.mark.parametrize("index", range(7))
def test_each_bad_descriptor_is_refused_and_closed(index: int) -> None:
    keep: list[socket.socket] = []
    kinds = _bad_kinds(keep)
    try:
        name, carried, rule = kinds[index]
        fd = os.dup(carried)
        refused = take(Received(HEADER, (fd,), False))
        assert isinstance(refused, HandOffRefused), name
        assert refused.rule == rule, (name, refused)
        assert not _open(fd), f"{name}: the received descriptor was left open"
    finally:
        os.close(kinds[0][1])
        for sock in keep:
            sock.close()


def test_a_socket_of_another_namespace_is_taken_non_blocking_with_fixed_buffers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The namespace rule alone: this process's own cookie made to differ (the e2e tests hand
    a real sandbox's socket)."""
    cookie = own_netns_cookie()
    assert cookie is not None, "this kernel does not name network namespaces (Linux < 5.14)"
    monkeypatch.setattr("lnk_shared.handed_sockets.own_netns_cookie", lambda: cookie + 1)
    listener, client, accepted = _tcp_pair()
    try:
        taken = take(Received(HEADER, (os.dup(accepted.fileno()),), False))
        assert isinstance(taken, socket.socket)
        with taken:
            assert taken.getblocking() is False
            sndbuf = taken.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            assert sndbuf == 2 * HANDED_BUFFER  # doubled by the kernel
            client.sendall(b"ping")
            assert taken.recv(4) == b"ping"
    finally:
        for sock in (listener, client, accepted):
            sock.close()
