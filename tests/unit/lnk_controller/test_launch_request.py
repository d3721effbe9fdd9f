"""The launch request: every field comes from another local user, so each hostile shape is
refused with a message naming the field, and only terminal and locale variables pass."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from lnk_controller.launch_request import (
    MAX_ARG_BYTES,
    MAX_ARGS,
    MAX_ENV_VALUE,
    LaunchRequest,
    TerminalSize,
    parse_launch_request,
)
from lnk_shared.spec_flags import FLAG_NAMES, flags_document

FD_COUNT = 6
DELETE = object()


def valid() -> dict[str, Any]:
    return {
        "type": "launch",
        "argv": ["python3", "-c", "print('hi')"],
        "cwd": "/home/owner/project",
        "path_env": "/usr/local/bin:/usr/bin:/bin",
        "flags": {"read": ["/srv/data"], "write": ["out"], "network_mode": None},
        "env": {"TERM": "xterm-256color", "LANG": "C.UTF-8"},
        "terminal": {"rows": 24, "cols": 80},
        "yes": False,
        "fds": {
            "stdin": 0,
            "stdout": 1,
            "stderr": 2,
            "spec": 3,
            "grants": {"/srv/data": 4},
        },
        "with_fds": {"7": 5},
    }


def hostile(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A valid request with the field at `path` set to `value` (or removed, for DELETE)."""
    request = valid()
    holder = request
    for key in path[:-1]:
        holder = holder[key]
    if value is DELETE:
        del holder[path[-1]]
    else:
        holder[path[-1]] = copy.deepcopy(value)
    return request


def test_a_valid_request_round_trips() -> None:
    request = parse_launch_request(valid(), FD_COUNT)
    assert request == LaunchRequest(
        argv=("python3", "-c", "print('hi')"),
        cwd="/home/owner/project",
        path_env="/usr/local/bin:/usr/bin:/bin",
        flags=request.flags,
        env={"TERM": "xterm-256color", "LANG": "C.UTF-8"},
        terminal=TerminalSize(rows=24, cols=80),
        yes=False,
        dry=False,
        stdio=(0, 1, 2),
        spec_fd=3,
        grant_fds={"/srv/data": 4},
        with_fds={7: 5},
    )
    expected_flags: dict[str, object] = {name: [] for name in FLAG_NAMES} | {
        "read": ["/srv/data"],
        "write": ["out"],
        "network_mode": None,
    }
    assert flags_document(request.flags) == expected_flags
    assert request.flags.spec is None  # a spec file path never comes from the client


def test_optional_fields_have_safe_defaults() -> None:
    minimal = {"argv": ["true"], "cwd": "/", "fds": {"stdin": 0, "stdout": 0, "stderr": 0}}
    request = parse_launch_request(minimal, 1)
    assert request.env == {}
    assert request.terminal is None
    assert request.yes is False
    assert request.spec_fd is None
    assert request.grant_fds == {}
    assert request.with_fds == {}
    assert flags_document(request.flags) == {
        n: None if n == "network_mode" else [] for n in FLAG_NAMES
    }


