"""Agent proofs: every hostile case of the issue refused with the one uniform answer, the
honest call accepted, and a small-order key refused at enrollment (shown to forge otherwise)."""

from __future__ import annotations

import base64
import hashlib
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import given
from hypothesis import strategies as st

from lnk_shared.proofs import (
    MAGIC,
    MAX_LIFETIME_BOUND_S,
    MAX_SKEW_BOUND_S,
    REFUSAL,
    AgentKey,
    AgentKeyRefused,
    CallContext,
    ProofPolicy,
    ProofRefused,
    enroll_public_key,
    parse_proof,
    sign_call,
    signed_bytes,
    verify_call,
)

NOW = 1_800_000_000
UID_A, UID_B = 200_001, 200_002
_L = 2**252 + 27742317777372353535851937790883648493
IDENTITY = bytes([1]) + bytes(31)  # the neutral point: order 1
# Every point of small order, canonically encoded (order 4, 1, 8, 8, 2): libsodium's list.
SMALL_ORDER = [
    bytes(32),
    IDENTITY,
    bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05"),
    bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"),
    bytes.fromhex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),
]
NON_CANONICAL = [
    bytes.fromhex("edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),  # y = p
    bytes.fromhex("eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),  # y = p+1
    bytes([1]) + bytes(30) + bytes([0x80]),  # the identity with x's sign set: x = 0 has none
]


class MemoryLedger:
    def __init__(self) -> None:
        self.seen: set[tuple[str, bytes]] = set()

    def record(self, agent: str, nonce: bytes, expires: int) -> bool:
        if (agent, nonce) in self.seen:
            return False
        self.seen.add((agent, nonce))
        return True


class SqliteLedger:
    """A UNIQUE insert in a real SQLite file: what a bridge does, each thread its connection."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with sqlite3.connect(path) as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS nonces (agent TEXT, nonce BLOB, expires INTEGER, "
                "UNIQUE (agent, nonce))"
            )

    def record(self, agent: str, nonce: bytes, expires: int) -> bool:
        db = sqlite3.connect(self.path, timeout=30)
        try:
            with db:
                db.execute("INSERT INTO nonces VALUES (?, ?, ?)", (agent, nonce, expires))
        except sqlite3.IntegrityError:
            return False
        finally:
            db.close()
        return True


def raw_public(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


KEY_A = Ed25519PrivateKey.generate()
KEY_B = Ed25519PrivateKey.generate()
AGENTS = {
    "agent-a": AgentKey("agent-a", enroll_public_key(raw_public(KEY_A)), UID_A),
    "agent-b": AgentKey("agent-b", enroll_public_key(raw_public(KEY_B)), UID_B),
}
POLICY = ProofPolicy(audience="store")


def call(
    key: Ed25519PrivateKey = KEY_A, *, agent: str = "agent-a", **changes: Any
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "audience": "store",
        "action": "append",
        "body": b'{"conversation":"c1","events":[]}',
        "now": NOW,
    }
    fields.update(changes)
    return sign_call(key, agent=agent, **fields)


def verify(
    untrusted: dict[str, Any],
    *,
    socket_agent: str = "agent-a",
    peer_uid: int = UID_A,
    now: float = NOW,
    ledger: Any = None,
    policy: ProofPolicy = POLICY,
    agents: dict[str, AgentKey] = AGENTS,
) -> Any:
    return verify_call(
        untrusted,
        policy=policy,
        context=CallContext(socket_agent=socket_agent, peer_uid=peer_uid, now=now),
        key_for=agents.get,
        nonces=MemoryLedger() if ledger is None else ledger,
    )


def refused(untrusted: dict[str, Any], **kwargs: Any) -> str:
    with pytest.raises(ProofRefused) as info:
        verify(untrusted, **kwargs)
    assert str(info.value) == REFUSAL  # one answer outward, whatever the reason
    return info.value.reason


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# --- the granted path ---


def test_an_honest_call_is_accepted_with_its_exact_body() -> None:
    verified = verify(call())
    assert (verified.agent, verified.action) == ("agent-a", "append")
    assert verified.body == b'{"conversation":"c1","events":[]}'


def test_each_agent_is_accepted_on_its_own_socket_with_its_own_key() -> None:
    assert verify(call(KEY_B, agent="agent-b"), socket_agent="agent-b", peer_uid=UID_B)


# --- replay ---


def test_replay_with_the_same_ledger_is_refused() -> None:
    ledger, proof = MemoryLedger(), call()
    verify(proof, ledger=ledger)
    assert "used before" in refused(proof, ledger=ledger)


def test_replay_after_a_restart_is_refused(tmp_path: Path) -> None:
    proof = call()
    verify(proof, ledger=SqliteLedger(tmp_path / "n.db"))
    assert "used before" in refused(proof, ledger=SqliteLedger(tmp_path / "n.db"))


def test_two_identical_proofs_at_once_exactly_one_is_accepted(tmp_path: Path) -> None:
    ledger, proof = SqliteLedger(tmp_path / "n.db"), call()
    start, outcomes = threading.Barrier(8), []

    def attempt() -> None:
        start.wait()
        try:
            verify(proof, ledger=ledger)
            outcomes.append("accepted")
        except ProofRefused:
            outcomes.append("refused")

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["accepted"] + ["refused"] * 7


def test_a_refused_proof_does_not_use_up_its_nonce() -> None:
    ledger, nonce = MemoryLedger(), os.urandom(16)
    stale = call(nonce=nonce)
    stale["created"] -= 1  # the signature no longer matches
    refused(stale, ledger=ledger)
    verify(call(nonce=nonce), ledger=ledger)


# --- the window ---


@pytest.mark.parametrize(
    ("now", "why"),
    [
        (NOW + 31, "from"),  # stale: made over 30 s ago
        (NOW - 31, "from"),  # from the future
    ],
)
def test_a_proof_outside_the_skew_is_refused(now: int, why: str) -> None:
    assert why in refused(call(), now=now)


def test_a_proof_within_the_skew_is_accepted() -> None:
    verify(call(), now=NOW + 30)
    verify(call(), now=NOW - 30)


def test_an_over_long_lifetime_is_refused() -> None:
    assert "lifetime" in refused(call(lifetime_s=61))


@pytest.mark.parametrize("lifetime", [0, -5])
def test_a_proof_that_expires_before_it_is_made_is_refused(lifetime: int) -> None:
    assert "lifetime" in refused(call(lifetime_s=lifetime))


def test_an_expired_proof_is_refused_inside_the_skew() -> None:
    assert "expired" in refused(call(lifetime_s=10), now=NOW + 11)


def test_a_wider_window_within_the_bounds_is_configurable() -> None:
    wide = ProofPolicy(audience="store", max_skew_s=120, max_lifetime_s=300)
    verify(call(lifetime_s=300), now=NOW + 100, policy=wide)


@pytest.mark.parametrize(
    "changes",
    [
        {"max_skew_s": 0},
        {"max_skew_s": MAX_SKEW_BOUND_S + 1},
        {"max_lifetime_s": 0},
        {"max_lifetime_s": MAX_LIFETIME_BOUND_S + 1},
        {"audience": "Store!"},
    ],
)
def test_a_window_past_its_bounds_cannot_be_configured(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ProofPolicy(**{"audience": "store", **changes})


# --- who and where ---


def test_agent_id_swapped_is_refused() -> None:
    proof = call()
    proof["agent"] = "agent-b"  # A's proof claiming to be B, on B's socket from B's uid
    assert "signature" in refused(proof, socket_agent="agent-b", peer_uid=UID_B)


def test_a_valid_proof_sent_from_another_agents_uid_is_refused() -> None:
    assert "peer uid" in refused(call(), peer_uid=UID_B)


def test_a_valid_proof_on_another_agents_socket_is_refused() -> None:
    assert "socket" in refused(call(), socket_agent="agent-b", peer_uid=UID_A)


def test_an_agent_that_is_not_running_is_refused() -> None:
    stopped = {"agent-a": AgentKey("agent-a", AGENTS["agent-a"].public_key, None)}
    assert "host uid" in refused(call(), agents=stopped)


def test_an_unknown_agent_is_refused() -> None:
    assert "not known" in refused(call(), agents={})


def test_a_proof_signed_with_another_agents_key_is_refused() -> None:
    assert "signature" in refused(call(KEY_B))


# --- what was signed ---


def test_action_changed_is_refused() -> None:
    proof = call()
    proof["action"] = "lease.acquire"
    assert "signature" in refused(proof)


def test_audience_changed_is_refused() -> None:
    proof = call(audience="inbox")
    assert "audience" in refused(proof)
    proof["audience"] = "store"
    assert "signature" in refused(proof)


def test_body_changed_by_one_byte_is_refused() -> None:
    proof = call()
    body = bytearray(base64.b64decode(proof["body"]))
    body[-2] ^= 1
    proof["body"] = b64(bytes(body))
    assert "signature" in refused(proof)


def test_body_reserialized_is_refused() -> None:
    proof = call()
    proof["body"] = b64(b'{"conversation": "c1", "events": []}')  # the same JSON, spaced
    assert "signature" in refused(proof)


def test_created_or_expires_changed_is_refused() -> None:
    for key in ("created", "expires"):
        proof = call(lifetime_s=30)
        proof[key] += 1
        assert "signature" in refused(proof)


def test_naive_concatenation_would_collide_but_signed_bytes_do_not() -> None:
    common: dict[str, Any] = {
        "body_sha256": bytes(32),
        "created": 1,
        "expires": 2,
        "nonce": bytes(16),
    }
    one = signed_bytes(agent="ab", audience="c", action="d", **common)
    other = signed_bytes(agent="a", audience="bc", action="d", **common)
    assert one != other
    assert one.startswith(MAGIC)


_names = st.text(alphabet="abc-", min_size=1, max_size=6)


@given(a=st.tuples(_names, _names, _names), b=st.tuples(_names, _names, _names))
def test_field_boundary_shifts_never_give_the_same_signed_bytes(
    a: tuple[str, str, str], b: tuple[str, str, str]
) -> None:
    common: dict[str, Any] = {
        "body_sha256": bytes(32),
        "created": 1,
        "expires": 2,
        "nonce": bytes(16),
    }
    one = signed_bytes(agent=a[0], audience=a[1], action=a[2], **common)
    other = signed_bytes(agent=b[0], audience=b[1], action=b[2], **common)
    assert (one == other) == (a == b)


# --- the signature itself ---


def test_a_malleated_signature_s_plus_l_is_refused() -> None:
    proof = call()
    sig = base64.b64decode(proof["signature"])
    s = int.from_bytes(sig[32:], "little") + _L
    proof["signature"] = b64(sig[:32] + s.to_bytes(32, "little"))
    assert "signature" in refused(proof)


def test_a_flipped_signature_bit_is_refused() -> None:
    proof = call()
    sig = bytearray(base64.b64decode(proof["signature"]))
    sig[5] ^= 0x10
    proof["signature"] = b64(bytes(sig))
    assert "signature" in refused(proof)


def test_a_truncated_signature_is_refused() -> None:
    proof = call()
    proof["signature"] = b64(base64.b64decode(proof["signature"])[:63])
    assert "signature" in refused(proof)


# --- the fields' shape ---


@pytest.mark.parametrize(
    "extra", [{"alg": "none"}, {"alg": "HS256"}, {"kid": "agent-b"}, {"key": "AAAA"}]
)
def test_claims_of_another_algorithm_or_key_are_refused(extra: dict[str, str]) -> None:
    assert "unknown" in refused({**call(), **extra})


@pytest.mark.parametrize("missing", ["v", "nonce", "signature", "body", "agent"])
def test_a_missing_field_is_refused(missing: str) -> None:
    proof = call()
    del proof[missing]
    assert "missing" in refused(proof)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("v", 2),
        ("v", True),
        ("created", True),
        ("created", 1.8e9),
        ("created", "1800000000"),
        ("created", -1),
        ("agent", "Agent-A"),
        ("agent", "a/../b"),
        ("agent", ""),
        ("action", "x" * 65),
        ("nonce", b64(bytes(15))),
        ("nonce", b64(bytes(17))),
        ("nonce", "AAAAAAAAAAAAAAAAAAAAAB=="),  # non-canonical: the trailing bits are set
        ("body", "not base64!"),
        ("body", " " + b64(b"{}")),
        ("body", "é"),
        ("signature", None),
    ],
)
def test_a_field_of_the_wrong_shape_is_refused(key: str, value: object) -> None:
    refused({**call(), key: value})


def test_an_oversized_body_is_refused_before_decoding() -> None:
    refused({**call(), "body": "A" * (400 * 1024)})


def test_parse_proof_returns_the_decoded_fields() -> None:
    proof = parse_proof(call(nonce=bytes(range(16))))
    assert proof.nonce == bytes(range(16)) and len(proof.signature) == 64
    assert proof.expires - proof.created == 60


# --- enrollment ---


def test_without_the_check_a_forged_signature_verifies_for_every_message() -> None:
    """The attack the enrollment check stops: OpenSSL accepts the identity as a key, and the
    signature (R = identity, S = 0) then verifies whatever was signed."""
    forged = IDENTITY + bytes(32)
    unchecked = Ed25519PublicKey.from_public_bytes(IDENTITY)
    for _ in range(20):
        unchecked.verify(forged, os.urandom(40))  # raises InvalidSignature if refused
    message = signed_bytes(
        agent="agent-a",
        audience="store",
        action="append",
        body_sha256=hashlib.sha256(b"anything").digest(),
        created=NOW,
        expires=NOW + 60,
        nonce=bytes(16),
    )
    unchecked.verify(forged, message)
    with pytest.raises(AgentKeyRefused, match="small order"):
        enroll_public_key(IDENTITY)


@pytest.mark.parametrize("raw", SMALL_ORDER, ids=lambda r: r.hex()[:8])
def test_a_small_order_key_is_refused_at_enrollment(raw: bytes) -> None:
    with pytest.raises(AgentKeyRefused, match="small order"):
        enroll_public_key(raw)


@pytest.mark.parametrize("raw", NON_CANONICAL, ids=lambda r: r.hex()[:8])
def test_a_non_canonical_key_is_refused_at_enrollment(raw: bytes) -> None:
    with pytest.raises(AgentKeyRefused, match="canonical"):
        enroll_public_key(raw)


def test_a_mixed_order_key_is_refused_at_enrollment() -> None:
    # A real key plus a point of order 2 (y = -1): valid on the curve, outside the prime group.
    from lnk_shared import proofs

    real = proofs._decode_point(raw_public(KEY_A))
    mixed = proofs._add(real, proofs._decode_point(SMALL_ORDER[4]))
    x, y, z, _ = mixed
    zi = pow(z, proofs._P - 2, proofs._P)
    x, y = x * zi % proofs._P, y * zi % proofs._P
    encoded = (y | ((x & 1) << 255)).to_bytes(32, "little")
    with pytest.raises(AgentKeyRefused, match="prime-order"):
        enroll_public_key(encoded)


def test_a_point_off_the_curve_and_a_wrong_size_are_refused() -> None:
    with pytest.raises(AgentKeyRefused, match="not a point"):
        enroll_public_key(bytes([2]) + bytes(31))
    with pytest.raises(AgentKeyRefused, match="32 bytes"):
        enroll_public_key(bytes(31))


def test_generated_keys_are_enrolled() -> None:
    for _ in range(5):
        assert enroll_public_key(raw_public(Ed25519PrivateKey.generate()))
