"""The folders on the owner's *login* PATH, and the well-known per-user bin folders: a sandbox
that may write one plants a program the owner's next shell runs first.

Judged from the profile files, not from the caller's current PATH and not by running the
owner's login shell: Debian's stock `~/.profile` puts `~/bin` and `~/.local/bin` on PATH only
*if they exist*, so the PATH of a shell run today lacks the very folder a grant would create and
the next login adds. Scanning the files finds every folder a PATH line names, whether its
condition holds today or not, and runs none of the owner's code on the controller's behalf.
`parse_path_folders` is the pure part; `login_path_dirs` reads the files every time and parses
a text it has parsed before from memory (keyed by the text itself, so an edited file is parsed
again): the parse was most of this module's ~1 ms per judged write.

What this does NOT do: follow a profile's `source`/`.` of another file, evaluate variables other
than HOME (a token naming another `$VAR` is skipped), or see PATH changes a program makes at
run time (a version manager's shims dir under a home dot folder is refused as a home dot
folder anyway). The well-known folders cover the usual installers whatever the profiles say.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Iterable

__all__ = [
    "MAX_MEMO_TEXT_CHARS",
    "PARSE_MEMO_ENTRIES",
    "PROFILE_FILES",
    "SYSTEM_PROFILE_FILES",
    "USER_BIN_DIRS",
    "login_path_dirs",
    "parse_path_folders",
]

# Where installers put per-user programs (relative to the home); each is on PATH for the owner
# or will be after the installer's next profile line. The dot ones are also home dot folders.
USER_BIN_DIRS = (
    "bin",  # Debian's ~/.profile, when it exists
    ".local/bin",  # Debian's ~/.profile, pip --user, pipx, uv tool
    ".cargo/bin",  # rustup
    "go/bin",  # go install
    ".npm-global/bin",  # npm's documented prefix for global installs
    ".deno/bin",
    ".bun/bin",
    ".yarn/bin",
    ".volta/bin",
    ".pyenv/bin",
    ".pyenv/shims",
    ".rbenv/shims",
    ".asdf/shims",
    ".local/share/mise/shims",
    ".nix-profile/bin",
    ".dotnet/tools",
    "perl5/bin",  # local::lib
)
# The owner's shell startup files (relative to the home) that set PATH for a login or a new
# interactive shell.
PROFILE_FILES = (
    ".profile",
    ".bash_profile",
    ".bash_login",
    ".bashrc",
    ".zshenv",
    ".zprofile",
    ".zshrc",
    ".zlogin",
    ".config/fish/config.fish",
    ".pam_environment",
)
SYSTEM_PROFILE_FILES = ("/etc/environment", "/etc/profile", "/etc/bash.bashrc", "/etc/zsh/zshenv")
SYSTEM_PROFILE_DIR = "/etc/profile.d"
MAX_PROFILE_BYTES = 256 * 1024  # startup files are a few KiB; a larger one is not read whole
MAX_PROFILE_D_FILES = 200  # /etc/profile.d holds a few dozen scripts on a usual system

# The parses kept: each owner's few profile texts and the system's (/etc/profile.d included).
PARSE_MEMO_ENTRIES = 256
# A text longer than this is parsed every time: the memo holds at most 256 x 16 KiB = 4 MiB
# of text, whatever an owner writes into their profile files.
MAX_MEMO_TEXT_CHARS = 16 * 1024

_MENTIONS_PATH = re.compile(r"\bPATH\b|fish_add_path|\bpath\s*(\+=|=\()")
_SPLIT = re.compile(r"""[\s:=;"'()\[\]`,]+""")
_HOME_VAR = re.compile(r"^(\$HOME|\$\{HOME\}|~)(?=/|$)")


def parse_path_folders(text: str, home: str) -> tuple[str, ...]:
    """Every absolute folder a line mentioning PATH names, `$HOME`, `${HOME}` and `~` expanded;
    a token holding any other variable, a glob or a relative name is skipped."""
    found: dict[str, None] = {}
    for line in text.splitlines():
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        if not _MENTIONS_PATH.search(code):
            continue
        for word in _SPLIT.split(code):
            token = _HOME_VAR.sub(home.rstrip("/") or "/", word)
            if not token.startswith("/") or any(c in token for c in "$*?"):
                continue
            found[os.path.normpath(token)] = None
    return tuple(found)


@functools.lru_cache(maxsize=PARSE_MEMO_ENTRIES)
def _parsed(text: str, home: str) -> tuple[str, ...]:
    return parse_path_folders(text, home)


def _folders_of(text: str, home: str) -> tuple[str, ...]:
    """`parse_path_folders`, from the memo for a text of a usual profile's size."""
    if len(text) > MAX_MEMO_TEXT_CHARS:
        return parse_path_folders(text, home)
    return _parsed(text, home)


def _read_small(path: str, owners: Iterable[int]) -> str:
    """The text of a regular file owned by one of `owners` (links followed: dotfile managers
    link them), or "" when it is missing, another's, or too large to be a profile."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in set(owners):
            return ""
        return os.read(fd, MAX_PROFILE_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def login_path_dirs(uid: int, home: str) -> tuple[str, ...]:
    """The well-known per-user bin folders under `home` and every folder the owner's and the
    system's profile files put on PATH (read as root or as the owner: only files owned by the
    owner under the home, by root under /etc, so nothing the owner cannot see is judged)."""
    folders = [os.path.join(home, d) for d in USER_BIN_DIRS]
    texts = [_read_small(os.path.join(home, f), (uid,)) for f in PROFILE_FILES]
    system = list(SYSTEM_PROFILE_FILES)
    try:
        entries = sorted(os.listdir(SYSTEM_PROFILE_DIR))[:MAX_PROFILE_D_FILES]
        system += [os.path.join(SYSTEM_PROFILE_DIR, e) for e in entries if e.endswith(".sh")]
    except OSError:
        pass
    texts += [_read_small(path, (0,)) for path in system]
    for text in texts:
        folders += _folders_of(text, home)
    return tuple(dict.fromkeys(folders))
