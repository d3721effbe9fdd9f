"""A TCP connection one process hands another over a unix socket (`SCM_RIGHTS`), judged:
the message and the descriptor a sandbox's relay sends to the box's unix listeners (the proxy's,
which serves it: `lnk_proxy.handoff` says why and what it does NOT stop; the controller's
stand-in, which answers it while the proxy is down).

The message is exactly `HEADER` with exactly one descriptor (`judge_message`), and that
descriptor a connected, non-listening TCP socket (`SOCK_STREAM`, `IPPROTO_TCP`, `AF_INET` or
`AF_INET6`) with both ends on loopback, of a network namespace the kernel names and that is not
the receiver's own (`judge_socket`). Both are pure and table-tested; `socket_facts` asks the
kernel, `take` applies both and gives the socket, non-blocking with fixed buffers, or the
refusal with every descriptor received closed unused. The socket is a `HandedSocket`
(`lnk_shared.handed_socket`): the sender may have kept a copy, so none of its calls waits.
"""

from __future__ import annotations

import array
import contextlib
import ipaddress
import os
import socket
import stat
import struct
from dataclasses import dataclass
from functools import cache

from lnk_shared.handed_socket import HandedSocket

__all__ = [
    "HANDED_BUFFER",
    "HEADER",
    "MAX_DESCRIPTORS",
    "HandOffRefused",
    "Received",
    "SocketFacts",
    "judge_message",
    "judge_socket",
    "own_netns_cookie",
    "receive",
    "socket_facts",
    "take",
]

HEADER = b"\x00lnk-fd1"  # NUL first: never the start of an HTTP request (RFC 9112 token)
# Descriptors one message may install in the receiver: one more than allowed, so two are seen
# (and refused) rather than silently truncated to one.
MAX_DESCRIPTORS = 2
# The handed socket's SO_SNDBUF and SO_RCVBUF until its user sets others: a unix socket's
# default (net.core.wmem_default, 208 KiB as the kernel counts it, half asked), so a handed
# socket pins what a unix connection would, never TCP's autotuned 4-32 MiB.
HANDED_BUFFER = 212_992 // 2
SO_NETNS_COOKIE = 71  # <asm-generic/socket.h>, Linux 5.14; not in Python's socket module
TCP_ESTABLISHED = 1  # <netinet/tcp.h> tcp_state
TCP_CLOSE_WAIT = 8  # the client half-closed after its request: still a connection to answer
_CONNECTED = frozenset({TCP_ESTABLISHED, TCP_CLOSE_WAIT})
_INT = array.array("i").itemsize


@dataclass(frozen=True)
class HandOffRefused:
    """Why a hand-off is refused: a rule id (`handoff-…`) and the reason, for the log."""

    rule: str
    reason: str


@dataclass(frozen=True)
class Received:
    """The first message of a unix connection: its bytes, the descriptors that came with them,
    and whether the kernel dropped control data that did not fit (`MSG_CTRUNC`)."""

    data: bytes
    fds: tuple[int, ...]
    truncated: bool

    @property
    def is_handoff(self) -> bool:
        """A hand-off, good or bad: descriptors came, or the bytes begin as `HEADER` does."""
        return bool(self.fds) or self.truncated or self.data[:1] == HEADER[:1]

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(frozen=True)
class SocketFacts:
    """What the kernel says of a handed descriptor (`socket_facts`)."""

    is_socket: bool
    family: int = 0
    type: int = 0
    protocol: int = 0
    listening: bool = False
    tcp_state: int = 0  # 0: not asked (not TCP)
    peer_loopback: bool = False
    local_loopback: bool = False
    netns_cookie: int | None = None  # None: the kernel did not say


def judge_message(data: bytes, fds: int, truncated: bool) -> HandOffRefused | None:
    """A hand-off message: exactly `HEADER` and exactly one descriptor. Pure."""
    if truncated or fds > 1:
        return HandOffRefused("handoff-descriptors", f"{fds} descriptors (or more) in one message")
    if fds == 0:
        return HandOffRefused("handoff-descriptors", "a hand-off header without a descriptor")
    if data != HEADER:
        if data.startswith(HEADER):
            reason = f"{len(data) - len(HEADER)} bytes beside the hand-off header"
        else:
            reason = f"a descriptor with {len(data)} bytes that are not the hand-off header"
        return HandOffRefused("handoff-bytes", reason)
    return None


