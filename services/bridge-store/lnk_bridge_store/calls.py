"""An agent's call, from its verified body bytes to a checked request: pure functions, no I/O.

The body has been signed by the agent, which proves who sent it, not that it is sane: it is
still hostile input. It must be UTF-8 JSON, one object with exactly the action's fields, no
duplicate keys, no NaN or Infinity, nested at most `MAX_JSON_DEPTH`, every string valid
Unicode (no lone surrogates: they could not be stored as UTF-8), each event at most
`MAX_EVENT_BYTES` once serialized. Any failure is `CallRefused`, with a message for the agent.

`inbox.send` names its recipient by an agent NAME only: `recipient_of` makes the id from the
SENDER'S verified id (its owner part) and that name, so an agent reaches only agents of its own
owner, whatever it writes in `to`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lnk_bridge_store.limits import (
    AGENT_NAME,
    CONVERSATION_ID,
    HOLDER,
    MAX_EVENT_BYTES,
    MAX_EVENTS_PER_APPEND,
    MAX_INBOX_MESSAGE_BYTES,
    MAX_JSON_DEPTH,
    MAX_LEASE_TTL_S,
    MAX_PAGE_EVENTS,
    MIN_LEASE_TTL_S,
    OWNED_AGENT_ID,
)
from lnk_shared.errors import LnkError
from lnk_shared.frames import no_duplicate_keys

__all__ = [
    "ACTIONS",
    "AUDIENCE_OF",
    "Acquire",
    "Append",
    "CallRefused",
    "InboxAck",
    "InboxRead",
    "InboxSend",
    "Read",
    "Release",
    "Renew",
    "Request",
    "canonical_json",
    "parse_request",
    "recipient_of",
    "sender_name",
]

MAX_SEQ = 2**62  # far past any conversation; keeps every sum inside SQLite's 64-bit integers


class CallRefused(LnkError):
    """A signed call whose content the bridge will not take; the message says why."""


@dataclass(frozen=True)
class Append:
    conversation: str
    expected_seq: int  # the last seq the writer saw: 0 for a new conversation
    token: int  # the writer's fencing token
    events: tuple[str, ...]  # each a canonical JSON text, checked for size


@dataclass(frozen=True)
class Read:
    conversation: str
    from_seq: int
    limit: int


@dataclass(frozen=True)
class Acquire:
    holder: str
    ttl_s: int


@dataclass(frozen=True)
class Renew:
    token: int
    ttl_s: int


@dataclass(frozen=True)
class Release:
    token: int


@dataclass(frozen=True)
class InboxRead:
    after_id: int
    limit: int


@dataclass(frozen=True)
class InboxAck:
    through_id: int


@dataclass(frozen=True)
class InboxSend:
    to: str  # an agent's name, never an id: `recipient_of` adds the sender's own owner
    message: str


Request = Append | Read | Acquire | Renew | Release | InboxRead | InboxAck | InboxSend

ACTIONS: dict[str, frozenset[str]] = {
    "append": frozenset({"conversation", "expected_seq", "token", "events"}),
    "read": frozenset({"conversation", "from_seq", "limit"}),
    "lease.acquire": frozenset({"holder", "ttl_s"}),
    "lease.renew": frozenset({"token", "ttl_s"}),
    "lease.release": frozenset({"token"}),
    "inbox.read": frozenset({"after_id", "limit"}),
    "inbox.ack": frozenset({"through_id"}),
    "inbox.send": frozenset({"to", "message"}),
}
AUDIENCE_OF = {action: "inbox" if action.startswith("inbox.") else "store" for action in ACTIONS}


def parse_request(action: str, body: bytes) -> Request:
    """The checked request of a verified call; `CallRefused` saying what is wrong."""
    if action not in ACTIONS:
        raise CallRefused(f"unknown action {action!r}; the store knows {sorted(ACTIONS)}")
    args = _load_object(body)
    keys = set(args)
    if keys != ACTIONS[action]:
        missing, extra = sorted(ACTIONS[action] - keys), sorted(keys - ACTIONS[action])
        raise CallRefused(f"{action}: missing fields {missing}, unknown fields {extra}")
    if action == "append":
        return Append(
            conversation=_name(args, "conversation"),
            expected_seq=_int(args, "expected_seq", 0, MAX_SEQ),
            token=_int(args, "token", 1, MAX_SEQ),
            events=_events(args["events"]),
        )
    if action == "read":
        return Read(
            conversation=_name(args, "conversation"),
            from_seq=_int(args, "from_seq", 1, MAX_SEQ),
            limit=_int(args, "limit", 1, MAX_PAGE_EVENTS),
        )
    if action == "lease.acquire":
        holder = args["holder"]
        if not isinstance(holder, str) or not HOLDER.fullmatch(holder):
            raise CallRefused(f"holder must match {HOLDER.pattern}")
        return Acquire(holder, _int(args, "ttl_s", MIN_LEASE_TTL_S, MAX_LEASE_TTL_S))
    if action == "lease.renew":
        return Renew(
            _int(args, "token", 1, MAX_SEQ), _int(args, "ttl_s", MIN_LEASE_TTL_S, MAX_LEASE_TTL_S)
        )
    if action == "lease.release":
        return Release(_int(args, "token", 1, MAX_SEQ))
    if action == "inbox.read":
        return InboxRead(_int(args, "after_id", 0, MAX_SEQ), _int(args, "limit", 1, 256))
    if action == "inbox.ack":
        return InboxAck(_int(args, "through_id", 1, MAX_SEQ))
    return _inbox_send(args)


def sender_name(agent_id: str) -> str:
    """The name part of a sender's verified agent id: the `from` of what it sends."""
    return _owned(agent_id)[1]


