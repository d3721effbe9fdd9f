"""A verified call's body is still hostile: every malformed, oversized, deep or non-Unicode
body is refused with a message, and the honest ones become typed requests."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lnk_bridge_store.calls import (
    Acquire,
    Append,
    CallRefused,
    InboxAck,
    InboxRead,
    InboxSend,
    Read,
    Release,
    Renew,
    parse_request,
    recipient_of,
    sender_name,
)
from lnk_bridge_store.limits import (
    MAX_EVENT_BYTES,
    MAX_EVENTS_PER_APPEND,
    MAX_INBOX_MESSAGE_BYTES,
    MAX_JSON_DEPTH,
    MAX_LEASE_TTL_S,
    MAX_PAGE_EVENTS,
)


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def append(**changes: Any) -> bytes:
    fields: dict[str, Any] = {
        "conversation": "c1",
        "expected_seq": 0,
        "token": 1,
        "events": [{"role": "user", "text": "hi"}],
    }
    fields.update(changes)
    return body(**fields)


def refused(action: str, raw: bytes) -> str:
    with pytest.raises(CallRefused) as info:
        parse_request(action, raw)
    return str(info.value)


def test_each_action_parses_to_its_request() -> None:
    assert parse_request("append", append()) == Append("c1", 0, 1, ('{"role":"user","text":"hi"}',))
    assert parse_request("read", body(conversation="c1", from_seq=1, limit=10)) == Read("c1", 1, 10)
    assert parse_request("lease.acquire", body(holder="h-1", ttl_s=5)) == Acquire("h-1", 5)
    assert parse_request("lease.renew", body(token=3, ttl_s=5)) == Renew(3, 5)
    assert parse_request("lease.release", body(token=3)) == Release(3)
    assert parse_request("inbox.read", body(after_id=0, limit=5)) == InboxRead(0, 5)
    assert parse_request("inbox.ack", body(through_id=4)) == InboxAck(4)
    assert parse_request("inbox.send", body(to="bob", message="hi")) == InboxSend("bob", "hi")


def test_an_unknown_action_is_refused() -> None:
    assert "unknown action" in refused("drop-table", append())


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"\xff\xfe{}", "UTF-8"),
        (b'{"a": "\xed\xa0\x80"}', "UTF-8"),  # an encoded surrogate is not UTF-8
        (b"[1, 2]", "object"),
        (b"not json", "JSON"),
        (b'{"conversation": "a", "conversation": "b"}', "duplicate"),
        (b'{"x": NaN}', "JSON"),
        (b'{"x": Infinity}', "JSON"),
        (b'{"x": "\\ud800"}', "surrogate"),  # escaped lone surrogate: valid JSON, not Unicode
        (b'{"\\udfff": 1}', "surrogate"),
    ],
)
def test_a_body_that_is_not_sane_json_is_refused(raw: bytes, why: str) -> None:
    assert why in refused("append", raw)


def test_deep_json_is_refused_at_any_depth_without_crashing() -> None:
    for depth in (MAX_JSON_DEPTH + 1, 900, 100_000):
        nested = "[" * depth + "]" * depth
        raw = b'{"conversation":"c1","expected_seq":0,"token":1,"events":' + nested.encode() + b"}"
        assert "deeper" in refused("append", raw)


def test_json_at_the_depth_limit_is_taken() -> None:
    event: Any = "leaf"
    for _ in range(MAX_JSON_DEPTH - 2):  # the body object and the events list are two levels
        event = [event]
    assert isinstance(parse_request("append", append(events=[event])), Append)


@pytest.mark.parametrize(
    "changes",
    [
        {"conversation": "../etc"},
        {"conversation": ""},
        {"conversation": "x" * 129},
        {"conversation": 5},
        {"expected_seq": -1},
        {"expected_seq": True},
        {"expected_seq": 1.0},
        {"token": 0},
        {"token": "1"},
        {"events": []},
        {"events": {"a": 1}},
        {"events": [1] * (MAX_EVENTS_PER_APPEND + 1)},
        {"events": ["x" * MAX_EVENT_BYTES]},
        {"agent": "agent-b"},  # the agent is the proof's, never the body's
    ],
)
def test_an_append_with_a_bad_field_is_refused(changes: dict[str, Any]) -> None:
    refused("append", append(**changes))


def test_an_event_at_the_size_limit_is_taken() -> None:
    event = "x" * (MAX_EVENT_BYTES - 2)  # its JSON text adds the two quotes
    assert isinstance(parse_request("append", append(events=[event])), Append)


@pytest.mark.parametrize(
    ("action", "fields"),
    [
        ("read", {"conversation": "c1", "from_seq": 0, "limit": 1}),
        ("read", {"conversation": "c1", "from_seq": 1, "limit": MAX_PAGE_EVENTS + 1}),
        ("read", {"conversation": "c1", "from_seq": 1}),
        ("lease.acquire", {"holder": "a b", "ttl_s": 5}),
        ("lease.acquire", {"holder": "h", "ttl_s": MAX_LEASE_TTL_S + 1}),
        ("lease.acquire", {"holder": "h", "ttl_s": 0}),
        ("lease.renew", {"token": 1}),
        ("lease.release", {"token": 1, "holder": "h"}),
        ("inbox.ack", {"through_id": 0}),
    ],
)
def test_other_actions_with_a_bad_field_are_refused(action: str, fields: dict[str, Any]) -> None:
    refused(action, body(**fields))


# --- inbox.send: agent to agent, same owner only ---


@pytest.mark.parametrize(
    "fields",
    [
        {"to": "bob"},  # no message
        {"message": "hi"},  # no recipient
        {"to": "bob", "message": "hi", "agent": "u1001-bob"},  # unknown field
        {"to": "bob", "message": "hi", "owner": 1001},  # the owner is never the body's
        {"to": "../bob", "message": "hi"},
        {"to": "bob/../../x", "message": "hi"},
        {"to": "Bob", "message": "hi"},  # agent names are lowercase
        {"to": "-bob", "message": "hi"},
        {"to": "", "message": "hi"},
        {"to": "b" * 41, "message": "hi"},
        {"to": "u1001-bob\n", "message": "hi"},
        {"to": 1001, "message": "hi"},
        {"to": ["bob"], "message": "hi"},
        {"to": "bob", "message": 5},
        {"to": "bob", "message": {"text": "hi"}},
        {"to": "bob", "message": "x" * (MAX_INBOX_MESSAGE_BYTES + 1)},
        {"to": "bob", "message": "\u00e9" * (MAX_INBOX_MESSAGE_BYTES // 2 + 1)},  # bytes count
    ],
)
def test_an_inbox_send_with_a_bad_field_is_refused(fields: dict[str, Any]) -> None:
    refused("inbox.send", body(**fields))


def test_a_message_at_the_size_limit_is_taken() -> None:
    message = "x" * MAX_INBOX_MESSAGE_BYTES
    assert parse_request("inbox.send", body(to="bob", message=message)) == InboxSend("bob", message)


def test_the_recipient_is_always_an_agent_of_the_senders_own_owner() -> None:
    assert recipient_of("u1000-alice", "bob") == "u1000-bob"
    assert recipient_of("u1000-alice", "alice") == "u1000-alice"  # itself: allowed
    # Another owner's id spelled as the name is just a name: still under the sender's owner.
    assert recipient_of("u1000-alice", "u1001-bob") == "u1000-u1001-bob"
    assert recipient_of("u1000-u1001-x", "bob") == "u1000-bob"  # the owner is the first part
    assert recipient_of("u0-alice", "bob") == "u0-bob"
    assert sender_name("u1000-alice") == "alice"
    assert sender_name("u1000-u1001-x") == "u1001-x"


@pytest.mark.parametrize("name", ["../u1001-bob", "u1001/bob", "BOB", "", "a" * 41])
def test_recipient_of_refuses_what_is_not_a_name(name: str) -> None:
    with pytest.raises(CallRefused, match="agent's name"):
        recipient_of("u1000-alice", name)


@pytest.mark.parametrize("sender", ["agent-a", "alice", "u-alice", "u01000-alice", "1000-alice"])
def test_a_sender_whose_id_names_no_owner_cannot_send(sender: str) -> None:
    with pytest.raises(CallRefused, match="names no owner"):
        recipient_of(sender, "bob")
    with pytest.raises(CallRefused, match="names no owner"):
        sender_name(sender)


def test_the_agent_name_pattern_is_the_controllers() -> None:
    from lnk_bridge_store.limits import AGENT_NAME
    from lnk_controller.agents import AGENT_NAME as CONTROLLERS
    from lnk_controller.agents import agent_id_of

    assert AGENT_NAME.pattern == CONTROLLERS.pattern
    assert sender_name(agent_id_of(4_294_967_294, "b" * 40)) == "b" * 40
