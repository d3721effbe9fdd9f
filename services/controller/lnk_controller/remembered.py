"""Remembered specs: the grants each owner approved, so an unchanged spec runs without asking.

A spec is remembered per owner (a uid) and spec key: the spec file's absolute path, or for a spec
given by flags alone, `<flags>:` and the hash of what it grants (`flags_key`), so each set of
flags a user approved is remembered by what it opens, several at once (at most
MAX_FLAG_APPROVALS, the oldest forgotten first). The caller decides whether a spec file changed by
comparing `grants_hash`; `grants_json` keeps the approved document so a changed spec can show
what changed. Every query is filtered by `owner_uid`: one owner can never read, replace or forget
another's entry.

Security limitations: this stores what the caller says was approved. It does NOT check that
`grants_hash` is the hash of `grants_json`, nor that `owner_uid` is the caller's real uid: the
controller must establish both (peer credentials, its own canonical hashing) before calling.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Delete, Engine, bindparam, delete, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from lnk_controller.db import begin_write, database_errors, database_path
from lnk_controller.models import RememberedSpec

__all__ = [
    "FLAGS_KEY",
    "MAX_FLAG_APPROVALS",
    "MAX_GRANTS_JSON_CHARS",
    "MAX_SPEC_KEY_CHARS",
    "MAX_UID",
    "Remembered",
    "RememberedSpecs",
    "flags_key",
    "is_flags_key",
]

# PATH_MAX on Linux: a longer key cannot be a real spec path.
MAX_SPEC_KEY_CHARS = 4096
# Far more than any real spec's grants; bounds the row a caller can make the controller store.
MAX_GRANTS_JSON_CHARS = 1_048_576
# uid_t is 32 bits and (uid_t)-1 means "no user".
MAX_UID = 2**32 - 2

# A user alternates a handful of flag sets (a build, a test, a download): 32 remembers them all
# and keeps each owner's rows, and `lnk spec list`, short. Past it the oldest asks again.
MAX_FLAG_APPROVALS = 32
FLAGS_KEY = "<flags>"  # `lnk spec forget <flags>`: every flag-only approval; keys start with it
MIN_HASH_PREFIX = 8  # hex digits that name one flag-only approval (`<flags>:1a2b3c4d`)

_GRANTS_HASH = re.compile(r"[0-9a-f]{64}")
_HASH_PREFIX = re.compile(rf"[0-9a-f]{{{MIN_HASH_PREFIX},64}}")


def flags_key(grants_hash: str) -> str:
    """The key of a spec given by flags alone: what it opens, so another set is another key."""
    _check_grants_hash(grants_hash)
    return f"{FLAGS_KEY}:{grants_hash}"


def is_flags_key(spec_key: str) -> bool:
    """`<flags>` (an approval from before several were kept) or `<flags>:...`."""
    return spec_key == FLAGS_KEY or spec_key.startswith(f"{FLAGS_KEY}:")


_COLUMNS = (
    RememberedSpec.owner_uid,
    RememberedSpec.spec_key,
    RememberedSpec.grants_hash,
    RememberedSpec.grants_json,
    RememberedSpec.approved_at,
)

# Every launch looks its spec up: built once, so each lookup is a compiled-cache hit.
_LOOKUP = select(*_COLUMNS).where(
    RememberedSpec.owner_uid == bindparam("owner_uid"),
    RememberedSpec.spec_key == bindparam("spec_key"),
)


@dataclass(frozen=True)
class Remembered:
    owner_uid: int
    spec_key: str
    grants_hash: str
    grants_json: str
    approved_at: datetime


def _utc_now() -> datetime:
    return datetime.now(UTC)


class RememberedSpecs:
    """The remembered-specs store over an engine from `lnk_controller.db.open_database`.

    Every method validates its arguments (`ValueError`) and raises `StateError` when the
    database cannot be used. `clock` gives the approval time (aware, UTC); tests replace it.
    """

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = _utc_now) -> None:
        self._engine = engine
        self._path = database_path(engine)
        self._clock = clock

    def lookup(self, owner_uid: int, spec_key: str) -> Remembered | None:
        _check_owner_uid(owner_uid)
        _check_spec_key(spec_key)
        params = {"owner_uid": owner_uid, "spec_key": spec_key}
        with database_errors(self._path, "read"), self._engine.connect() as conn:
            row = conn.execute(_LOOKUP, params).one_or_none()
        return None if row is None else Remembered(*row)

    def remember(
        self, owner_uid: int, spec_key: str, grants_hash: str, grants_json: str
    ) -> Remembered:
        """Record (or replace) the approved grants of this owner's spec, approved now."""
        _check_owner_uid(owner_uid)
        _check_spec_key(spec_key)
        _check_grants_hash(grants_hash)
        _check_grants_json(grants_json)
        approved_at = self._clock()
        if approved_at.tzinfo is None or approved_at.utcoffset() is None:
            raise ValueError("the clock gave a naive datetime: it must give an aware UTC one")
        insert = sqlite_insert(RememberedSpec).values(
            owner_uid=owner_uid,
            spec_key=spec_key,
            grants_hash=grants_hash,
            grants_json=grants_json,
            approved_at=approved_at,
        )
        upsert = insert.on_conflict_do_update(
            index_elements=[RememberedSpec.owner_uid, RememberedSpec.spec_key],
            set_={
                "grants_hash": insert.excluded.grants_hash,
                "grants_json": insert.excluded.grants_json,
                "approved_at": insert.excluded.approved_at,
            },
        ).returning(*_COLUMNS)
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            row = conn.execute(upsert).one()
            if is_flags_key(spec_key):
                conn.execute(_evict_flags(owner_uid))
        return Remembered(*row)

    def forget(self, owner_uid: int, spec_key: str) -> bool:
        """Forget this owner's spec; True if it was remembered."""
        _check_owner_uid(owner_uid)
        _check_spec_key(spec_key)
        statement = delete(RememberedSpec).where(
            RememberedSpec.owner_uid == owner_uid, RememberedSpec.spec_key == spec_key
        )
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            deleted = conn.execute(statement).rowcount
        return deleted > 0

    def forget_flags(self, owner_uid: int, which: str) -> int:
        """Forget flag-only approvals: `<flags>` every one, `<flags>:PREFIX` (MIN_HASH_PREFIX to
        64 hex digits of its hash, as `lnk spec list` shows it) the one it names; how many.
        ValueError for another form, or a prefix that names more than one."""
        _check_owner_uid(owner_uid)
        mine = RememberedSpec.owner_uid == owner_uid
        if which == FLAGS_KEY:
            rows = mine & _FLAGS_ROWS
        else:
            prefix = which.removeprefix(f"{FLAGS_KEY}:")
            if prefix == which or not _HASH_PREFIX.fullmatch(prefix):
                raise ValueError(
                    f"{FLAGS_KEY}:HASH takes {MIN_HASH_PREFIX} to 64 lowercase hex digits of an "
                    "approval's hash, as `lnk spec list` shows it"
                )
            rows = mine & RememberedSpec.spec_key.startswith(f"{FLAGS_KEY}:{prefix}")
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            found = conn.execute(select(RememberedSpec.id).where(rows)).all()
            if len(found) > 1 and which != FLAGS_KEY:
                raise ValueError(f"{which} names {len(found)} approvals: give more of its hash")
            return int(conn.execute(delete(RememberedSpec).where(rows)).rowcount)

    def forget_all(self, owner_uid: int) -> int:
        """Forget every spec of this owner (its account is gone); how many there were."""
        _check_owner_uid(owner_uid)
        statement = delete(RememberedSpec).where(RememberedSpec.owner_uid == owner_uid)
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            return int(conn.execute(statement).rowcount)

    def list_for(self, owner_uid: int) -> list[Remembered]:
        """This owner's remembered specs, ordered by spec key."""
        _check_owner_uid(owner_uid)
        query = (
            select(*_COLUMNS)
            .where(RememberedSpec.owner_uid == owner_uid)
            .order_by(RememberedSpec.spec_key)
        )
        with database_errors(self._path, "read"), self._engine.begin() as conn:
            rows = conn.execute(query).all()
        return [Remembered(*row) for row in rows]


