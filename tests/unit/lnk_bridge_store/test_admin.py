"""The admin socket's commands, every field checked as hostile; a key goes through enrollment."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from lnk_bridge_store.admin import (
    CloseAgent,
    ForgetAgent,
    OpenAgent,
    Ping,
    SendMessage,
    parse_command,
)
from lnk_shared.service_identity import MIN_SANDBOX_UID, identity_refusal

OWN_UID = 998
PUBLIC = base64.b64encode(
    Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
).decode()


def open_command(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "op": "open",
        "agent": "agent-a",
        "public_key": PUBLIC,
        "host_uid": 200_001,
    }
    base.update(changes)
    return base


def test_the_commands_parse() -> None:
    command = parse_command(open_command(), OWN_UID)
    assert isinstance(command, OpenAgent) and command.key.host_uid == 200_001
    assert parse_command({"op": "close", "agent": "a"}, OWN_UID) == CloseAgent("a")
    assert parse_command({"op": "forget", "agent": "a"}, OWN_UID) == ForgetAgent("a")
    assert parse_command({"op": "ping"}, OWN_UID) == Ping()
    send = {"op": "send", "agent": "a", "sender": "owner", "message": "hi"}
    assert parse_command(send, OWN_UID) == SendMessage("a", "owner", "hi")


@pytest.mark.parametrize(
    "changes",
    [
        {"op": "drop"},
        {"agent": "../x"},
        {"agent": "A"},
        {"host_uid": 0},  # never root
        {"host_uid": OWN_UID},  # never the bridge itself
        {"host_uid": -1},
        {"host_uid": 2**32 - 1},
        {"host_uid": True},
        {"public_key": base64.b64encode(bytes([1]) + bytes(31)).decode()},  # small order
        {"public_key": base64.b64encode(b"\xed" + b"\xff" * 30 + b"\x7f").decode()},
        {"public_key": "not base64"},
        {"public_key": None},
        {"socket": "/tmp/elsewhere.sock"},  # the bridge names the socket, never the caller
    ],
)
def test_a_bad_open_is_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        parse_command(open_command(**changes), OWN_UID)


def test_a_bad_send_is_refused() -> None:
    for bad in ({"sender": "a b"}, {"message": 5}, {"extra": 1}):
        with pytest.raises(ValueError):
            parse_command({"op": "send", "agent": "a", "sender": "o", "message": "m", **bad}, 1)


@pytest.mark.parametrize("uid", [0, MIN_SANDBOX_UID, 2**31 - 1])
def test_root_and_sandbox_uids_may_not_run_the_bridge(uid: int) -> None:
    assert identity_refusal("lnk_bridge_store", uid) is not None


def test_a_system_user_may_run_the_bridge() -> None:
    assert identity_refusal("lnk_bridge_store", 998) is None