HOSTILE = [
    # unknown fields
    (("uid",), 0, "unknown fields.*uid"),
    (("env_override",), {"LD_PRELOAD": "/x.so"}, "unknown fields.*env_override"),
    # argv
    (("argv",), DELETE, "argv"),
    (("argv",), "python3 -c evil", "argv"),
    (("argv",), {"0": "python3"}, "argv"),
    (("argv",), [], "argv"),
    (("argv",), ["true"] * (MAX_ARGS + 1), "argv"),
    (("argv",), ["python3", "a\x00b"], "argument"),
    (("argv",), ["python3", 1], "argument"),
    (("argv",), [None], "argument"),
    (("argv",), ["python3", ["nested"]], "argument"),
    (("argv",), ["python3", "a" * (MAX_ARG_BYTES + 1)], "argument"),
    # cwd
    (("cwd",), DELETE, "cwd"),
    (("cwd",), "project", "cwd"),
    (("cwd",), "./project", "cwd"),
    (("cwd",), "", "cwd"),
    (("cwd",), 5, "cwd"),
    (("cwd",), "/home/\x00/x", "cwd"),
    (("path_env",), ["/usr/bin"], "path_env"),
    # flags
    (("flags",), ["--read", "/"], "flags"),
    (("flags",), {"read": ["/srv"], "exec": ["/"]}, "flags.*exec"),
    (("flags",), {"read": "/etc"}, "read"),
    (("flags",), {"write": ["/ok", 1]}, "write"),
    (("flags",), {"internet_host": [None]}, "internet_host"),
    (("flags",), {"with_fd": {"3": "write"}}, "with_fd"),
    (("flags",), {"network_mode": "bridge"}, "network_mode"),
    (("flags",), {"network_mode": ["host"]}, "network_mode"),
    # env (only its shape: bad names are dropped, see below)
    (("env",), ["TERM=xterm"], "env"),
    (("env",), {"TERM": 5}, "env TERM"),
    (("env",), {"TERM": None}, "env TERM"),
    (("env",), {"LANG": "C" * (MAX_ENV_VALUE + 1)}, "env LANG"),
    (("env",), {"TERM": "xterm\x00"}, "env TERM"),
    # terminal
    (("terminal",), [24, 80], "terminal"),
    (("terminal",), {"rows": 24}, "terminal"),
    (("terminal",), {"rows": 24, "cols": 80, "xpixel": 0}, "terminal"),
    (("terminal",), {"rows": "24", "cols": 80}, "terminal"),
    (("terminal",), {"rows": 24, "cols": 80.0}, "terminal"),
    (("terminal",), {"rows": True, "cols": 80}, "terminal"),
    (("terminal",), {"rows": -1, "cols": 80}, "terminal"),
    (("terminal",), {"rows": 24, "cols": 10_000}, "terminal"),
    (("terminal",), {"rows": 2**64, "cols": 80}, "terminal"),
    # yes
    (("yes",), "yes", "yes"),
    (("yes",), 1, "yes"),
    (("yes",), None, "yes"),
    (("yes",), "false", "yes"),
    # fds
    (("fds",), DELETE, "fds"),
    (("fds",), [0, 1, 2], "fds"),
    (("fds", "stdin"), DELETE, "fds.stdin"),
    (("fds", "stdin"), FD_COUNT, "fds.stdin"),
    (("fds", "stdout"), -1, "fds.stdout"),
    (("fds", "stderr"), True, "fds.stderr"),
    (("fds", "stdin"), False, "fds.stdin"),  # False == 0, but it is not a descriptor index
    (("fds", "stdin"), "0", "fds.stdin"),
    (("fds", "stdout"), 1.0, "fds.stdout"),
    (("fds", "spec"), FD_COUNT, "fds.spec"),
    (("fds", "spec"), True, "fds.spec"),
    (("fds", "grants"), ["/srv/data"], "fds.grants"),
    (("fds", "grants"), {"/srv/data": FD_COUNT}, "grant"),
    (("fds", "grants"), {"/srv/data": -1}, "grant"),
    (("fds", "grants"), {"/srv/data": True}, "grant"),
    # with_fds
    (("with_fds",), [[7, 5]], "with_fds"),
    (("with_fds",), {"seven": 5}, "with_fds"),
    (("with_fds",), {"-1": 5}, "with_fds"),
    (("with_fds",), {"": 5}, "with_fds"),
    (("with_fds",), {"²": 5}, "with_fds"),  # str.isdigit() says yes, int() says no
    (("with_fds",), {"7": FD_COUNT}, "with-fd"),
    (("with_fds",), {"7": False}, "with-fd"),
]


@pytest.mark.parametrize(
    ("path", "value", "names"),
    HOSTILE,
    ids=[f"{'.'.join(p)}={str(v)[:30]!r}" for p, v, _ in HOSTILE],
)
def test_hostile_field_is_refused_naming_it(path: tuple[str, ...], value: Any, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        parse_launch_request(hostile(path, value), FD_COUNT)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("TERM", "xterm-256color"),
        ("LANG", "C.UTF-8"),
        ("LANGUAGE", "en_US:en"),
        ("COLORTERM", "truecolor"),
        ("LC_ALL", "en_US.UTF-8"),
        ("LC_CTYPE", "C"),
        ("TERM", ""),
    ],
)
def test_terminal_and_locale_variables_pass(key: str, value: str) -> None:
    request = parse_launch_request(hostile(("env",), {key: value}), FD_COUNT)
    assert request.env == {key: value}


