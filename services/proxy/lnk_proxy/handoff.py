"""A sandbox's TCP connection handed to the proxy over its unix listener (`SCM_RIGHTS`), so the
proxy serves the sandbox's client socket itself and the relay inside moves no byte of it.

Why: a 1 GiB tunnel through the relay was CPU-bound on two cores (bench/README.md, session 11:
1.17 CPU-s a GiB against 0.72 direct, 90-95 % kernel time): the relay's splices were a whole
extra hop. The relay now accepts the client's connection on 127.0.0.1 of the sandbox's network
namespace, connects to the sandbox's unix listener, sends `HEADER` with the accepted socket in
one message and closes its copies. The proxy then serves that socket exactly as a unix
connection of that listener: the same sandbox, grants, caps, buffers and wire log.

The message (the first the connection carries, read by `first_read`): exactly `HEADER` (its
first byte NUL, which never starts an HTTP request, so a client speaking HTTP on the unix
socket is never taken for a hand-off) and exactly one descriptor. What the proxy accepts of
that descriptor (`lnk_shared.handed_sockets`: the judgement is pure and table-tested, and the
controller's stand-in uses it too while the proxy is down), and why each rule:
- a socket (`fstat`): anything else is not a connection to serve;
- `AF_INET` or `AF_INET6`, `SOCK_STREAM`, `IPPROTO_TCP`: the relay hands only what it
  accepted on its TCP listener. Unix sockets are refused (one could be a connection to another
  service, or carry descriptors of its own), as are netlink and packet sockets (the kernel's
  and the link's), UDP, SOCK_SEQPACKET, SCTP and MPTCP;
- not listening (`SO_ACCEPTCONN`) and connected (TCP state ESTABLISHED, or CLOSE_WAIT for a
  client that already half-closed): the proxy only reads and writes, it never accepts or dials
  on a handed socket;
- both ends on loopback: inside the sandbox's namespace there is nothing else;
- a network namespace that is not the proxy's own (`SO_NETNS_COOKIE`): a socket of the
  proxy's namespace would be a connection on this machine, to any local service, made by a
  sandbox with the host's network or by a forged sender; the proxy would speak to that peer.
  A namespace the kernel cannot name (no `SO_NETNS_COOKIE`, Linux < 5.14) is refused.
Anything else, and a message with no descriptor, two or more (or more than the control buffer
held: `MSG_CTRUNC`, the kernel closed the rest), or with bytes beside `HEADER` (a request
smuggled with the descriptor), is refused: every descriptor received is closed unused, the
wire log gets the rule (`handoff-…`) and the reason, and the unix connection gets the 403.
The control buffer has room for `MAX_DESCRIPTORS`: at most that many are ever installed in
the proxy by one message.

Never blocking on it, whoever else holds it: the sender may have kept its descriptor (the
sandbox's program can connect to its listener as the relay does and hand over a socket it made
itself), and a kept copy shares the open file description, O_NONBLOCK included. So the handed
socket is a `HandedSocket` (`lnk_shared.handed_socket`: every recv and send with
`MSG_DONTWAIT`, no blocking mode, no timeout, no bind, listen, accept or connect), the loop
never splices it (a TCP socket's splice follows the file's flag): a tunnel splices in
a thread of its own while its sandbox and the box have slots (`handed_splice`), else
`Conn.splice_to` copies through a pooled buffer; and its close, which SO_LINGER set by the
other holder can make wait, runs in its sandbox's thread (`handed_close`). It counts as the
connection it arrived on (one task of the listener's `connections`, until its close is done:
the per-sandbox cap, the descriptor share of `descriptors`); its send and receive buffers get
fixed sizes at once (`HANDED_BUFFER`: the unix socket's default, so the plain http bounds of
`tunnel_buffers` hold; a tunnel sets its own). Bytes the sandbox sent that wait in its receive
queue are charged to the sandbox's cgroup (the relay accepted it there), as the unix socket's
were to the sandbox's send buffer. What else a kept copy can do, and why it is harmless:
`lnk_shared.handed_socket`.

Who may send: only processes that reach the listener's path, i.e. the sandbox (its relay: the
program itself cannot make a unix socket, and the relay is not dumpable, so its descriptors
cannot be taken with `pidfd_getfd` or /proc) and root.

Security limitations: this does NOT
- prove the socket is of that sandbox's own namespace, only that it is not the proxy's (the
  proxy is not told the sandbox's namespace); a root sender may hand any other namespace's;
- stop a sender that keeps a copy from using the connection beside the proxy (reading the
  answers, writing, shutting it down, resetting or reconnecting it inside its namespace): it
  is the sandbox's own connection; the proxy sees an error or an end and ends the exchange;
- bound how long a close lingers when the other holder wins the race against `HandedSocket`
  turning SO_LINGER off: that sandbox's closes wait behind it (`handed_close`), nobody else's;
- splice every handed tunnel: past `handed_splice`'s slots one is copied on the loop, which
  costs the proxy more CPU (bench/README.md, session 13).
"""

from __future__ import annotations

import socket

from lnk_proxy.conn import READ_CHUNK, Conn
from lnk_proxy.listeners import Refusal
from lnk_shared.handed_sockets import Received, receive, take

__all__ = ["first_read", "take_handed"]


async def first_read(client: Conn) -> Received:
    """The connection's first message, with any descriptors (`MAX_DESCRIPTORS` fit), waited
    for under the client's deadline; an ordinary one's bytes are left in `client.buffer`."""
    while True:
        try:
            received = receive(client.sock, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            await client.readable()
            continue
        break
    if not received.is_handoff:
        client.received += len(received.data)
        client.buffer += received.data
    return received


def take_handed(received: Received) -> Conn | Refusal:
    """The handed socket, judged, as a connection to serve; or the refusal (every descriptor
    received closed unused)."""
    taken = take(received)
    if not isinstance(taken, socket.socket):
        return Refusal(taken.rule, taken.reason)
    return Conn(taken)
