"""The `authorized_keys` lines that let a key into a box: judged and built here (pure), written
by `key_store` (I/O).

Each line is `restrict,pty,command="<lnk> sandbox enter --spec S --folder F [--run-dir R]
[--account UID:DEV:INO:GEN]" <type> <key> [comment]`: `--account` binds it to the account it
was written for (its uid and home folder's identity), so a user made later with the same name
is not let in by it; `restrict` turns off every forwarding, agent, X11 and ~/.ssh/rc; `pty` gives
back a terminal when the client asks for one; the command is what sshd runs whatever the
client asks, with the client's request in SSH_ORIGINAL_COMMAND. The key's holder can change
none of it: the file is root's (`/etc/ssh/authorized_keys/<user>`, 0644).

Refused: a key that carries options of its own (the gate writes them), several keys, CR, LF or
NUL anywhere, a key type sshd would not take, a fingerprint already on the user's file, a folder
that is, holds or sits inside the box user's home, /etc, the box's folders or the keys' folder,
and spec/folder paths that are relative, not normalized or hold shell or option syntax.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from lnk_shared.accounts import parse_home_token
from lnk_shared.errors import RefusedError
from lnk_shared.refusals import inside
from lnk_ssh_gate.gate_paths import check_line_path

__all__ = [
    "KEY_TYPES",
    "MAX_KEY_BYTES",
    "FolderRefused",
    "GateLine",
    "KeyRefused",
    "PublicKey",
    "bound_line",
    "check_folder",
    "command_account",
    "forced_command",
    "key_line",
    "parse_gate_line",
    "parse_public_key",
]

# Key types sshd accepts for users; certificates are left out (a CA's key is another door).
KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "sk-ssh-ed25519@openssh.com",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ecdsa-sha2-nistp256@openssh.com",
        "ssh-rsa",
    }
)
MAX_KEY_BYTES = 16 * 1024  # a 16384-bit RSA key's line is under 3 KiB; a bigger file is no key
MAX_COMMENT = 200  # a comment names the key's holder; longer is not a name
_COMMENT = re.compile(r"^[\x20-\x7e]*$")
OPTIONS = "restrict,pty"
_GATE_LINE = re.compile(r'^restrict,pty,command="([^"]*)" (\S+) (\S+)(?: (.*))?$')


class KeyRefused(RefusedError):
    rule = "ssh-key"


class FolderRefused(RefusedError):
    rule = "session-folder"


@dataclass(frozen=True)
class PublicKey:
    key_type: str
    blob: str  # base64, as written
    comment: str

    @property
    def fingerprint(self) -> str:
        """What `ssh-keygen -l` prints: SHA256 of the key's bytes, base64 without padding."""
        digest = hashlib.sha256(base64.b64decode(self.blob)).digest()
        return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def parse_public_key(untrusted_text: str, source: str = "the key") -> PublicKey:
    """One public key as `ssh-keygen` writes it (`<type> <base64> [comment]`, one line)."""
    if len(untrusted_text.encode("utf-8", "surrogateescape")) > MAX_KEY_BYTES:
        raise KeyRefused(source, f"it is over {MAX_KEY_BYTES} bytes: not one public key")
    text = untrusted_text[:-1] if untrusted_text.endswith("\n") else untrusted_text
    lines = [line for line in text.split("\n") if line.strip()]
    if len(lines) > 1:
        raise KeyRefused(source, "it holds several keys (or lines): give one key per call")
    for char, name in (("\r", "a carriage return"), ("\n", "a line break"), ("\x00", "NUL")):
        if char in text:
            raise KeyRefused(source, f"it holds {name}: a line break would start a new line")
    fields = text.strip().split(None, 2)
    if not fields:
        raise KeyRefused(source, "it is empty")
    if fields[0] not in KEY_TYPES:
        if any(f in KEY_TYPES for f in text.split()):
            raise KeyRefused(
                source,
                f"it carries options ({fields[0][:60]}): give the bare key, "
                "the gate writes the line's options itself",
            )
        raise KeyRefused(
            source,
            f"{fields[0][:60]!r} is not a key type sshd takes ({', '.join(sorted(KEY_TYPES))})",
        )
    if len(fields) < 2:
        raise KeyRefused(source, "the key's base64 part is missing")
    key_type, blob = fields[0], fields[1]
    comment = fields[2].strip() if len(fields) > 2 else ""
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        raise KeyRefused(source, "the key's base64 part does not decode") from None
    if len(raw) < 4 or raw[4 : 4 + struct.unpack(">I", raw[:4])[0]] != key_type.encode():
        raise KeyRefused(source, f"the key's bytes are not a {key_type} key")
    if len(comment) > MAX_COMMENT or not _COMMENT.fullmatch(comment) or '"' in comment:
        raise KeyRefused(
            source,
            f"the comment must be printable ASCII without quotes, at most {MAX_COMMENT} chars",
        )
    return PublicKey(key_type, blob, comment)


