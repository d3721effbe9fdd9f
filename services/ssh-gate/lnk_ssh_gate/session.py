"""What an SSH session asked for, mapped to what runs in its sandbox: pure functions, no I/O.

sshd runs a key's forced command with the client's request in `SSH_ORIGINAL_COMMAND`. That
string came from the key's holder: it is never split, parsed or run here, only handed to
`/bin/bash -c` *inside* the sandbox (or recognised, whole, as the sftp subsystem).

    unset                          -> /bin/bash -l          (a login shell; interactive on a pty)
    set, even empty                -> /bin/bash -c STRING   (scp -t/-f runs this way: `scp` in
                                                             the sandbox, if its [commands] lets it)
    the sftp subsystem, exactly    -> /usr/lib/openssh/sftp-server, the sandbox's own

The environment passed on is an allowlist of plain data (terminal type, locale); everything
else sshd sets (SSH_AUTH_SOCK, DISPLAY, SSH_CONNECTION, MAIL, ...) stays outside.

What this does NOT do: decide what the sandbox opens (the spec and the controller do), or
stop a command that the spec lets run from doing what the spec lets it do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from lnk_shared.errors import UsageError

__all__ = [
    "BASH",
    "ENV_NAMES",
    "MAX_COMMAND_BYTES",
    "SFTP_SERVER",
    "SFTP_SUBSYSTEM_COMMANDS",
    "SessionCommand",
    "SessionCommandRefused",
    "session_command",
    "session_env",
]

BASH = "/bin/bash"  # the seed: what the session asked for is run by /bin/bash inside
SFTP_SERVER = "/usr/lib/openssh/sftp-server"  # Debian's; bound read-only with the rest of /usr
# What sshd puts in SSH_ORIGINAL_COMMAND for `Subsystem sftp ...` on a key with a command.
SFTP_SUBSYSTEM_COMMANDS = frozenset({SFTP_SERVER, "internal-sftp"})
# A command a person types or scp sends is short; a longer one is a mistake or an attack on
# something's parser: refused whole rather than cut (the kernel's own limit is 128 KiB).
MAX_COMMAND_BYTES = 64 * 1024
# Passed in as data, nothing else: the terminal's type and the locale's names.
ENV_NAMES = re.compile(r"^(TERM|LANG|LANGUAGE|LC_[A-Z]+)$")
ENV_VALUE = re.compile(r"^[A-Za-z0-9_.:@+,=-]{0,64}$")  # names like xterm-256color, C.UTF-8


class SessionCommandRefused(UsageError):
    """The session's command cannot be passed to the sandbox as it is: nothing runs."""


@dataclass(frozen=True)
class SessionCommand:
    """The argv to run in the sandbox and what kind of session it is."""

    argv: tuple[str, ...]
    kind: str  # "shell", "command" or "sftp"


def session_command(untrusted_original: str | None) -> SessionCommand:
    """Map `SSH_ORIGINAL_COMMAND` (None when sshd did not set it) to what runs inside."""
    if untrusted_original is None:
        return SessionCommand((BASH, "-l"), "shell")
    try:
        size = len(untrusted_original.encode("utf-8"))
    except UnicodeEncodeError:
        raise SessionCommandRefused(
            "the session's command is not UTF-8 text: nothing was run"
        ) from None
    if size > MAX_COMMAND_BYTES:
        raise SessionCommandRefused(
            f"the session's command is {size} bytes, over the limit of {MAX_COMMAND_BYTES}: "
            "nothing was run"
        )
    if "\x00" in untrusted_original:
        raise SessionCommandRefused("the session's command holds a NUL byte: nothing was run")
    if untrusted_original in SFTP_SUBSYSTEM_COMMANDS:
        return SessionCommand((SFTP_SERVER,), "sftp")
    return SessionCommand((BASH, "-c", untrusted_original), "command")


def session_env(untrusted_environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that reach the sandbox: allowlisted names with plain values only; a
    value with anything else (a shell function, an escape sequence) is dropped, not cleaned."""
    return {
        name: value
        for name, value in untrusted_environ.items()
        if ENV_NAMES.fullmatch(name) and ENV_VALUE.fullmatch(value)
    }
