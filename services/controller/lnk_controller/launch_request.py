"""The launch request a client sends on the launch socket, validated field by field.

Everything here comes from another process (any local user): each field is checked for type,
size and form before anything uses it, and unknown fields are refused.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

from lnk_shared.env_names import MAX_ENV_VALUE_BYTES, env_name_problem
from lnk_shared.spec_flags import namespace_from_document

__all__ = ["ENV_ALLOWED", "LaunchRequest", "TerminalSize", "parse_launch_request"]

MAX_ARGS = 4096  # arguments to the sandboxed program
MAX_ARG_BYTES = 128 * 1024  # one argument (the kernel's MAX_ARG_STRLEN)
MAX_ENV_VALUE = 256  # TERM, LANG and LC_* values are short names
ENV_ALLOWED = re.compile(r"^(TERM|LANG|LANGUAGE|COLORTERM|LC_[A-Z]+)$")
ENV_VALUE = re.compile(r"^[A-Za-z0-9_.:@+,=-]*$")
_FIELDS = {
    "type",
    "argv",
    "dry",
    "check",
    "cwd",
    "path_env",
    "flags",
    "env",
    "terminal",
    "yes",
    "fds",
    "with_fds",
    "agent",
}
AGENT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")  # `lnk agent start NAME`: the caller's agent


@dataclass(frozen=True)
class TerminalSize:
    rows: int
    cols: int


@dataclass(frozen=True)
class LaunchRequest:
    argv: tuple[str, ...]
    cwd: str
    path_env: str
    flags: argparse.Namespace
    env: dict[str, str]
    terminal: TerminalSize | None
    yes: bool
    dry: bool  # judge and approve only; run nothing (`lnk spec approve`)
    stdio: tuple[int, int, int]  # indexes into the descriptors received
    spec_fd: int | None
    grant_fds: dict[str, int]  # real path -> index of an O_PATH descriptor the owner opened
    with_fds: dict[int, int]  # the caller's fd number -> index of the descriptor received
    # `lnk sandbox check`: argv is the probe's arguments; the controller runs its own probe
    # program in the sandbox the spec makes, without asking or remembering the spec.
    check: bool = False
    agent: str | None = None  # run as this agent of the caller's (its home, key and bridge)


def _str(value: Any, what: str, limit: int = 4096) -> str:
    if not isinstance(value, str) or "\x00" in value or len(value) > limit:
        raise ValueError(f"{what} must be a string without NUL, at most {limit} characters")
    return value


def _index(value: Any, what: str, count: int) -> int:
    if type(value) is not int or not 0 <= value < count:
        raise ValueError(f"{what} must be the index of a passed descriptor")
    return value


def _agent(value: Any, dry_or_check: bool) -> str | None:
    if value is not None and (not isinstance(value, str) or not AGENT_NAME.fullmatch(value)):
        raise ValueError("agent must be an agent's name")
    if value is not None and dry_or_check:
        raise ValueError("an agent's launch is neither dry nor a check")
    return value


def parse_launch_request(
    untrusted: dict[str, Any], fd_count: int, *, unsafe_env_unfiltered: bool = False
) -> LaunchRequest:
    """Check every field of a launch request; raise ValueError naming the first bad one.

    `env` is the caller's terminal and locale only: any other name a client sends is dropped
    (a user's own variables come as `[env]` and `--env`, judged in the spec).
    `unsafe_env_unfiltered` (controller.toml's `unsafe_caller_env_unfiltered`, a test switch)
    keeps every well-formed name, so `lnk sandbox check` can be seen to report the leak."""
    unknown = set(untrusted) - _FIELDS
    if unknown:
        raise ValueError(f"unknown fields: {sorted(unknown)}")
    dry = untrusted.get("dry", False)
    if type(dry) is not bool:
        raise ValueError("dry must be true or false")
    check = untrusted.get("check", False)
    if type(check) is not bool or (check and dry):
        raise ValueError("check must be true or false, and not with dry")
    argv = untrusted.get("argv")
    if not isinstance(argv, list) or (not argv and not dry) or len(argv) > MAX_ARGS:
        raise ValueError(f"argv must be a list of 1 to {MAX_ARGS} strings")
    args = tuple(_str(a, "each argument", MAX_ARG_BYTES) for a in argv)
    cwd = _str(untrusted.get("cwd"), "cwd")
    if not cwd.startswith("/"):
        raise ValueError("cwd must be absolute")
    path_env = _str(untrusted.get("path_env", ""), "path_env")
    flags_doc = untrusted.get("flags", {})
    if not isinstance(flags_doc, dict):
        raise ValueError("flags must be an object")
    flags = namespace_from_document(flags_doc)
    env_doc = untrusted.get("env", {})
    if not isinstance(env_doc, dict):
        raise ValueError("env must be an object")
    env: dict[str, str] = {}
    for key, value in env_doc.items():
        if unsafe_env_unfiltered and env_name_problem(str(key)) is None:
            env[str(key)] = _str(value, "an env value", MAX_ENV_VALUE_BYTES)
            continue
        if not ENV_ALLOWED.fullmatch(str(key)):
            continue  # only terminal and locale names pass; the rest never reach a sandbox
        text = _str(value, f"env {key}", MAX_ENV_VALUE)
        if ENV_VALUE.fullmatch(text):
            env[key] = text
    terminal = None
    term = untrusted.get("terminal")
    if term is not None:
        if not isinstance(term, dict) or set(term) != {"rows", "cols"}:
            raise ValueError("terminal must be {rows, cols} or null")
        rows, cols = term["rows"], term["cols"]
        if type(rows) is not int or type(cols) is not int or not (0 <= rows < 10000 > cols >= 0):
            raise ValueError("terminal rows and cols must be small integers")
        terminal = TerminalSize(rows, cols)
    yes = untrusted.get("yes", False)
    if type(yes) is not bool:
        raise ValueError("yes must be true or false")
    fds = untrusted.get("fds")
    if not isinstance(fds, dict):
        raise ValueError("fds must be an object")
    stdio = tuple(_index(fds.get(n), f"fds.{n}", fd_count) for n in ("stdin", "stdout", "stderr"))
    spec_fd = fds.get("spec")
    spec_index = None if spec_fd is None else _index(spec_fd, "fds.spec", fd_count)
    grants_doc = fds.get("grants", {})
    if not isinstance(grants_doc, dict):
        raise ValueError("fds.grants must be an object")
    grants = {
        _str(path, "a grant path"): _index(i, "a grant descriptor", fd_count)
        for path, i in grants_doc.items()
    }
    with_doc = untrusted.get("with_fds", {})
    if not isinstance(with_doc, dict):
        raise ValueError("with_fds must be an object")
    with_fds = {}
    for number, i in with_doc.items():
        if not (str(number).isascii() and str(number).isdigit()):
            raise ValueError("with_fds keys must be descriptor numbers")
        with_fds[int(number)] = _index(i, "a with-fd descriptor", fd_count)
    return LaunchRequest(
        agent=_agent(untrusted.get("agent"), dry or check),
        argv=args,
        cwd=cwd,
        path_env=path_env,
        flags=flags,
        env=env,
        terminal=terminal,
        yes=yes,
        dry=dry,
        stdio=(stdio[0], stdio[1], stdio[2]),
        spec_fd=spec_index,
        grant_fds=grants,
        with_fds=with_fds,
        check=check,
    )
