"""The folder of root-owned `authorized_keys` files, one per box user (`<dir>/<user>`): adding,
listing and revoking lines, each change written whole to a new file and renamed into place
under a lock, so sshd reads the old file or the new one, never half of one.

Who it trusts: root, and only root, writes the folder; `check_root_owned_path` refuses a folder
(or any folder above it) someone else could change, which sshd's StrictModes would refuse too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lnk_shared.errors import StateError, UsageError
from lnk_ssh_gate.authorized_keys import (
    GateLine,
    KeyRefused,
    PublicKey,
    bound_line,
    parse_gate_line,
)
from lnk_ssh_gate.gate_paths import check_root_owned_path

__all__ = ["DEFAULT_KEYS_DIR", "KeyStore", "ListedLine"]

DEFAULT_KEYS_DIR = Path("/etc/ssh/authorized_keys")  # the drop-in's AuthorizedKeysFile %u
FILE_MODE = 0o644  # sshd (running as the user) reads it; only root writes it
DIR_MODE = 0o755
_USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")  # what useradd accepts by default


@dataclass(frozen=True)
class ListedLine:
    user: str
    line: GateLine


class KeyStore:
    def __init__(self, directory: Path = DEFAULT_KEYS_DIR) -> None:
        if not directory.is_absolute():
            raise UsageError(f"the keys' folder must be an absolute path, not {directory}")
        self.directory = directory

    def ensure(self) -> None:
        """Make the folder (root's, 0755) if missing; refuse one others could change."""
        check_root_owned_path(self.directory.parent, "the keys' folder's parent")
        with contextlib.suppress(FileExistsError):
            self.directory.mkdir(mode=DIR_MODE)
        check_root_owned_path(self.directory, "the keys' folder")

    def path_for(self, user: str) -> Path:
        if not _USER_NAME.fullmatch(user):
            raise UsageError(f"{user!r} is not a user name")
        return self.directory / user

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self, user: str) -> list[str]:
        try:
            return self.path_for(user).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as exc:
            raise StateError(f"cannot read {self.path_for(user)}: {exc}") from None

    def _write(self, user: str, lines: list[str]) -> None:
        target = self.path_for(user)
        fd, temp = tempfile.mkstemp(prefix=f".{user}.", dir=self.directory)
        try:
            os.fchown(fd, 0, 0)
            os.fchmod(fd, FILE_MODE)
            os.write(fd, "".join(f"{line}\n" for line in lines).encode("utf-8"))
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(temp, target)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def add(self, user: str, key: PublicKey, line: str) -> tuple[Path, bool]:
        """Append `line` for `user`: (the file, whether it was added). The same line already
        there is left as it is (authorizing again changes nothing: what automation re-runs);
        another line of the same key is refused (sshd would use the first line and silently
        ignore this one's command)."""
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise UsageError(f"there is no user {user!r} on this machine") from None
        self.ensure()
        with self._locked():
            lines = self._read(user)
            if self._already(user, key, line, lines):
                return self.path_for(user), False
            self._write(user, [*lines, line])
        return self.path_for(user), True

    def already(self, user: str, key: PublicKey, line: str) -> bool:
        """Whether `line` is already `user`'s; a refusal when another line has the same key."""
        return self._already(user, key, line, self._read(user))

    def _already(self, user: str, key: PublicKey, line: str, lines: list[str]) -> bool:
        for old in lines:
            parsed = parse_gate_line(old)
            if parsed is not None and parsed.fingerprint == key.fingerprint:
                if old == line:
                    return True
                raise KeyRefused(
                    f"the key {key.fingerprint}",
                    f"it is already in {self.path_for(user)} for another spec, folder or "
                    f"account: revoke it first "
                    f"(lnk box authorize --revoke {key.fingerprint} --user {user})",
                )
        return False

    def listing(self, user: str | None = None) -> list[ListedLine]:
        if not self.directory.is_dir():
            return []
        users = [user] if user else sorted(p.name for p in self.directory.iterdir())
        out = []
        for name in users:
            if not _USER_NAME.fullmatch(name):
                continue  # our own temp files, or something not a user's file
            for raw in self._read(name):
                parsed = parse_gate_line(raw)
                if parsed is not None:
                    out.append(ListedLine(name, parsed))
        return out

    def bind(self, user: str, account: str) -> list[str]:
        """Bind every line of `user` the gate wrote without `--account` to `account` (the
        user's account as it is now: root vouches it is the same person); the fingerprints of
        the lines rewritten. Other lines stay as they are."""
        done = []
        with self._locked():
            lines = self._read(user)
            out = []
            for line in lines:
                bound = bound_line(line, account)
                if bound is not None and (parsed := parse_gate_line(line)) is not None:
                    done.append(parsed.fingerprint)
                out.append(bound if bound is not None else line)
            if done:
                self._write(user, out)
        return done

    def revoke(self, fingerprint: str, user: str | None = None) -> list[str]:
        """Remove every line of `fingerprint` (for `user`, or for every user); the users whose
        file changed. Nothing found is an error, so a typo does not look like a revocation."""
        if not self.directory.is_dir():
            raise UsageError(f"no key with fingerprint {fingerprint} ({self.directory} is empty)")
        changed = []
        with self._locked():
            for listed in {entry.user for entry in self.listing(user)}:
                lines = self._read(listed)
                keep = [
                    line
                    for line in lines
                    if (parsed := parse_gate_line(line)) is None
                    or parsed.fingerprint != fingerprint
                ]
                if len(keep) != len(lines):
                    self._write(listed, keep)
                    changed.append(listed)
        if not changed:
            raise UsageError(f"no key with fingerprint {fingerprint} in {self.directory}")
        return sorted(changed)