def forced_command(
    lnk: str, spec: str, folder: str, run_dir: str | None = None, account: str | None = None
) -> str:
    """The command sshd runs for the key: every path checked, so no quoting is needed.
    `account` (`lnk_shared.accounts.home_token`) binds the line to the account it was written
    for: a later account of the same name (a recycled user) is refused at each session."""
    words = [
        check_line_path(lnk, "the lnk command"),
        "sandbox",
        "enter",
        "--spec",
        check_line_path(spec, "the spec"),
        "--folder",
        check_line_path(folder, "the folder"),
    ]
    if run_dir is not None:
        words += ["--run-dir", check_line_path(run_dir, "the box's run dir")]
    if account is not None:
        try:
            parse_home_token(account)
        except ValueError as exc:
            raise KeyRefused("the account", str(exc)) from None
        words += ["--account", account]
    return " ".join(words)


def key_line(key: PublicKey, command: str) -> str:
    """The whole authorized_keys line, without its newline."""
    line = f'{OPTIONS},command="{command}" {key.key_type} {key.blob}'
    return f"{line} {key.comment}" if key.comment else line


@dataclass(frozen=True)
class GateLine:
    """A line of an authorized_keys file as `--list` shows it."""

    fingerprint: str
    command: str  # "" for a line the gate did not write
    comment: str
    ours: bool

    @property
    def bound(self) -> bool:
        """Whether the line names the account it was written for (`--account`): a line the
        gate wrote without it is refused at every session (`enter.plan_session`)."""
        return command_account(self.command) is not None


def parse_gate_line(line: str) -> GateLine | None:
    """Read back a line; None for blanks and comments. Lines not of the gate's form are
    shown as such (an admin's edit), with the fingerprint when the key part reads."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    match = _GATE_LINE.fullmatch(text)
    if match:
        key = PublicKey(match.group(2), match.group(3), match.group(4) or "")
        try:
            return GateLine(key.fingerprint, match.group(1), key.comment, True)
        except (binascii.Error, ValueError):
            return GateLine("?", match.group(1), key.comment, True)
    for i, word in enumerate(text.split()):
        if word in KEY_TYPES:
            rest = text.split()[i + 1 : i + 2]
            try:
                key = PublicKey(word, rest[0], "")
                return GateLine(key.fingerprint, "", "", False)
            except (binascii.Error, ValueError, IndexError):
                break
    return GateLine("?", "", "", False)


def command_account(command: str) -> str | None:
    """The `--account` word of a forced command, or None when it has none."""
    words = command.split(" ")
    return words[-1] if len(words) >= 2 and words[-2] == "--account" else None


def _command_parts(command: str) -> tuple[str, str, str, str | None] | None:
    """(lnk, spec, folder, run dir) of a forced command the gate wrote, or None when the
    command is not of that form (then it is not the gate's to rewrite)."""
    words = command.split(" ")
    if command_account(command) is not None:
        words = words[:-2]
    if len(words) not in (7, 9) or words[1:3] != ["sandbox", "enter"]:
        return None
    if words[3] != "--spec" or words[5] != "--folder":
        return None
    if len(words) == 9 and words[7] != "--run-dir":
        return None
    return words[0], words[4], words[6], words[8] if len(words) == 9 else None


def bound_line(line: str, account: str) -> str | None:
    """The line again with its command bound to `account`, for a line the gate wrote without
    `--account` (`lnk box authorize --bind`); None for any other line, which stays as it is.
    Every path is checked again as when the line was first written."""
    match = _GATE_LINE.fullmatch(line.strip())
    if match is None or command_account(match.group(1)) is not None:
        return None
    parts = _command_parts(match.group(1))
    if parts is None:
        return None
    lnk, spec, folder, run_dir = parts
    key = PublicKey(match.group(2), match.group(3), match.group(4) or "")
    return key_line(key, forced_command(lnk, spec, folder, run_dir, account))


def check_folder(folder: str, protected: Sequence[tuple[str, str]]) -> None:
    """Refuse a session folder that is, holds or sits inside any protected place.

    `protected`: (real path, what it is) pairs: the box user's home (its dot files run at each
    login), /etc, the box's config, run and state dirs, the keys' folder, the spec itself."""
    for path, what in protected:
        if inside(folder, path):
            where = "is" if folder == path else "sits inside"
            raise FolderRefused(
                f"the folder {folder}",
                f"it {where} {path} ({what}), which a session must not write",
            )
        if inside(path, folder):
            raise FolderRefused(
                f"the folder {folder}", f"it holds {path} ({what}), which a session must not write"
            )