def recipient_of(agent_id: str, name: str) -> str:
    """The agent id `name` means when `agent_id` sends: an agent of the sender's own owner,
    always (the owner part comes from the verified id, never from the body)."""
    owner, _ = _owned(agent_id)
    if not AGENT_NAME.fullmatch(name):
        raise CallRefused(f"to must be an agent's name matching {AGENT_NAME.pattern}")
    return f"u{owner}-{name}"


def _owned(agent_id: str) -> tuple[str, str]:
    match = OWNED_AGENT_ID.fullmatch(agent_id)
    if match is None:
        raise CallRefused("this agent's id names no owner (not u<uid>-<name>): it cannot send")
    return match[1], match[2]


def canonical_json(value: Any) -> str:
    """One text per value: what is stored and what its size is counted on."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _load_object(body: bytes) -> dict[str, Any]:
    try:
        text = body.decode("utf-8")
        value = json.loads(text, object_pairs_hook=no_duplicate_keys, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise CallRefused("the body is not valid UTF-8") from None
    except RecursionError:
        raise CallRefused(f"the body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise CallRefused(f"the body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CallRefused("the body must be a JSON object")
    _check_value(value, 0)
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_value(value: Any, depth: int) -> None:
    """Depth and Unicode: iterative, so the check cannot itself overflow the stack."""
    stack = [(value, depth)]
    while stack:
        item, level = stack.pop()
        if level > MAX_JSON_DEPTH:
            raise CallRefused(f"the body nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict):
            for key, child in item.items():
                _check_text(key)
                stack.append((child, level + 1))
        elif isinstance(item, list):
            stack.extend((child, level + 1) for child in item)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise CallRefused("a string holds a lone surrogate (not Unicode text)") from None


def _name(args: dict[str, Any], key: str) -> str:
    value = args[key]
    if not isinstance(value, str) or not CONVERSATION_ID.fullmatch(value):
        raise CallRefused(f"{key} must match {CONVERSATION_ID.pattern}")
    return value


def _int(args: dict[str, Any], key: str, low: int, high: int) -> int:
    value = args[key]
    if type(value) is not int or not low <= value <= high:
        raise CallRefused(f"{key} must be a whole number from {low} to {high}")
    return value


def _inbox_send(args: dict[str, Any]) -> InboxSend:
    to, message = args["to"], args["message"]
    if not isinstance(to, str) or not AGENT_NAME.fullmatch(to):
        raise CallRefused(
            f"to must be an agent's name matching {AGENT_NAME.pattern} (a name, not an id)"
        )
    if not isinstance(message, str):
        raise CallRefused("message must be text")
    size = len(message.encode("utf-8"))
    if size > MAX_INBOX_MESSAGE_BYTES:
        raise CallRefused(f"a message is at most {MAX_INBOX_MESSAGE_BYTES} bytes, not {size}")
    return InboxSend(to, message)


def _events(untrusted: Any) -> tuple[str, ...]:
    if not isinstance(untrusted, list) or not 1 <= len(untrusted) <= MAX_EVENTS_PER_APPEND:
        raise CallRefused(f"events must be a list of 1 to {MAX_EVENTS_PER_APPEND} JSON values")
    out = []
    for index, event in enumerate(untrusted):
        text = canonical_json(event)
        size = len(text.encode("utf-8"))
        if size > MAX_EVENT_BYTES:
            raise CallRefused(
                f"event {index} is {size} bytes, over the limit of {MAX_EVENT_BYTES}; "
                "keep large data in files and store a reference"
            )
        out.append(text)
    return tuple(out)
