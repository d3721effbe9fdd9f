"""Agent proofs: how a bridge knows a call comes from the agent it names, acting as itself.

Every call an agent makes to a bridge is one JSON object with exactly these fields:

    {"v": 1, "agent": ID, "audience": BRIDGE, "action": ACTION,
     "created": UNIX_S, "expires": UNIX_S, "nonce": B64(16 bytes),
     "body": B64(the exact body bytes), "signature": B64(64 bytes)}

The signature is Ed25519 over `signed_bytes`: a fixed magic and version, then each field
length-prefixed (agent, audience, action, SHA-256 of the body bytes, created, expires, nonce),
so no field can borrow bytes from its neighbour. Nothing on the wire names an algorithm or a
key: the algorithm is fixed and the key is looked up by agent id, so whatever a caller claims
about keys is an unknown field, refused.

`verify_call` is the whole check, in this order: the fields (exact keys, types, sizes, canonical
base64), the audience, the socket (the call arrived on the named agent's own socket), the key
(known agent), the peer (SO_PEERCRED uid = the agent's current host uid), the window
(|now - created| <= max skew, 0 < expires - created <= max lifetime, now <= expires), the
signature, and last the nonce, recorded by a UNIQUE insert the caller provides (`NonceLedger`),
so a proof that fails anything else never uses up a nonce. Every failure is the same
`ProofRefused` outward (`str()` is one fixed sentence); the reason is in `.reason`, for the
service's log only.

`enroll_public_key` is the only way a public key enters a registry: 32 bytes, a canonical
encoding of a point on the curve, of the prime order L. A small-order key (the identity, or a
point of order 2, 4 or 8) would let a forged signature (R = identity, S = 0) verify for every
message, since OpenSSL's Ed25519 does not reject such keys itself.

Security limitations: this does NOT protect a private key once read from the agent's sandbox
(anyone holding it is that agent), does NOT guard against the bridge's own clock being wrong,
and a nonce is remembered only until its proof expires (a clock set back past that window
reopens replays of proofs made in it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from lnk_shared.errors import LnkError

__all__ = [
    "AGENT_ID",
    "DEFAULT_MAX_LIFETIME_S",
    "DEFAULT_MAX_SKEW_S",
    "MAGIC",
    "MAX_BODY_BYTES",
    "NONCE_BYTES",
    "PROOF_FIELDS",
    "PROOF_VERSION",
    "REFUSAL",
    "AgentKey",
    "AgentKeyRefused",
    "CallContext",
    "NonceLedger",
    "Proof",
    "ProofPolicy",
    "ProofRefused",
    "VerifiedCall",
    "enroll_public_key",
    "parse_proof",
    "sign_call",
    "signed_bytes",
    "verify_call",
]

MAGIC = b"lnk-agent-proof\x00"  # a signature made for anything else never parses as a proof
PROOF_VERSION = 1
NONCE_BYTES = 16  # 128 random bits: no two proofs of an agent ever share one by chance
SIGNATURE_BYTES = 64  # Ed25519's R || S
PUBLIC_KEY_BYTES = 32
MAX_BODY_BYTES = 256 * 1024  # an event is at most 64 KiB (the store's limit); room for framing
DEFAULT_MAX_SKEW_S = 30  # the window: a proof made within 30 s of the bridge's clock
DEFAULT_MAX_LIFETIME_S = 60  # and valid for at most a minute
MAX_SKEW_BOUND_S = 300  # a bridge may widen the window, never past 5 minutes: replays need it
MAX_LIFETIME_BOUND_S = 300
MAX_TIME = 2**63 - 1  # created/expires are signed as 8 bytes

PROOF_FIELDS = frozenset(
    {"v", "agent", "audience", "action", "created", "expires", "nonce", "body", "signature"}
)
AGENT_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")  # an agent's name, also a path component
AUDIENCE = re.compile(r"[a-z][a-z0-9-]{0,31}")  # which bridge: "store", "inbox"
ACTION = re.compile(r"[a-z][a-z0-9._-]{0,63}")
_LENGTH = struct.Struct(">I")
_TIME = struct.Struct(">q")
REFUSAL = "the bridge refused the call"  # the one answer every bad proof gets


class ProofRefused(LnkError):
    """A call whose proof fails. Outward it says only `REFUSAL`; `reason` is for the log."""

    def __init__(self, reason: str) -> None:
        super().__init__(REFUSAL)
        self.reason = reason


class AgentKeyRefused(LnkError):
    """A public key that must not be enrolled (wrong size, not canonical, not of prime order)."""


@dataclass(frozen=True)
class Proof:
    """A call's fields, checked for shape (not yet for truth)."""

    agent: str
    audience: str
    action: str
    created: int
    expires: int
    nonce: bytes
    body: bytes
    signature: bytes


