"""The owner's secret store: `lnk secret set|list|remove`, kept by the controller, outside every
sandbox, and opened only for what adds a secret upstream (the proxy, for a sandbox whose
approved rule names it).

Where the values live, and why there: a row per (owner uid, name) in the controller's database
(root-only, 0600), the value sealed with AES-256-GCM under the box's secret key, a 32-byte file
of its own (`secrets.key` in the state folder, root-only, 0600, made once). The database is the
one place an owner's records are kept, forgotten with the account (a recycled uid starts empty,
`lnk_controller.forget_account`), migrated and pruned as the rest; the key beside it means a
copy of the database alone (a backup, a bug report, `sqlite3 .dump`, a test that greps it)
holds no value. Each value's associated data is its owner's uid and its name, so a sealed value
moved to another row (another owner, another name) does not open: the tag fails.

Nothing here returns a value to a caller but `reveal`, which the API does not route: the owner
cannot read a secret back (`list` gives names and times), and no error or log line holds a
value.

Security limitations: root can read both files, so root can read every secret (root is
trusted on the box). This does NOT protect a value once it is revealed to the proxy, which
holds it in memory while it forwards. A key file lost or replaced makes every sealed value
unopenable (`reveal` then says so; the owner sets the secret again), never readable.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import Engine, delete, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from lnk_controller.db import begin_write, database_errors, database_path
from lnk_controller.models import SecretRow
from lnk_shared.errors import StateError
from lnk_shared.secret_names import check_secret_name, check_secret_value

__all__ = [
    "KEY_BYTES",
    "MAX_SECRETS_PER_OWNER",
    "NONCE_BYTES",
    "SecretListing",
    "SecretStore",
    "load_box_key",
]

KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12  # GCM's standard nonce; random per seal (2**32 seals per key stay safe)
KEY_FILE_MODE = 0o600  # root only: the key opens every sealed value
# Far more than any owner's services; bounds the rows one caller can make the controller keep.
MAX_SECRETS_PER_OWNER = 256
_KEY_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


@dataclass(frozen=True)
class SecretListing:
    """What an owner may see of a secret: its name and when it was set, never its value."""

    name: str
    created_at: datetime
    updated_at: datetime


def load_box_key(path: Path) -> bytes:
    """The box's secret key at `path`, made (32 random bytes, 0600) if missing.

    StateError when the file is not a regular file the controller's user owns, others may read
    it, or it does not hold exactly KEY_BYTES: a key in doubt is never used.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _KEY_FLAGS, KEY_FILE_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StateError(f"cannot make the box's secret key {path}: {exc.strerror}") from None
    else:
        try:
            os.fchmod(fd, KEY_FILE_MODE)  # os.open's mode is filtered by the umask
            os.write(fd, os.urandom(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
    try:
        fd = os.open(path, _KEY_FLAGS)
    except OSError as exc:
        why = "it is a link" if exc.errno == errno.ELOOP else exc.strerror
        raise StateError(f"cannot read the box's secret key {path} ({why})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise StateError(
                f"the box's secret key {path} is not a regular file of uid {os.geteuid()}: "
                "remove it (every secret must then be set again)"
            )
        if info.st_mode & 0o077:
            raise StateError(
                f"the box's secret key {path} has mode {stat.S_IMODE(info.st_mode):04o}: others "
                f"may read it; make it {KEY_FILE_MODE:04o} (chmod) and check who read it"
            )
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise StateError(
            f"the box's secret key {path} holds {len(key)} bytes, not {KEY_BYTES}: remove it "
            "(every secret must then be set again)"
        )
    return key


def _bound_to(owner_uid: int, name: str) -> bytes:
    """The associated data of a sealed value: it opens only as this owner's secret of this name."""
    return f"lnk-secret\0{owner_uid}\0{name}".encode()


def _utc_now() -> datetime:
    return datetime.now(UTC)


class SecretStore:
    """Each owner's secrets over an engine from `lnk_controller.db.open_database`.

    Names and values are checked here (`lnk_shared.secret_names`: UsageError); StateError when
    the database cannot be used. Every query is filtered by `owner_uid`.
    """

    def __init__(
        self, engine: Engine, key: bytes, *, clock: Callable[[], datetime] = _utc_now
    ) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"the box's secret key is {KEY_BYTES} bytes, not {len(key)}")
        self._engine = engine
        self._path = database_path(engine)
        self._aead = AESGCM(key)
        self._clock = clock

    def set(self, owner_uid: int, name: str, value: bytes) -> bool:
        """Keep `value` as this owner's secret `name` (replacing one of that name); True if new."""
        check_secret_name(name)
        check_secret_value(value)
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, value, _bound_to(owner_uid, name))
        now = self._clock()
        insert = sqlite_insert(SecretRow).values(
            owner_uid=owner_uid,
            name=name,
            nonce=nonce,
            sealed=sealed,
            created_at=now,
            updated_at=now,
        )
        upsert = insert.on_conflict_do_update(
            index_elements=[SecretRow.owner_uid, SecretRow.name],
            set_={"nonce": nonce, "sealed": sealed, "updated_at": now},
        )
        count = select(SecretRow.name).where(SecretRow.owner_uid == owner_uid)
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            names = set(conn.execute(count).scalars())
            new = name not in names
            if new and len(names) >= MAX_SECRETS_PER_OWNER:
                raise StateError(
                    f"you keep {len(names)} secrets already, the most there may be: remove one "
                    "you no longer use (`lnk secret list`, `lnk secret remove NAME`)"
                )
            conn.execute(upsert)
        return new

    def list_for(self, owner_uid: int) -> list[SecretListing]:
        """This owner's secrets by name: names and times only."""
        query = (
            select(SecretRow.name, SecretRow.created_at, SecretRow.updated_at)
            .where(SecretRow.owner_uid == owner_uid)
            .order_by(SecretRow.name)
        )
        with database_errors(self._path, "read"), self._engine.connect() as conn:
            return [SecretListing(*row) for row in conn.execute(query).all()]

    def remove(self, owner_uid: int, name: str) -> bool:
        """Remove this owner's secret `name`; True if there was one."""
        check_secret_name(name)
        statement = delete(SecretRow).where(
            SecretRow.owner_uid == owner_uid, SecretRow.name == name
        )
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            return int(conn.execute(statement).rowcount) > 0

    def forget_all(self, owner_uid: int) -> int:
        """Remove every secret of this owner (its account is gone); how many there were."""
        statement = delete(SecretRow).where(SecretRow.owner_uid == owner_uid)
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            return int(conn.execute(statement).rowcount)

    def reveal(self, owner_uid: int, name: str) -> bytes:
        """The value of this owner's secret `name`, for what adds it upstream only.

        StateError when there is none (removed: fail closed) or it does not open (another key,
        a row moved): the message names the secret, never a value.
        """
        check_secret_name(name)
        query = select(SecretRow.nonce, SecretRow.sealed).where(
            SecretRow.owner_uid == owner_uid, SecretRow.name == name
        )
        with database_errors(self._path, "read"), self._engine.connect() as conn:
            row = conn.execute(query).one_or_none()
        if row is None:
            raise StateError(
                f"uid {owner_uid} keeps no secret named {name!r}: set it with "
                f"`lnk secret set {name}`"
            )
        try:
            return self._aead.decrypt(row.nonce, row.sealed, _bound_to(owner_uid, name))
        except InvalidTag:
            raise StateError(
                f"the secret {name!r} of uid {owner_uid} does not open with the box's secret key "
                f"(the key was replaced, or the row is not this secret's): set it again with "
                f"`lnk secret set {name}`"
            ) from None