_FLAGS_ROWS = (RememberedSpec.spec_key == FLAGS_KEY) | RememberedSpec.spec_key.startswith(
    f"{FLAGS_KEY}:"
)


def _evict_flags(owner_uid: int) -> Delete:
    """Delete this owner's flag-only approvals past the newest MAX_FLAG_APPROVALS."""
    kept = (
        select(RememberedSpec.id)
        .where(RememberedSpec.owner_uid == owner_uid, _FLAGS_ROWS)
        .order_by(RememberedSpec.approved_at.desc(), RememberedSpec.id.desc())
        .limit(MAX_FLAG_APPROVALS)
    )
    return delete(RememberedSpec).where(
        RememberedSpec.owner_uid == owner_uid, _FLAGS_ROWS, RememberedSpec.id.not_in(kept)
    )


def _check_owner_uid(owner_uid: int) -> None:
    if isinstance(owner_uid, bool) or not isinstance(owner_uid, int):
        raise ValueError(f"owner_uid must be an int, not {type(owner_uid).__name__}")
    if not 0 <= owner_uid <= MAX_UID:
        raise ValueError(f"owner_uid must be a uid from 0 to {MAX_UID}, not {owner_uid}")


def _check_spec_key(spec_key: str) -> None:
    if not isinstance(spec_key, str):
        raise ValueError(f"spec_key must be a str, not {type(spec_key).__name__}")
    if not spec_key:
        raise ValueError("spec_key must not be empty")
    if "\x00" in spec_key:
        raise ValueError("spec_key must not contain a NUL character")
    if len(spec_key) > MAX_SPEC_KEY_CHARS:
        raise ValueError(
            f"spec_key is {len(spec_key)} characters long; the most is {MAX_SPEC_KEY_CHARS}"
        )


def _check_grants_hash(grants_hash: str) -> None:
    if not isinstance(grants_hash, str) or not _GRANTS_HASH.fullmatch(grants_hash):
        raise ValueError("grants_hash must be 64 lowercase hex digits (a SHA-256 digest)")


def _check_grants_json(grants_json: str) -> None:
    if not isinstance(grants_json, str):
        raise ValueError(f"grants_json must be a str, not {type(grants_json).__name__}")
    if len(grants_json) > MAX_GRANTS_JSON_CHARS:
        raise ValueError(
            f"grants_json is {len(grants_json)} characters long; the most is "
            f"{MAX_GRANTS_JSON_CHARS}"
        )
    try:
        json.loads(grants_json)
    except ValueError as exc:
        raise ValueError(f"grants_json is not a JSON document: {exc}") from exc
