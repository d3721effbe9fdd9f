"""Which environment variables a spec or `--env` may give a sandbox: pure decisions, no I/O.

A sandbox starts with the box's own environment (`--clearenv`, then an explicit list). A user
adds to it with `[env]` in a spec (names and plain values, written in the file) or `--env NAME`
(the caller's value) and `--env NAME=VALUE` on the command line. This module judges each name and
value; `env_composition` puts them together with the box's own.

Refused, each with its reason (`refusal_reason`):
- **What the loader and libc read in every program** (glibc's `UNSECURE_ENVVARS`,
  sysdeps/generic/unsecvars.h: what it drops before a set-id program runs, and every `LD_*`):
  they make a granted program map other code (`LD_PRELOAD`, `LD_AUDIT`, `LD_LIBRARY_PATH`,
  `GCONV_PATH`), parse other data as it starts (`LOCPATH`, `NLSPATH`, `TZDIR`,
  `GLIBC_TUNABLES`: CVE-2023-4911 ran code through its parser) or resolve names elsewhere.
- **What shells run before the command** (`BASH_ENV`, `ENV`, `BASH_FUNC_*` exported functions,
  `SHELLOPTS`/`BASHOPTS` with `PS4`'s command substitution, `PROMPT_COMMAND`, `IFS`, `CDPATH`,
  `GLOBIGNORE`): a granted shell would run code no argument named.
- **The box's own** (`HOME`, `PATH`, `USER`, `LOGNAME`, `SHELL`, `TMPDIR`, every `*_PROXY` in
  either case, `NODE_USE_ENV_PROXY`, `JAVA_TOOL_OPTIONS`, git's proxy and ssh commands,
  `BROWSER`, `TELEGRAM_BOT_TOKEN`, every `LNK_*`): the box sets them after the user's, so one
  given would silently not hold; refusing says so before anything starts.

Allowed: everything else, interpreters' search paths and options included (`PYTHONPATH`,
`NODE_PATH`, `NODE_OPTIONS`, `PERL5LIB`): they act only in a program that is an interpreter,
which a finite `[commands]` list grants to run whatever code it can read.

Security limitations: this does NOT stop a granted program from setting any variable for the
programs it starts itself (a shell can `export LD_PRELOAD=...`); what those children may map or
run is the wall's (Landlock `EXECUTE`, `noexec` writable places, the ELF loader's mounts). A
value is not judged beyond its size and NUL: a key is a key. Names are judged as bytes are
written: `LD_PRELOAD` and `ld_preload` are different variables to the loader, which reads only
the first; proxies' names are matched in either case because clients read both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from lnk_shared.display import shown
from lnk_shared.errors import UsageError

__all__ = [
    "MAX_ENV_ENTRIES",
    "MAX_ENV_NAME_CHARS",
    "MAX_ENV_TOTAL_BYTES",
    "MAX_ENV_VALUE_BYTES",
    "REFUSED_NAMES",
    "REFUSED_PREFIXES",
    "check_env_entries",
    "env_flags",
    "env_name_problem",
    "env_value_problem",
    "refusal_reason",
    "split_env_flag",
]

MAX_ENV_NAME_CHARS = 128  # far past any real variable's name; keeps every message short
# One value: a key, a token or a search path. The kernel takes at most 128 KiB per string
# (MAX_ARG_STRLEN) for NAME=VALUE; a quarter of it leaves room and is past any real key.
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_ENV_ENTRIES = 64  # variables a spec and its flags add, together
# Together: argv and the environment share a quarter of the stack limit (2 MiB at 8 MiB);
# the user's variables take at most an eighth of it, the program's argv keeps the rest.
MAX_ENV_TOTAL_BYTES = 256 * 1024

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # POSIX's portable names: what shells export

_LOADER = "the dynamic loader or libc reads it in every program (glibc drops it for set-id ones)"
_SHELL = "a shell runs code from it before the command"
_BOX = "the box sets it for every sandbox"

REFUSED_NAMES: dict[str, str] = {
    # glibc's UNSECURE_ENVVARS (sysdeps/generic/unsecvars.h), besides LD_*
    "GCONV_PATH": f"iconv loads shared objects from the folders it names: {_LOADER}",
    "GETCONF_DIR": f"getconf runs the programs it finds there: {_LOADER}",
    "GLIBC_TUNABLES": f"it changes malloc and the loader as a program starts: {_LOADER}",
    "HOSTALIASES": f"it changes what names resolve to: {_LOADER}",
    "LOCALDOMAIN": f"it changes what names resolve to: {_LOADER}",
    "RES_OPTIONS": f"it changes the resolver's options: {_LOADER}",
    "RESOLV_HOST_CONF": f"it names the resolver's host file: {_LOADER}",
    "LOCPATH": f"locale data is parsed from where it points: {_LOADER}",
    "NLSPATH": f"message catalogues are parsed from where it points: {_LOADER}",
    "TZDIR": f"time zone files are parsed from where it points: {_LOADER}",
    "MALLOC_TRACE": f"malloc writes a trace to the file it names: {_LOADER}",
    "NIS_PATH": f"it changes where NIS+ looks names up: {_LOADER}",
    "TMPDIR": "the sandbox's /tmp is its own private folder, which the box sets "
    "(glibc drops it for set-id programs too)",
    # shells
    "BASH_ENV": f"bash sources the file it names before a script: {_SHELL}",
    "ENV": f"sh, dash and bash in POSIX mode source the file it names: {_SHELL}",
    "SHELLOPTS": f"it turns on bash options as bash starts (xtrace runs PS4): {_SHELL}",
    "BASHOPTS": f"it turns on bash options as bash starts: {_SHELL}",
    "PS4": f"bash expands it, command substitution included, under xtrace: {_SHELL}",
    "PROMPT_COMMAND": f"bash runs it before each prompt: {_SHELL}",
    "IFS": "it changes how a shell splits every word of a script",
    "CDPATH": "it changes where a script's `cd` goes",
    "GLOBIGNORE": "it changes what a script's patterns match",
    # the box's own
    "HOME": f"{_BOX}: the sandbox's private home (an agent's folder for an agent)",
    "PATH": f"{_BOX}: the programs the sandbox finds are the box's to place",
    "USER": f"{_BOX}: the sandbox's own user",
    "LOGNAME": f"{_BOX}: the sandbox's own user",
    "SHELL": f"{_BOX}",
    "BROWSER": f"{_BOX}: pages open through the box's own opener",
    "NODE_USE_ENV_PROXY": f"{_BOX}: Node's fetch uses the sandbox's proxy",
    "JAVA_TOOL_OPTIONS": f"{_BOX}: Java's proxy settings (and it loads agents into the JVM)",
    "GIT_PROXY_COMMAND": f"{_BOX}: git's way out is the sandbox's proxy (and git runs it)",
    "GIT_SSH": f"{_BOX}: git's way out is the sandbox's proxy (and git runs it)",
    "GIT_SSH_COMMAND": f"{_BOX}: git's way out is the sandbox's proxy (and git runs it)",
    "TELEGRAM_BOT_TOKEN": f"{_BOX}: a [[services]] rule's placeholder",
}

REFUSED_PREFIXES: tuple[tuple[str, str], ...] = (
    ("LD_", f"the dynamic loader reads every LD_ variable: {_LOADER}"),
    ("BASH_FUNC_", f"bash defines an exported function from it as it starts: {_SHELL}"),
    ("LNK_", f"{_BOX}: LNK_ names are the box's own"),
)

_PROXY_SUFFIX = "_PROXY"  # HTTP_PROXY, https_proxy, ALL_PROXY, NO_PROXY, GRPC_PROXY, ...


def refusal_reason(name: str) -> str | None:
    """Why `name` may not be given to a sandbox, or None when it may."""
    if name in REFUSED_NAMES:
        return REFUSED_NAMES[name]
    for prefix, why in REFUSED_PREFIXES:
        if name.startswith(prefix):
            return why
    if name.upper().endswith(_PROXY_SUFFIX):
        return f"{_BOX}: a sandbox's proxy is the box's own (its one way out)"
    return None


def env_name_problem(name: str) -> str | None:
    """What is wrong with `name` as a variable's name (its form, not its meaning), or None."""
    if not name:
        return "an empty name"
    if len(name) > MAX_ENV_NAME_CHARS:
        return f"a name longer than {MAX_ENV_NAME_CHARS} characters"
    if not ENV_NAME.fullmatch(name):
        return "a name of letters, digits and _ only, not starting with a digit"
    return None