def judge_socket(facts: SocketFacts, own_netns: int | None) -> HandOffRefused | None:
    """Whether a handed descriptor is a connected TCP socket on loopback of another network
    namespace than `own_netns` (`lnk_proxy.handoff` says why each rule). Pure."""
    refused = _judge_kind(facts)
    if refused is not None:
        return refused
    if facts.listening:
        return HandOffRefused("handoff-listening", "a listening socket")
    if facts.tcp_state not in _CONNECTED:
        return HandOffRefused("handoff-unconnected", f"a TCP socket in state {facts.tcp_state}")
    if not (facts.peer_loopback and facts.local_loopback):
        return HandOffRefused("handoff-not-loopback", "a connection not on loopback at both ends")
    if facts.netns_cookie is None or own_netns is None:
        reason = "the kernel does not name the socket's network namespace"
        return HandOffRefused("handoff-namespace", reason)
    if facts.netns_cookie == own_netns:
        reason = "a socket of the receiver's own network namespace"
        return HandOffRefused("handoff-namespace", reason)
    return None


def _judge_kind(facts: SocketFacts) -> HandOffRefused | None:
    if not facts.is_socket:
        return HandOffRefused("handoff-not-socket", "the descriptor is not a socket")
    if facts.family not in (socket.AF_INET, socket.AF_INET6):
        return HandOffRefused("handoff-family", f"a socket of family {facts.family}, not IP")
    if facts.type != socket.SOCK_STREAM:
        return HandOffRefused("handoff-type", f"a socket of type {facts.type}, not a stream")
    if facts.protocol != socket.IPPROTO_TCP:
        return HandOffRefused("handoff-protocol", f"a stream of protocol {facts.protocol}")
    return None


def receive(sock: socket.socket, size: int) -> Received:
    """One `recvmsg` of at most `size` bytes and `MAX_DESCRIPTORS` descriptors (close-on-exec),
    never waiting: BlockingIOError when nothing is there yet."""
    space = socket.CMSG_SPACE(MAX_DESCRIPTORS * _INT)
    flags = socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC
    data, ancillary, msg_flags, _ = sock.recvmsg(size, space, flags)
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % _INT
            fds.extend(array.array("i", payload[:usable]))
    return Received(data, tuple(fds), bool(msg_flags & socket.MSG_CTRUNC))


def take(received: Received) -> HandedSocket | HandOffRefused:
    """The handed socket, judged (every descriptor received is closed on a refusal), set
    non-blocking, its buffers fixed (`HANDED_BUFFER`), as a `HandedSocket`: never waiting,
    whatever a kept copy does to the file's flags."""
    refused = judge_message(received.data, len(received.fds), received.truncated)
    if refused is not None:
        received.close()
        return refused
    fd = received.fds[0]
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            os.close(fd)
            return HandOffRefused("handoff-not-socket", "the descriptor is not a socket")
        sock = HandedSocket(fileno=fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.close(fd)
        return HandOffRefused("handoff-unusable", f"the kernel does not describe it: {exc}")
    try:
        refused = judge_socket(socket_facts(sock), own_netns_cookie())
        if refused is None:
            sock.setblocking(False)  # before any read or write
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, HANDED_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, HANDED_BUFFER)
    except OSError as exc:
        refused = HandOffRefused("handoff-unusable", f"the kernel does not describe it: {exc}")
    if refused is not None:
        sock.close()
        return refused
    return sock


def socket_facts(sock: socket.socket) -> SocketFacts:
    """What the kernel says of a socket (OSError when it will not say)."""
    get = sock.getsockopt
    family = get(socket.SOL_SOCKET, socket.SO_DOMAIN)
    kind = get(socket.SOL_SOCKET, socket.SO_TYPE)
    protocol = get(socket.SOL_SOCKET, socket.SO_PROTOCOL)
    listening = bool(get(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    tcp = family in (socket.AF_INET, socket.AF_INET6) and protocol == socket.IPPROTO_TCP
    state = get(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] if tcp else 0
    peer = _loopback(sock, peer=True) if tcp else False
    local = _loopback(sock, peer=False) if tcp else False
    return SocketFacts(True, family, kind, protocol, listening, state, peer, local, _cookie(sock))


def _loopback(sock: socket.socket, *, peer: bool) -> bool:
    try:
        name = sock.getpeername() if peer else sock.getsockname()
    except OSError:
        return False  # not connected
    address = ipaddress.ip_address(str(name[0]).partition("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _cookie(sock: socket.socket) -> int | None:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8)
    except OSError:
        return None
    return int(struct.unpack("=Q", raw)[0])


@cache
def own_netns_cookie() -> int | None:
    """This process's network namespace's cookie (a socket of its own, asked once)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        return _cookie(sock)