@dataclass(frozen=True)
class ProofPolicy:
    """What a bridge accepts: its own audience name and the time window, bounded."""

    audience: str
    max_skew_s: int = DEFAULT_MAX_SKEW_S
    max_lifetime_s: int = DEFAULT_MAX_LIFETIME_S

    def __post_init__(self) -> None:
        if not AUDIENCE.fullmatch(self.audience):
            raise ValueError(f"audience {self.audience!r} must match {AUDIENCE.pattern}")
        if not 1 <= self.max_skew_s <= MAX_SKEW_BOUND_S:
            raise ValueError(f"max_skew_s must be 1 to {MAX_SKEW_BOUND_S}")
        if not 1 <= self.max_lifetime_s <= MAX_LIFETIME_BOUND_S:
            raise ValueError(f"max_lifetime_s must be 1 to {MAX_LIFETIME_BOUND_S}")


@dataclass(frozen=True)
class AgentKey:
    """What a bridge knows of an agent: its enrolled key and its host uid while it runs."""

    agent: str
    public_key: Ed25519PublicKey
    host_uid: int | None


@dataclass(frozen=True)
class CallContext:
    """Where a call came from, as the kernel and the bridge saw it."""

    socket_agent: str  # the agent whose socket the connection was accepted on
    peer_uid: int  # SO_PEERCRED
    now: float


@dataclass(frozen=True)
class VerifiedCall:
    agent: str
    action: str
    body: bytes


class NonceLedger(Protocol):
    def record(self, agent: str, nonce: bytes, expires: int) -> bool:
        """Insert (agent, nonce) atomically; False when it was already there."""
        ...


def signed_bytes(
    *,
    agent: str,
    audience: str,
    action: str,
    body_sha256: bytes,
    created: int,
    expires: int,
    nonce: bytes,
) -> bytes:
    """The exact bytes a proof's signature covers."""
    fields = (
        agent.encode("utf-8"),
        audience.encode("utf-8"),
        action.encode("utf-8"),
        body_sha256,
        _TIME.pack(created),
        _TIME.pack(expires),
        nonce,
    )
    out = [MAGIC, _LENGTH.pack(PROOF_VERSION)]
    for field in fields:
        out += [_LENGTH.pack(len(field)), field]
    return b"".join(out)


def sign_call(
    private_key: Ed25519PrivateKey,
    *,
    agent: str,
    audience: str,
    action: str,
    body: bytes,
    now: float,
    lifetime_s: int = DEFAULT_MAX_LIFETIME_S,
    nonce: bytes | None = None,
) -> dict[str, Any]:
    """The wire object of a call, signed with the agent's key."""
    nonce = secrets.token_bytes(NONCE_BYTES) if nonce is None else nonce
    created = int(now)
    expires = created + lifetime_s
    message = signed_bytes(
        agent=agent,
        audience=audience,
        action=action,
        body_sha256=hashlib.sha256(body).digest(),
        created=created,
        expires=expires,
        nonce=nonce,
    )
    return {
        "v": PROOF_VERSION,
        "agent": agent,
        "audience": audience,
        "action": action,
        "created": created,
        "expires": expires,
        "nonce": _b64(nonce),
        "body": _b64(body),
        "signature": _b64(private_key.sign(message)),
    }


def parse_proof(untrusted: dict[str, Any]) -> Proof:
    """The fields of an untrusted call, checked for shape; `ProofRefused` otherwise."""
    keys = set(untrusted)
    if keys != PROOF_FIELDS:
        raise ProofRefused(
            f"fields: missing {sorted(PROOF_FIELDS - keys)}, unknown {sorted(keys - PROOF_FIELDS)}"
        )
    if type(untrusted["v"]) is not int or untrusted["v"] != PROOF_VERSION:
        raise ProofRefused(f"version must be {PROOF_VERSION}")
    agent = _text(untrusted, "agent", AGENT_ID)
    audience = _text(untrusted, "audience", AUDIENCE)
    action = _text(untrusted, "action", ACTION)
    created, expires = _time(untrusted, "created"), _time(untrusted, "expires")
    nonce = _unb64(untrusted, "nonce", NONCE_BYTES)
    signature = _unb64(untrusted, "signature", SIGNATURE_BYTES)
    body = _unb64(untrusted, "body", None)
    return Proof(agent, audience, action, created, expires, nonce, body, signature)


