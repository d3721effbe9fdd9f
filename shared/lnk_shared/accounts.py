"""The proof that an account is the one something was recorded for: its user name and its home
folder's identity (device, inode number, and the inode's generation, FS_IOC_GETVERSION: ext4,
XFS and btrfs give each new inode a fresh one, so a home made again in a freed inode number
still differs). The controller keeps records per account with it (`lnk_controller.accounts`);
the SSH gate binds a key's line to the account it was authorized for (`lnk_ssh_gate`).

`judge_account` is pure; `prove_account` reads passwd and the home folder.

Security limitations: a generation the file system does not keep (tmpfs, some network file
systems) reads as 0 and is not compared. An account that kept its name and its very home folder
(`userdel` without `-r`, `useradd -d` on the same folder) is NOT told apart: whoever has that
folder of files is treated as the person it was recorded for.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import re
import sys
from dataclasses import dataclass
from typing import Literal

from lnk_shared.errors import StateError

__all__ = [
    "UNKNOWN_GENERATION",
    "AccountProof",
    "Verdict",
    "home_token",
    "judge_account",
    "parse_home_token",
    "prove_account",
]

FS_IOC_GETVERSION = 0x80087601  # _IOR('v', 1, long): the inode's generation (ext4 writes 32 bits)
UNKNOWN_GENERATION = 0  # what a file system that keeps none gives here: not compared
_HOME_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NO_HOME = frozenset({errno.ENOENT, errno.ENOTDIR})
# uid:dev:ino:generation, as a key's line carries it: digits and colons only, nothing to quote
_HOME_TOKEN = re.compile(r"(\d{1,10}):(\d{1,20}):(\d{1,20}):(\d{1,10})")


Verdict = Literal["first use", "same", "recycled"]


@dataclass(frozen=True)
class AccountProof:
    """What says an account is the one a uid's records were made for. A missing home reads
    as device, inode and generation 0."""

    name: str
    home: str
    home_dev: int
    home_ino: int
    home_generation: int


def judge_account(recorded: AccountProof | None, now: AccountProof) -> Verdict:
    """Pure: is `now` the account `recorded` was made for?"""
    if recorded is None:
        return "first use"
    generations_known = UNKNOWN_GENERATION not in (recorded.home_generation, now.home_generation)
    same = (
        recorded.name == now.name
        and recorded.home == now.home
        and (recorded.home_dev, recorded.home_ino) == (now.home_dev, now.home_ino)
        and (not generations_known or recorded.home_generation == now.home_generation)
    )
    return "same" if same else "recycled"


def _generation(fd: int) -> int:
    buffer = bytearray(8)  # the ioctl's declared size; ext4 and btrfs fill the first 4 bytes
    try:
        fcntl.ioctl(fd, FS_IOC_GETVERSION, buffer, True)
    except OSError:  # ENOTTY, EOPNOTSUPP: a file system that keeps no generation
        return UNKNOWN_GENERATION
    return int.from_bytes(buffer[:4], sys.byteorder)


def prove_account(uid: int) -> AccountProof | None:
    """The account of `uid` as the machine has it now; None when the uid has no account.
    StateError when its home cannot be looked at (never a guess that would forget records)."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return None
    try:
        fd = os.open(entry.pw_dir, _HOME_FLAGS)
    except OSError as exc:
        if exc.errno in _NO_HOME:
            return AccountProof(entry.pw_name, entry.pw_dir, 0, 0, UNKNOWN_GENERATION)
        if exc.errno != errno.EACCES:
            raise StateError(
                f"cannot look at the home folder {entry.pw_dir!r} of uid {uid} "
                f"({exc.strerror}), which tells lnk box whose records are whose: try again"
            ) from None
        try:  # root squashed (a network home): the folder's identity without its generation
            info = os.stat(entry.pw_dir)
        except OSError as again:
            raise StateError(
                f"cannot look at the home folder {entry.pw_dir!r} of uid {uid} "
                f"({again.strerror}), which tells lnk box whose records are whose: try again"
            ) from None
        return AccountProof(
            entry.pw_name, entry.pw_dir, info.st_dev, info.st_ino, UNKNOWN_GENERATION
        )
    try:
        info = os.fstat(fd)
        return AccountProof(entry.pw_name, entry.pw_dir, info.st_dev, info.st_ino, _generation(fd))
    finally:
        os.close(fd)


def home_token(uid: int, proof: AccountProof) -> str:
    """The uid and the home folder's identity as one word (`uid:dev:ino:generation`)."""
    return f"{uid}:{proof.home_dev}:{proof.home_ino}:{proof.home_generation}"


def parse_home_token(text: str) -> tuple[int, int, int, int]:
    """(uid, dev, ino, generation) of a `home_token`; ValueError for anything else."""
    match = _HOME_TOKEN.fullmatch(text)
    if match is None:
        raise ValueError(f"{text[:40]!r} is not uid:device:inode:generation")
    uid, dev, ino, generation = (int(g) for g in match.groups())
    return uid, dev, ino, generation