@pytest.mark.parametrize(
    "key",
    [
        "SSH_AUTH_SOCK",  # the owner's ssh agent
        "LD_PRELOAD",  # code into every program
        "LD_LIBRARY_PATH",
        "DISPLAY",  # the owner's X server
        "WAYLAND_DISPLAY",
        "XAUTHORITY",
        "DBUS_SESSION_BUS_ADDRESS",
        "BASH_ENV",
        "PYTHONPATH",
        "PATH",  # the sandbox's own PATH is set by the controller
        "HOME",
        "term",
        "LC_",
        "LC_all",
        "XLC_ALL",
        "LANG ",
        "TERM\n",  # `$` in a Python regex also matches before a final newline
        "LANG\x00",
        "TERM=xterm",
    ],
)
def test_other_variables_are_dropped_silently(key: str) -> None:
    request = parse_launch_request(hostile(("env",), {key: "C", "LANG": "C"}), FD_COUNT)
    assert request.env == {"LANG": "C"}


def test_dropped_variables_are_not_checked_for_type() -> None:
    request = parse_launch_request(hostile(("env",), {"LD_PRELOAD": 5}), FD_COUNT)
    assert request.env == {}


@pytest.mark.parametrize(
    "value",
    [
        "xterm\x1b]0;pwned\x07",  # terminal escape: retitles or worse
        "xterm\n",  # `$` in a Python regex also matches before a final newline
        "xterm\r",
        "a\tb",
        "x\x7f",
        "x\x9b31m",  # the 8-bit CSI
        "xterm\u2028",
        "xterm;id",
        "$(id)",
        "a b",
        "en_US.UTF-8\nLD_PRELOAD=/tmp/x.so",
    ],
)
def test_variable_values_with_control_or_shell_characters_are_dropped(value: str) -> None:
    request = parse_launch_request(hostile(("env",), {"TERM": value, "LANG": "C"}), FD_COUNT)
    assert request.env == {"LANG": "C"}


@pytest.mark.parametrize("fd_count", [0, 2])
def test_no_descriptors_means_no_valid_stdio(fd_count: int) -> None:
    with pytest.raises(ValueError, match=r"fds\.stdin"):
        parse_launch_request(hostile(("fds", "stdin"), 2), fd_count)


def test_a_check_request_is_marked_and_is_never_also_dry() -> None:
    assert parse_launch_request(valid(), FD_COUNT).check is False
    assert parse_launch_request(hostile(("check",), True), FD_COUNT).check is True
    both = hostile(("check",), True) | {"dry": True}
    with pytest.raises(ValueError, match="check"):
        parse_launch_request(both, FD_COUNT)
    with pytest.raises(ValueError, match="check"):
        parse_launch_request(hostile(("check",), "yes"), FD_COUNT)


def test_the_unsafe_switch_keeps_every_well_formed_name_and_only_then() -> None:
    """controller.toml's unsafe_caller_env_unfiltered, for `lnk sandbox check` to report."""
    sent = {"LNK_CHECK_CALLER_AB": "bait", "LANG": "C", "bad name": "x"}
    assert parse_launch_request(hostile(("env",), sent), FD_COUNT).env == {"LANG": "C"}
    request = parse_launch_request(hostile(("env",), sent), FD_COUNT, unsafe_env_unfiltered=True)
    assert request.env == {"LNK_CHECK_CALLER_AB": "bait", "LANG": "C"}


def test_env_flags_travel_as_a_list_of_name_value_strings() -> None:
    doc = valid()
    doc["flags"]["env"] = ["API_KEY=k", "MODE=x"]
    assert parse_launch_request(doc, FD_COUNT).flags.env == ["API_KEY=k", "MODE=x"]
    doc["flags"]["env"] = {"API_KEY": "k"}
    with pytest.raises(ValueError, match="env must be a list of strings"):
        parse_launch_request(doc, FD_COUNT)


def test_the_fields_it_reads_are_the_protocols_launch_frame_fields() -> None:
    """Every field parse_launch_request reads is the definition's, and it reads them all."""
    import inspect
    import re

    from lnk_controller import launch_request
    from lnk_shared import launch_protocol

    source = inspect.getsource(launch_request.parse_launch_request)
    read = set(re.findall(r'untrusted\.get\("(\w+)"', source))
    assert read == set(launch_protocol.FIELDS[launch_protocol.LAUNCH])
    fds = set(re.findall(r'fds\.get\("(\w+)"', source)) | set(launch_protocol.STDIO)
    assert fds == set(launch_protocol.LAUNCH_FDS_FIELDS)
