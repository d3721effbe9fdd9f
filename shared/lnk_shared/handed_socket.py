"""A socket another process handed over (`SCM_RIGHTS`), used as if that process still held it:
every call that moves bytes passes `MSG_DONTWAIT`, and nothing that could wait is allowed.

Why: a descriptor received over a unix socket is the sender's open file description, not a copy
of it. A sender that kept its descriptor (the sandbox's own program can connect to its unix
listener as the relay does, and hand over a TCP socket it made itself) shares the file's flags:
it can clear O_NONBLOCK with `fcntl` at any time after the receiver set it, and then not read
while the receiver writes a large answer, or take the bytes the receiver's selector announced.
A `recv` or `send` of the receiver would then wait in the kernel, and the receiver (the
proxy's one event loop, the controller's stand-in thread) with it. `MSG_DONTWAIT` makes each
call non-blocking whatever the file's flags say (the kernel checks the flag of the call).

`splice` and `sendfile` have no such flag: for a TCP socket they follow the file's O_NONBLOCK
(`tcp_splice_read`, `splice_to_socket`), so a handed socket is never spliced on an event loop
(`lnk_proxy.conn` copies a tunnel's bytes through a buffer when either end is a
`HandedSocket`; `lnk_proxy.handed_splice` splices a few in a thread each).

What a kept copy can still do, and why each is harmless to the receiver:
- read or write the connection beside the receiver, shut it down, reset it (SO_LINGER 0) or
  disconnect it (`connect(AF_UNSPEC)`) and connect it elsewhere or listen on it: it is the
  sandbox's own connection in the sandbox's own network namespace (a socket never changes
  namespace), so it reaches only what the sandbox reaches itself; the receiver sees an end of
  stream, an error or a not-connected socket and ends the exchange;
- grow SO_SNDBUF/SO_RCVBUF (to `net.core.[rw]mem_max`, never past it without CAP_NET_ADMIN):
  the socket's memory is charged to the memory cgroup of the task that made or accepted it,
  the sandbox's;
- SO_RCVLOWAT, TCP_CORK, a socket filter, kTLS (TCP_ULP) on it: its own bytes, late or
  garbled; the receiver's deadlines end a connection that never becomes readable;
- O_ASYNC with F_SETOWN: the signal goes where its sender's credentials may send one, never
  to another user's process.

Security limitations: this does NOT
- stop SO_LINGER set by the other holder from making the receiver's `close` wait (a socket's
  last close lingers whatever the file's flags): `close` turns lingering off first, which
  leaves only a race of two system calls (the other holder must set it again and close its
  own copy between them); the proxy also closes handed sockets off its event loop
  (`lnk_proxy.handed_close`), one sandbox's at a time;
- make `os.splice`, `os.sendfile` or `socket.sendfile` on its descriptor safe: never use them;
- stop a caller that takes `fileno()` and calls the kernel itself.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
from collections.abc import Iterable
from typing import Any

__all__ = ["HandedSocket"]

_DONTWAIT = socket.MSG_DONTWAIT
_NO_LINGER = struct.pack("ii", 0, 0)  # struct linger {l_onoff 0, l_linger 0}: close never waits


def _refused(what: str) -> OSError:
    return OSError(errno.EOPNOTSUPP, f"{what}: a handed socket is only read and written")


class HandedSocket(socket.socket):
    """A connected socket handed over by another process that may still hold it: byte calls
    never wait, blocking mode and timeouts are refused (ValueError), and it never binds,
    listens, accepts or connects (OSError)."""

    __slots__ = ()

    # Reads: whatever the file's O_NONBLOCK, nothing there is BlockingIOError at once.
    def recv(self, bufsize: int, flags: int = 0, /) -> bytes:
        return super().recv(bufsize, flags | _DONTWAIT)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0, /) -> int:
        return super().recv_into(buffer, nbytes, flags | _DONTWAIT)

    def recvfrom(self, bufsize: int, flags: int = 0, /) -> tuple[bytes, Any]:
        return super().recvfrom(bufsize, flags | _DONTWAIT)

    def recvfrom_into(self, buffer: Any, nbytes: int = 0, flags: int = 0, /) -> tuple[int, Any]:
        return super().recvfrom_into(buffer, nbytes, flags | _DONTWAIT)

    def recvmsg(
        self, bufsize: int, ancbufsize: int = 0, flags: int = 0, /
    ) -> tuple[bytes, list[tuple[int, int, bytes]], int, Any]:
        return super().recvmsg(bufsize, ancbufsize, flags | _DONTWAIT)

    def recvmsg_into(
        self, buffers: Iterable[Any], ancbufsize: int = 0, flags: int = 0, /
    ) -> tuple[int, list[tuple[int, int, bytes]], int, Any]:
        return super().recvmsg_into(buffers, ancbufsize, flags | _DONTWAIT)

    # Writes: a full send buffer is BlockingIOError (after what fitted) at once.
    def send(self, data: Any, flags: int = 0, /) -> int:
        return super().send(data, flags | _DONTWAIT)

    def sendall(self, data: Any, flags: int = 0, /) -> None:
        super().sendall(data, flags | _DONTWAIT)

    def sendto(self, data: Any, flags_or_address: Any, address: Any = None, /) -> int:
        raise _refused("sendto")

    def sendmsg(
        self,
        buffers: Iterable[Any],
        ancdata: Iterable[Any] = (),
        flags: int = 0,
        address: Any = None,
        /,
    ) -> int:
        if address is not None:
            raise _refused("sendmsg to an address")
        return super().sendmsg(buffers, ancdata, flags | _DONTWAIT)

    def sendfile(self, file: Any, offset: int = 0, count: int | None = None) -> int:
        raise _refused("sendfile (it follows the file's O_NONBLOCK)")

    # Never waiting: the receiver's own flag is only half of the file's story (see above).
    def setblocking(self, flag: bool) -> None:
        if flag:
            raise ValueError("a handed socket never waits: it stays non-blocking")
        super().setblocking(False)

    def settimeout(self, value: float | None) -> None:
        if value != 0:
            raise ValueError("a handed socket never waits: its timeout stays 0")
        super().settimeout(0.0)

    def bind(self, address: Any, /) -> None:
        raise _refused("bind")

    def listen(self, backlog: int = 0, /) -> None:
        raise _refused("listen")

    def accept(self) -> tuple[socket.socket, Any]:
        raise _refused("accept")

    def connect(self, address: Any, /) -> None:
        raise _refused("connect")

    def connect_ex(self, address: Any, /) -> int:
        raise _refused("connect")

    def close(self) -> None:
        """Lingering off first (see the module's limits), then closed."""
        if self.fileno() >= 0:
            with contextlib.suppress(OSError):  # reset or gone already: nothing lingers
                self.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _NO_LINGER)
        super().close()
