"""The store bridge's limits: each a named constant with the reason for its size.

An agent is untrusted: whatever it sends is bounded before it is parsed or stored, and a
refusal is whole (nothing of a refused call is written).
"""

from __future__ import annotations

import re

__all__ = [
    "AGENT_NAME",
    "CONVERSATION_ID",
    "HOLDER",
    "MAX_EVENTS_PER_APPEND",
    "MAX_EVENT_BYTES",
    "MAX_INBOX_MESSAGE_BYTES",
    "MAX_INBOX_PENDING",
    "MAX_JSON_DEPTH",
    "MAX_LEASE_TTL_S",
    "MAX_PAGE_BYTES",
    "MAX_PAGE_EVENTS",
    "MAX_STORE_BYTES_PER_AGENT",
    "MIN_LEASE_TTL_S",
    "OWNED_AGENT_ID",
    "OWNER_SENDER",
]

MAX_EVENT_BYTES = 64 * 1024  # a conversation turn or a tool result's summary; blobs go to files
MAX_EVENTS_PER_APPEND = 64  # one turn's events at once; the whole append must fit one frame
MAX_PAGE_EVENTS = 256  # one read page: 256 x 64 KiB = 16 MiB worst case, over frames of 1 MiB
MAX_PAGE_BYTES = 768 * 1024  # so a page always fits one reply frame (lnk_shared.unix: 1 MiB)
MAX_STORE_BYTES_PER_AGENT = 256 * 1024 * 1024  # one agent cannot fill the disk others share
MAX_JSON_DEPTH = 32  # real events nest a few levels; deeper is an attack on the parser
MIN_LEASE_TTL_S = 1
MAX_LEASE_TTL_S = 3600  # a holder that vanished blocks others at most an hour
MAX_INBOX_MESSAGE_BYTES = 64 * 1024  # a message in, like an event
MAX_INBOX_PENDING = 1024  # unacknowledged messages kept per agent; a flood is refused
CONVERSATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a name, never a path
HOLDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # who holds the lease (a label)
# An agent's name as its owner gives it: the controller's `lnk_controller.agents.AGENT_NAME`
# (a test keeps the two equal; the bridge does not import the controller). Never a path, never
# an id: `u1000-bob` is just a name, so another owner's id spelled here names nothing of theirs.
AGENT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
# The controller's agent ids, `u{owner_uid}-{name}` (`lnk_controller.agents.agent_id_of`): the
# owner part is digits up to the first '-', so the split is unambiguous.
OWNED_AGENT_ID = re.compile(r"u(0|[1-9][0-9]{0,9})-(" + AGENT_NAME.pattern + ")")
OWNER_SENDER = "owner"  # the `from` of `lnk agent send`: no agent may send under it