def env_value_problem(value: str) -> str | None:
    """What is wrong with a value (never quoting it: it may be a key), or None."""
    if "\x00" in value:
        return "a value with a NUL character (no environment can hold one)"
    if len(value.encode("utf-8", "surrogateescape")) > MAX_ENV_VALUE_BYTES:
        return f"a value longer than {MAX_ENV_VALUE_BYTES} bytes"
    return None


def split_env_flag(text: str) -> tuple[str, str | None]:
    """`--env NAME=VALUE` -> (NAME, VALUE); `--env NAME` -> (NAME, None): the caller's value."""
    name, sep, value = text.partition("=")
    return name, (value if sep else None)


def check_env_entries(entries: dict[str, str]) -> None:
    """ValueError naming the first entry over a limit; the entries' forms are checked apart."""
    if len(entries) > MAX_ENV_ENTRIES:
        raise ValueError(f"more than {MAX_ENV_ENTRIES} variables")
    total = sum(len(f"{k}={v}".encode("utf-8", "surrogateescape")) + 1 for k, v in entries.items())
    if total > MAX_ENV_TOTAL_BYTES:
        raise ValueError(f"the variables take more than {MAX_ENV_TOTAL_BYTES} bytes together")


def env_flags(texts: list[str], environ: Mapping[str, str]) -> list[str]:
    """Each `--env` as NAME=VALUE, a bare NAME given the caller's value from `environ` (the
    client's own environment, never the controller's). UsageError for a NAME not set there."""
    out = []
    for text in texts:
        name, value = split_env_flag(str(text))
        if value is None:
            if name not in environ:
                said = shown(name[:MAX_ENV_NAME_CHARS])
                raise UsageError(
                    f"--env {said}: not set in your environment; export it first, or give "
                    f"--env {said}=VALUE"
                )
            value = environ[name]
        out.append(f"{name}={value}")
    return out
