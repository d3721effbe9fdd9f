"""The server's timeouts, caps and listener mode: shared by its parts (`server`, `connections`,
`one_request`, `rule_exchange`, `plain_exchange`, `decide`, `watches`).

Read as `limits.NAME` where a test changes one (`HEAD_TIMEOUT_S`): the value at the call.
"""

from __future__ import annotations

__all__ = [
    "ACCEPT_PER_WAKE",
    "ACCEPT_RETRY_S",
    "FLAG_POLL_S",
    "HEAD_TIMEOUT_S",
    "IO_TIMEOUT_S",
    "LISTENER_MODE",
    "MAX_WAITING_LOOKUPS",
]

LISTENER_MODE = 0o666  # the sandbox's uid is not the proxy's; the path itself is the guard
HEAD_TIMEOUT_S = 60.0  # idle keep-alive plus one head: a slow client frees its slot by then
IO_TIMEOUT_S = 300.0  # idle bound on each read or write of a plain http exchange (long polls)
FLAG_POLL_S = 0.5  # how late a stop may close a sandbox's tunnels
# Requests of one sandbox waiting for a lookup at once (many may share one name's lookup):
# a page load asks for a few dozen; past this a sandbox is refused, never queued.
MAX_WAITING_LOOKUPS = 256
ACCEPT_RETRY_S = 0.1  # after an accept error (out of descriptors), let connections close
# Connections accepted from one listener before its next wake-up (a step of its share of the
# loop, `fair_share`): a sandbox's burst of connects waits in its own backlog, not in the loop.
ACCEPT_PER_WAKE = 8
