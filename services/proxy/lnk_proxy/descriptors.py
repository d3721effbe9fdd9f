"""The proxy's descriptors, shared out so no sandbox takes another's: a global cap with a share
reserved per sandbox. Pure: the caller passes the counts and the limit.

Each connection a sandbox opens to the proxy costs the proxy up to `PER_CONNECTION` descriptors
(the connection and the one origin connection it may hold). Of `limit` (the process's
descriptor limit less `HEADROOM` for the proxy's own: admin, logs, netlink, pooled pipes and
buffers), every open sandbox is guaranteed `reserve` connections, at most `limit` split evenly;
past its reserve a sandbox takes only from what no other sandbox's reserve still holds.

Does NOT: count descriptors exactly (pooled idle origin connections and pipes in flight are
within `HEADROOM` or the per-connection charge, not measured), nor take descriptors back from
a sandbox that holds them: it only refuses new connections (`too-many-descriptors`).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["HEADROOM", "PER_CONNECTION", "RESERVE", "may_accept", "usable_limit"]

PER_CONNECTION = 2  # the sandbox's connection and the origin connection it may hold
RESERVE = 64  # connections every sandbox may always open: a browser's page load and more
# The proxy's own descriptors: admin connections, wire logs, netlink sockets, the pipe pool
# (8 kept, a few dozen lent), the resolver's threads' sockets: far above what they take.
HEADROOM = 512


def usable_limit(soft_limit: int) -> int:
    """Connections' descriptors the proxy may hand out under RLIMIT_NOFILE's soft limit."""
    return max(0, soft_limit - HEADROOM)


def may_accept(own: int, others: Sequence[int], limit: int, reserve: int = RESERVE) -> bool:
    """Whether a sandbox with `own` open connections may open one more, while the other open
    sandboxes hold `others` connections and `limit` descriptors are for connections in all."""
    sandboxes = len(others) + 1
    share = min(reserve, limit // (PER_CONNECTION * sandboxes))  # guaranteed to each
    if own < share:
        return True
    held_by_others = sum(max(n, share) for n in others)  # used, or kept for their reserve
    return (own + 1 + held_by_others) * PER_CONNECTION <= limit
