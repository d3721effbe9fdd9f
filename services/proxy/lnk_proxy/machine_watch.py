"""Told by the kernel when this machine's links, addresses or routes change: a route netlink
socket joined to the change groups (`netlink.CHANGE_GROUPS`), read without blocking.

The server watches its descriptor in the event loop and reads the machine view again when
`drain` says something changed, instead of on a timer: a bridge or address added after a
listener opened is in the view as soon as the loop runs (the route check, `route_check`,
asks the kernel at dial time anyway).

Does NOT: say what changed (the caller reads the whole view again, a few milliseconds), nor
see other network namespaces. When the kernel drops messages because the socket's queue was
full (ENOBUFS), `drain` says "changed": a lost message is taken as a change, never as none.
"""

from __future__ import annotations

import errno
import socket

from lnk_proxy import netlink
from lnk_shared.errors import StateError

__all__ = ["MachineWatch"]

RECEIVE_SIZE = 64 * 1024  # one datagram: a few change messages of a few hundred bytes each
# Kernel queue for change messages: a burst (docker creating a network: tens of messages)
# fits many times over; an overflow costs only one extra read of the view.
WATCH_BUFFER = 1024 * 1024
MAX_DRAIN = 1024  # datagrams read per wakeup; past that the rest wait for the next one


class MachineWatch:
    def __init__(self) -> None:
        try:
            self._sock = socket.socket(
                socket.AF_NETLINK,
                socket.SOCK_RAW | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK,
                socket.NETLINK_ROUTE,
            )
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, WATCH_BUFFER)
                self._sock.bind((0, netlink.CHANGE_GROUPS))
            except BaseException:
                self._sock.close()
                raise
        except OSError as exc:
            raise StateError(
                f"cannot watch this machine's addresses and routes over netlink ({exc}): the "
                "proxy refuses to run on a view it cannot keep fresh"
            ) from None

    def fileno(self) -> int:
        return self._sock.fileno()

    def drain(self) -> bool:
        """Read every queued message; whether any was a change (or some were lost)."""
        changed = False
        for _ in range(MAX_DRAIN):
            try:
                data = self._sock.recv(RECEIVE_SIZE)
            except (BlockingIOError, InterruptedError):
                return changed
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    changed = True  # the kernel dropped messages: something changed
                    continue
                raise
            changed = changed or netlink.is_change_message(data)
        return True  # more are queued: a burst of changes

    def close(self) -> None:
        self._sock.close()
