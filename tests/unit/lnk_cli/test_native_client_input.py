"""What the caller gives the C `lnk` client (lnk_cli/native/lnk_client.c) is read as the Python
client reads it: an environment with a name given twice, a closed stdio descriptor, any bytes in
argv and the environment, and `--env` in each form (the ones the C path does not take are the
Python CLI's answer).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from native_launch import (
    FAST,
    Controller,
    Word,
    answer_with,
    client_env,
    exit_frame,
    python_client,
    run_client,
    sent_as_python_sends,
)

# Exec argv[2:] with the environment's entries exactly as listed in argv[1] (a JSON list): an
# environment with a name given twice, which no mapping (subprocess's env=) can spell.
EXEC_WITH_ENTRIES = """
import ctypes, json, sys
entries = [e.encode() for e in json.loads(sys.argv[1])] + [None]
argv = [a.encode() for a in sys.argv[2:]] + [None]
libc = ctypes.CDLL(None, use_errno=True)
strings = lambda items: (ctypes.c_char_p * len(items))(*items)
libc.execve(argv[0], strings(argv), strings(entries))
sys.exit(f"execve: {ctypes.get_errno()}")
"""


def test_a_name_given_twice_in_the_environment_is_read_as_python_reads_it(
    native_client: Path, controller: Controller
) -> None:
    env = client_env(controller)
    entries = [f"{k}={v}" for k, v in env.items()]
    entries += ["LC_ALL=first", "LC_ALL=second", "PATH=/second", "TERM", "LANG=second"]
    sent = []
    for program in ([str(native_client)], [str(w) for w in python_client()]):
        controller.serve(answer_with(controller, exit_frame(0)))
        words = ["sandbox", "run", "--", "true"]
        helper = [sys.executable, "-c", EXEC_WITH_ENTRIES, json.dumps(entries)]
        ran = run_client([*helper, *program], words, {}, cwd="/")
        assert ran.returncode == 0, ran.stderr
        sent.append(controller.check())
    native, python = sent
    assert native.exe == str(native_client)
    assert native.raw == python.raw
    assert native.message["env"] == {"LANG": "C.UTF-8", "LC_ALL": "first"}
    assert native.message["path_env"] == "/usr/bin:/bin"


@pytest.mark.parametrize("closed", [0, 1, 2])
def test_a_closed_stdio_descriptor_is_passed_as_dev_null_not_the_socket(
    native_client: Path, controller: Controller, closed: int
) -> None:
    controller.serve(answer_with(controller, exit_frame(0)))
    close = f'exec "$0" "$@" {closed}>&-'  # the shell execs the client without it
    argv = ["/bin/sh", "-c", close, str(native_client), "sandbox", "run", "--", "true"]
    ran = run_client(argv, [], client_env(controller))
    launch = controller.check()
    assert ran.returncode == 0, ran.stderr
    assert launch.exe == str(native_client)
    assert os.path.samestat(launch.stats[closed], os.stat("/dev/null"))


@FAST
@given(
    st.lists(st.binary(min_size=0, max_size=12).filter(lambda b: b"\x00" not in b), max_size=4),
    st.binary(min_size=0, max_size=12).filter(lambda b: b"\x00" not in b),
)
def test_any_bytes_in_argv_and_env_read_as_python_reads_them(
    native_client: Path, controller: Controller, args: list[bytes], value: bytes
) -> None:
    controller.serve(answer_with(controller, exit_frame(0)))
    env = client_env(controller, {"LC_X": value})
    ran = run_client([native_client], ["sandbox", "run", "--", "p", *args], env, cwd="/")
    assert ran.returncode == 0, ran.stderr
    request = controller.check().message
    controller.launches.clear()
    assert request["argv"] == ["p", *(os.fsdecode(a) for a in args)]
    assert request["env"] == {"LANG": "C.UTF-8", "LC_X": os.fsdecode(value)}


# --- --env ------------------------------------------------------------------------------------

ENV_WORDS: list[list[Word]] = [
    ["--env", "E2E_KEY", "--", "true"],
    ["--yes", "--env=MODE=ci", "--", "true"],
    ["--env", "A=1", "--spec=spec.toml", "--env=E2E_KEY", "--env", "B=", "--yes", "--", "ls"],
    ["--env", "E2E_KEY=given wins", "--env", "E2E_KEY", "--", "true"],
    ["--env", "ODD", "--env", b"RAW=\xff\xfe", "--env=ü=ü", "--", "true"],
    ["--env", "LD_PRELOAD=/x.so", "--env", "=nameless", "--", "true"],  # judged by the controller
]


@pytest.mark.parametrize("words", ENV_WORDS)
def test_env_is_the_python_clients_byte_for_byte_and_carries_only_what_it_names(
    native_client: Path, controller: Controller, words: list[Word], odd_cwd: bytes
) -> None:
    """`--env NAME` and `--env NAME=VALUE` on the C path: the request is the Python CLI's
    (which reads --env in full: spec_flags.flags_document), byte for byte; a bare NAME carries
    the caller's value, and nothing else of the environment goes."""
    env = {
        **client_env(controller),
        "E2E_KEY": "k-1",
        "E2E_UNNAMED": "stays-out",
        "ODD": b"\xff odd \xe2\x82",
    }
    native = sent_as_python_sends(native_client, controller, words, env, odd_cwd)
    assert b"stays-out" not in native.raw
    given = native.message["flags"]["env"]
    assert isinstance(given, list) and len(given) == words.count("--env") + sum(
        1 for w in words if isinstance(w, str) and w.startswith("--env=")
    )
    if words[:2] == ["--env", "E2E_KEY"]:
        assert given == ["E2E_KEY=k-1"]


@pytest.mark.parametrize(
    "words",
    [
        ["--env", "E2E_NOT_SET", "--", "true"],  # the Python CLI's "not set" refusal
        ["--env=", "--", "true"],
        ["--en", "E2E_KEY", "--", "true"],  # an abbreviation argparse takes
    ],
)
def test_an_env_form_the_c_path_does_not_take_is_the_python_clis(
    native_client: Path, controller: Controller, words: list[str], tmp_path: Path
) -> None:
    env = {**client_env(controller), "E2E_KEY": "k-1"}
    out = {}
    for name, program in (("native", [native_client]), ("python", python_client())):
        controller.serve(answer_with(controller, exit_frame(0)))
        ran = run_client(program, ["sandbox", "run", *words], env, cwd=tmp_path)
        out[name] = (ran.returncode, ran.stdout, ran.stderr)
        if ran.returncode == 0:
            launch = controller.check()
            assert os.path.basename(launch.exe).startswith("python")
    assert out["native"] == out["python"]
