"""The launch request a client sends on the launch socket, validated field by field.

Everything here comes from another process (any local user): each field is checked for type,
size and form before anything uses it, and unknown fields are refused.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

from lnk_shared import launch_protocol as protocol
from lnk_shared.env_names import MAX_ENV_VALUE_BYTES, env_name_problem
from lnk_shared.errors import FrameError
from lnk_shared.spec_flags import namespace_from_document

__all__ = ["ENV_ALLOWED", "LaunchRequest", "TerminalSize", "parse_launch_request"]

# The limits are the protocol's (lnk_shared.launch_protocol), where the clients read them too.
MAX_ARGS = protocol.MAX_ARGS
MAX_ARG_BYTES = protocol.MAX_ARG_BYTES
MAX_ENV_VALUE = protocol.MAX_ENV_VALUE
ENV_ALLOWED = re.compile(protocol.ENV_ALLOWED_PATTERN)
ENV_VALUE = re.compile(protocol.ENV_VALUE_PATTERN)
AGENT_NAME = re.compile(protocol.AGENT_NAME_PATTERN)  # `lnk agent start NAME`: the caller's


def _bad(field: str, problem: str) -> FrameError:
    return FrameError(problem, frame=protocol.LAUNCH, field=field)


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


def _str(value: Any, field: str, limit: int = protocol.MAX_TEXT, item: str = "") -> str:
    """`value` (the field, or the `item` of it) is a string without NUL within `limit`."""
    if not isinstance(value, str) or "\x00" in value or len(value) > limit:
        said = f"{item} " if item else ""
        raise _bad(field, f"{said}must be a string without NUL, at most {limit} characters")
    return value


def _index(value: Any, field: str, count: int, item: str = "") -> int:
    if type(value) is not int or not 0 <= value < count:
        said = f"{item} " if item else ""
        raise _bad(field, f"{said}must be the index of a passed descriptor")
    return value


def _agent(value: Any, dry_or_check: bool) -> str | None:
    if value is not None and (not isinstance(value, str) or not AGENT_NAME.fullmatch(value)):
        raise _bad("agent", "must be an agent's name")
    if value is not None and dry_or_check:
        raise _bad("agent", "is not for a launch that is dry or a check")
    return value


def parse_launch_request(
    untrusted: dict[str, Any], fd_count: int, *, unsafe_env_unfiltered: bool = False
) -> LaunchRequest:
    """Check every field of a launch request; raise FrameError naming the first bad field.

    `env` is the caller's terminal and locale only: any other name a client sends is dropped
    (a user's own variables come as `[env]` and `--env`, judged in the spec).
    `unsafe_env_unfiltered` (controller.toml's `unsafe_caller_env_unfiltered`, a test switch)
    keeps every well-formed name, so `lnk sandbox check` can be seen to report the leak."""
    protocol.launch_fields(untrusted)
    dry = untrusted.get("dry", False)
    if type(dry) is not bool:
        raise _bad("dry", "must be true or false")
    check = untrusted.get("check", False)
    if type(check) is not bool or (check and dry):
        raise _bad("check", "must be true or false, and not with dry")
    argv = untrusted.get("argv")
    if not isinstance(argv, list) or (not argv and not dry) or len(argv) > MAX_ARGS:
        raise _bad("argv", f"must be a list of 1 to {MAX_ARGS} strings")
    args = tuple(_str(a, "argv", MAX_ARG_BYTES, "(each argument)") for a in argv)
    cwd = _str(untrusted.get("cwd"), "cwd")
    if not cwd.startswith("/"):
        raise _bad("cwd", "must be absolute")
    path_env = _str(untrusted.get("path_env", ""), "path_env")
    flags_doc = untrusted.get("flags", {})
    if not isinstance(flags_doc, dict):
        raise _bad("flags", "must be an object")
    flags = namespace_from_document(flags_doc)
    env_doc = untrusted.get("env", {})
    if not isinstance(env_doc, dict):
        raise _bad("env", "must be an object")
    env: dict[str, str] = {}
    for key, value in env_doc.items():
        if unsafe_env_unfiltered and env_name_problem(str(key)) is None:
            env[str(key)] = _str(value, "env", MAX_ENV_VALUE_BYTES, "(a value)")
            continue
        if not ENV_ALLOWED.fullmatch(str(key)):
            continue  # only terminal and locale names pass; the rest never reach a sandbox
        text = _str(value, "env", MAX_ENV_VALUE, str(key))
        if ENV_VALUE.fullmatch(text):
            env[key] = text
    terminal = None
    term = untrusted.get("terminal")
    if term is not None:
        if not isinstance(term, dict) or set(term) != set(protocol.TERMINAL_FIELDS):
            raise _bad("terminal", "must be {rows, cols} or null")
        rows, cols = (term[name] for name in protocol.TERMINAL_FIELDS)
        most = protocol.MAX_TERMINAL
        if type(rows) is not int or type(cols) is not int or not (0 <= rows < most > cols >= 0):
            raise _bad("terminal", f"rows and cols must be integers below {most}")
        terminal = TerminalSize(rows, cols)
    yes = untrusted.get("yes", False)
    if type(yes) is not bool:
        raise _bad("yes", "must be true or false")
    fds = untrusted.get("fds")
    if not isinstance(fds, dict):
        raise _bad("fds", "must be an object")
    stdio = tuple(_index(fds.get(n), f"fds.{n}", fd_count) for n in protocol.STDIO)
    spec_fd = fds.get("spec")
    spec_index = None if spec_fd is None else _index(spec_fd, "fds.spec", fd_count)
    grants_doc = fds.get("grants", {})
    if not isinstance(grants_doc, dict):
        raise _bad("fds.grants", "must be an object")
    grants = {
        _str(path, "fds.grants", item="(a grant path)"): _index(
            i, "fds.grants", fd_count, "(a grant descriptor)"
        )
        for path, i in grants_doc.items()
    }
    with_doc = untrusted.get("with_fds", {})
    if not isinstance(with_doc, dict):
        raise _bad("with_fds", "must be an object")
    with_fds = {}
    for number, i in with_doc.items():
        if not (str(number).isascii() and str(number).isdigit()):
            raise _bad("with_fds", "keys must be descriptor numbers")
        with_fds[int(number)] = _index(i, "with_fds", fd_count, "(a with-fd descriptor)")
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