def verify_call(
    untrusted: dict[str, Any],
    *,
    policy: ProofPolicy,
    context: CallContext,
    key_for: Callable[[str], AgentKey | None],
    nonces: NonceLedger,
) -> VerifiedCall:
    """Check a call completely (see the module's docstring); `ProofRefused` on any failure."""
    proof = parse_proof(untrusted)
    if proof.audience != policy.audience:
        raise ProofRefused(f"audience {proof.audience!r} is not {policy.audience!r}")
    if proof.agent != context.socket_agent:
        raise ProofRefused(
            f"agent {proof.agent!r} called on the socket of {context.socket_agent!r}"
        )
    known = key_for(proof.agent)
    if known is None:
        raise ProofRefused(f"agent {proof.agent!r} is not known here")
    if known.host_uid is None or known.host_uid != context.peer_uid:
        raise ProofRefused(
            f"peer uid {context.peer_uid} is not agent {proof.agent!r}'s host uid {known.host_uid}"
        )
    _check_window(proof, policy, context.now)
    message = signed_bytes(
        agent=proof.agent,
        audience=proof.audience,
        action=proof.action,
        body_sha256=hashlib.sha256(proof.body).digest(),
        created=proof.created,
        expires=proof.expires,
        nonce=proof.nonce,
    )
    try:
        known.public_key.verify(proof.signature, message)
    except InvalidSignature:
        raise ProofRefused(f"signature does not verify with {proof.agent!r}'s key") from None
    if not nonces.record(proof.agent, proof.nonce, proof.expires):
        raise ProofRefused(f"nonce {proof.nonce.hex()} of {proof.agent!r} was used before")
    return VerifiedCall(agent=proof.agent, action=proof.action, body=proof.body)


def _check_window(proof: Proof, policy: ProofPolicy, now: float) -> None:
    if abs(now - proof.created) > policy.max_skew_s:
        raise ProofRefused(f"created {proof.created} is over {policy.max_skew_s} s from {now:.0f}")
    lifetime = proof.expires - proof.created
    if not 0 < lifetime <= policy.max_lifetime_s:
        raise ProofRefused(f"lifetime {lifetime} s is not within 1..{policy.max_lifetime_s} s")
    if now > proof.expires:
        raise ProofRefused(f"expired at {proof.expires} (now {now:.0f})")


def _text(untrusted: dict[str, Any], key: str, pattern: re.Pattern[str]) -> str:
    value = untrusted[key]
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ProofRefused(f"{key} must match {pattern.pattern}")
    return value


def _time(untrusted: dict[str, Any], key: str) -> int:
    value = untrusted[key]
    if type(value) is not int or not 0 <= value <= MAX_TIME:
        raise ProofRefused(f"{key} must be a whole number of seconds")
    return value


def _unb64(untrusted: dict[str, Any], key: str, size: int | None) -> bytes:
    """Strict, canonical base64: one text per byte string, so nothing else can stand for it."""
    value = untrusted[key]
    limit = MAX_BODY_BYTES if size is None else size
    if not isinstance(value, str) or not value.isascii() or len(value) > (limit + 2) // 3 * 4:
        raise ProofRefused(f"{key} must be base64 of at most {limit} bytes")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ProofRefused(f"{key} is not valid base64") from None
    if _b64(raw) != value or (size is not None and len(raw) != size):
        raise ProofRefused(f"{key} must be canonical base64 of {size or 'the'} bytes")
    return raw


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


# --- enrollment: the curve arithmetic needed to refuse small-order and non-canonical keys ---

_P = 2**255 - 19
_L = 2**252 + 27742317777372353535851937790883648493  # the prime order of the base point
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)
_Point = tuple[int, int, int, int]  # extended coordinates (X, Y, Z, T)
_IDENTITY: _Point = (0, 1, 1, 0)


def enroll_public_key(raw: bytes) -> Ed25519PublicKey:
    """The key, if it may be enrolled; `AgentKeyRefused` naming why not."""
    if len(raw) != PUBLIC_KEY_BYTES:
        raise AgentKeyRefused(f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes, not {len(raw)}")
    point = _decode_point(raw)
    if _is_identity(_multiply(point, 8)):
        raise AgentKeyRefused(
            "this public key is a point of small order: a forged signature would verify "
            "for every message. Generate a new key pair"
        )
    if not _is_identity(_multiply(point, _L)):
        raise AgentKeyRefused("this public key is not in the prime-order group. Generate a new key")
    return Ed25519PublicKey.from_public_bytes(raw)


def _decode_point(raw: bytes) -> _Point:
    """RFC 8032 5.1.3, refusing every non-canonical encoding instead of reducing it."""
    encoded = int.from_bytes(raw, "little")
    sign, y = encoded >> 255, encoded & ((1 << 255) - 1)
    if y >= _P:
        raise AgentKeyRefused("this public key is not canonically encoded (y is not below p)")
    x2 = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P:
        raise AgentKeyRefused("this public key is not a point on the curve")
    if x == 0 and sign:
        raise AgentKeyRefused("this public key is not canonically encoded (x = 0 with a sign)")
    if x & 1 != sign:
        x = _P - x
    return (x, y, 1, x * y % _P)


def _add(p: _Point, q: _Point) -> _Point:
    a = (p[1] - p[0]) * (q[1] - q[0]) % _P
    b = (p[1] + p[0]) * (q[1] + q[0]) % _P
    c = 2 * p[3] * q[3] * _D % _P
    d = 2 * p[2] * q[2] % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _multiply(point: _Point, scalar: int) -> _Point:
    result = _IDENTITY
    while scalar:
        if scalar & 1:
            result = _add(result, point)
        point = _add(point, point)
        scalar >>= 1
    return result


def _is_identity(point: _Point) -> bool:
    return point[0] % _P == 0 and (point[1] - point[2]) % _P == 0
