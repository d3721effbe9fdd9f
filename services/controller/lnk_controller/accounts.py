"""Which person a uid's records belong to: remembered specs, sandbox history (with the commands
it ran), agents, their keys and their stores are kept per uid, and a uid is only a number that
`userdel` frees and `useradd` gives the next person.

The proof that a caller is the account its uid's records were made for is the account's user
name and its home folder's identity: device, inode number, and the inode's generation
(FS_IOC_GETVERSION: ext4, XFS and btrfs give each new inode a fresh one, so a new home that
reuses the inode number of a deleted one still differs; on this box's ext4 a folder removed and
made again got the same inode number and another generation). It is recorded at the uid's
first call and compared at each call (`Accounts.check`, on the launch socket and the API; the
proof itself is `lnk_shared.accounts`, which the SSH gate uses too):

    same proof                     the records are the caller's
    no record yet                  recorded now (records older than this check are the caller's)
    another name or home folder    a recycled uid: every record of the old account is removed
                                   (its live sandboxes stopped, its agents and their store
                                   forgotten, its keys deleted) before the call goes on, empty

Why these: the name alone survives `userdel; useradd -u N samename`, the inode number alone
survives a home made again in a freed inode; the generation is what the kernel itself uses to
tell a reused inode from the old one (NFS file handles). A uid with no account is refused, and
its records are left as they are until an account of that uid calls (root can read them).

Security limitations: this does NOT notice an account that kept its name and its very home
folder (`userdel` without `-r`, `useradd -d` on the same folder): that is the same folder of
files, and whoever has it is treated as the person. A generation the file system does not keep
(tmpfs, some network file systems) reads as 0 and is not compared: then the inode number and
the name must both be reused to be missed. A renamed account (`usermod -l`) or a home folder
made anew reads as another person and starts empty. A home the controller cannot look at (an
I/O error, a parent it cannot search) refuses the call instead of guessing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Engine, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from lnk_controller.db import begin_write, database_errors, database_path
from lnk_controller.models import AccountRow
from lnk_shared.accounts import AccountProof, judge_account, prove_account
from lnk_shared.errors import StateError

__all__ = ["Accounts"]

log = logging.getLogger(__name__)


class Accounts:
    """The accounts table, and the check every call of a uid goes through.

    `forget(uid)` removes every record of the uid's old account; it runs before the new proof
    is recorded, so one that fails (a store bridge that does not answer) leaves the old proof,
    and the next call tries again: the new account never sees a half-forgotten old one.
    `exempt(uid)` names uids that keep no records (the sandboxes' own range).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        forget: Callable[[int], None],
        exempt: Callable[[int], bool] = lambda _uid: False,
        prove: Callable[[int], AccountProof | None] = prove_account,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._engine = engine
        self._path = database_path(engine)
        self._forget = forget
        self._exempt = exempt
        self._prove = prove
        self._clock = clock
        self._lock = threading.Lock()  # one check at a time: a recycled uid is forgotten once
        self._known: dict[int, AccountProof] = {}  # what the table holds, to skip a read

    def check(self, uid: int) -> None:
        """Make the records of `uid` the caller's own: StateError for a uid with no account."""
        if uid == 0 or self._exempt(uid):
            return
        now = self._prove(uid)
        if now is None:
            raise StateError(
                f"uid {uid} has no account on this machine (no passwd entry): lnk box keeps "
                "records per account, so it serves none for this uid"
            )
        if self._known.get(uid) == now:
            return
        with self._lock:
            recorded = self.recorded(uid)
            verdict = judge_account(recorded, now)
            if verdict == "recycled":
                log.warning(
                    "uid %d is another account now (%s, home %s; was %s, home %s): "
                    "removing every record of the old one",
                    uid,
                    now.name,
                    now.home,
                    recorded.name if recorded else "?",
                    recorded.home if recorded else "?",
                )
                self._forget(uid)
            if verdict != "same":
                self._record(uid, now)
            self._known[uid] = now

    def recorded(self, uid: int) -> AccountProof | None:
        query = select(AccountRow).where(AccountRow.uid == uid)
        with database_errors(self._path, "read"), self._engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        if row is None:
            return None
        return AccountProof(
            row["name"], row["home"], row["home_dev"], row["home_ino"], row["home_generation"]
        )

    def _record(self, uid: int, proof: AccountProof) -> None:
        values = {
            "uid": uid,
            "name": proof.name,
            "home": proof.home,
            "home_dev": proof.home_dev,
            "home_ino": proof.home_ino,
            "home_generation": proof.home_generation,
            "recorded_at": self._clock(),
        }
        insert = sqlite_insert(AccountRow).values(**values)
        upsert = insert.on_conflict_do_update(
            index_elements=[AccountRow.uid],
            set_={k: insert.excluded[k] for k in values if k != "uid"},
        )
        with database_errors(self._path, "write"), begin_write(self._engine) as conn:
            conn.execute(upsert)
