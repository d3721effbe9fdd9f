"""The `lnk` command in C (lnk_cli/native/lnk_client.c): the quick path of `lnk sandbox run` sends
the request the Python quick path sends, byte for byte, answers the controller as it does (same
messages, same exit codes), refuses bad frames cleanly, forwards signals, and execs the Python
CLI for everything else. The Python client runs beside it against the same fake controller
(conftest.py), so "the same" is checked, not assumed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import termios
import threading
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lnk_cli.launch_dialogue import no_flags
from lnk_shared import launch_protocol as protocol
from lnk_shared.errors import EXIT_ERROR, EXIT_RUN_ERROR, EXIT_RUN_REFUSED
from lnk_shared.frames import MAX_FDS, MAX_FRAME

Controller = Any  # conftest.Controller: the fake controller on a real launch socket
Launch = Any  # conftest.Launch: what a client sent first, and who it was
TIMEOUT_S = 10.0
PYTHON_MAIN = "from lnk_cli.__main__ import main; main()"
FAST = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
Word = str | bytes


def _env(controller: Controller, extra: dict[Word, Word] | None = None) -> dict[Word, Word]:
    """A small environment. LANG is set: under a C locale (or none) Python adds LC_CTYPE=C.UTF-8
    to its own environment (PEP 538), so its client would send one the caller never had."""
    env: dict[Word, Word] = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LNK_RUN_DIR": str(controller.run_dir),
    }
    if "PYTHONPATH" in os.environ:  # scripts/dev-pytest: the checkout's sources
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return {**env, **(extra or {})}


def _run(
    program: list[Word],
    words: list[Word],
    env: dict[Word, Word],
    cwd: Path | bytes | None = None,
    **kw: object,
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*program, *words],
        env=env,
        cwd=cwd,
        stdin=kw.pop("stdin", subprocess.DEVNULL),
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
        **kw,  # type: ignore[arg-type]
    )


def _python() -> list[Word]:
    return [sys.executable, "-P", "-c", PYTHON_MAIN]


def _exit(status: int) -> dict[str, object]:
    return {"type": "exit", "status": status}


def _answer(controller: Controller, *frames: dict[str, object] | bytes | None) -> object:
    """A script: send each frame after the request (None: read one from the client)."""

    def script(conn: socket.socket, _launch: Launch) -> None:
        for frame in frames:
            if frame is None:
                controller.read_frame(conn)
            else:
                controller.write_frame(conn, frame, [])

    return script


# --- the request ------------------------------------------------------------------------------

ODD = [
    "a b",
    "q\"uo'te",
    "back\\slash",
    "new\nline\ttab\r\x01\x7f",
    "ünï 🙂 \u2028",
    "",
    "--",
    "--yes",
    b"\xff\xfe raw",
    b"\xed\xa0\x80 surrogate bytes",
    b"\xc0\xaf overlong",
    b"\xf4\x90\x80\x80 past U+10FFFF",
    b"\xe2\x82 cut \xf0\x9f\x99",
    b"\xc3",
]
REQUESTS: list[tuple[list[Word], dict[Word, Word]]] = [
    (["--yes", "--", "/bin/true"], {}),
    (["--", "prog", *ODD], {}),
    (["--spec", "spec.toml", "--", "ls"], {}),
    (["--spec=spec.toml", "--yes", "--", "ls", "-l"], {}),
    (["--yes", "--spec", "", "--", "ls"], {}),  # an empty spec is none, as in Python
    (
        ["--yes", "--", "/bin/true"],
        {
            "TERM": "xterm-256color",
            "LANG": "C.UTF-8",
            "LC_ALL": "de_DE.UTF-8",
            "LC_ODD": b"\xff\xfe \xe2\x82\xac",
            b"LC_\xff": "x",
            "SECRET_TOKEN": "must not pass",
            "TERMINFO": "/nope",
            "LANGUAGE": "de",
            "XLC_NOT": "x",
            "LNK_RUN_DIR_X": "y",
        },
    ),
]


@pytest.fixture
def odd_cwd(tmp_path: Path) -> bytes:
    folder = bytes(tmp_path) + "/wörk dir \"'\\".encode() + b"\xff"
    os.mkdir(folder)
    Path(os.fsdecode(folder), "spec.toml").write_text("# read by the controller, not here\n")
    return folder


def _sent_as_python_sends(
    native_client: Path,
    controller: Controller,
    words: list[Word],
    env: dict[Word, Word],
    cwd: bytes,
) -> Launch:
    """`sandbox run WORDS` from each client: the C path's request, once it is the Python
    client's byte for byte."""
    sent: dict[str, Launch] = {}
    for name, program in (("native", [native_client]), ("python", _python())):
        controller.serve(_answer(controller, _exit(0)))
        ran = _run(program, ["sandbox", "run", *words], env, cwd=cwd)
        assert ran.returncode == 0, ran.stderr
        sent[name] = controller.check()
    native, python = sent["native"], sent["python"]
    assert native.exe == str(native_client)  # the C path answered, not an exec'd Python
    assert native.raw == python.raw
    return native


@pytest.mark.parametrize(("words", "extra_env"), REQUESTS)
def test_the_request_is_the_python_clients_byte_for_byte(
    native_client: Path,
    controller: Controller,
    odd_cwd: bytes,
    words: list[Word],
    extra_env: dict[Word, Word],
) -> None:
    env = _env(controller, extra_env)
    native = _sent_as_python_sends(native_client, controller, words, env, odd_cwd)
    # And what it says, spelled out: launch_request's fields for this cwd and environment.
    request = native.message
    command = words[words.index("--") + 1 :]
    assert request["argv"] == [os.fsdecode(w) for w in command]
    assert request["cwd"] == os.fsdecode(odd_cwd)
    assert request["path_env"] == "/usr/bin:/bin"
    assert request["flags"] == no_flags()
    passed = {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
    assert request["env"] == {
        k: v for k, v in passed.items() if k in ("TERM", "LANG") or k.startswith("LC_")
    }
    spec = "spec.toml" in words or "--spec=spec.toml" in words
    assert request["fds"] == {"stdin": 0, "stdout": 1, "stderr": 2, **({"spec": 3} if spec else {})}
    assert request["yes"] is ("--yes" in words[: words.index("--")])
    assert len(native.stats) == (4 if spec else 3)
    assert os.path.samestat(native.stats[0], os.stat("/dev/null"))
    if spec:
        spec_file = os.path.join(os.fsdecode(odd_cwd), "spec.toml")
        assert os.path.samestat(native.stats[3], os.stat(spec_file))
        assert native.blocking[3] is False  # O_NONBLOCK: a FIFO cannot hang the controller


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
    env = _env(controller)
    entries = [f"{k}={v}" for k, v in env.items()]
    entries += ["LC_ALL=first", "LC_ALL=second", "PATH=/second", "TERM", "LANG=second"]
    sent = []
    for program in ([str(native_client)], [str(w) for w in _python()]):
        controller.serve(_answer(controller, _exit(0)))
        words = ["sandbox", "run", "--", "true"]
        helper = [sys.executable, "-c", EXEC_WITH_ENTRIES, json.dumps(entries)]
        ran = _run([*helper, *program], words, {}, cwd="/")
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
    controller.serve(_answer(controller, _exit(0)))
    close = f'exec "$0" "$@" {closed}>&-'  # the shell execs the client without it
    argv = ["/bin/sh", "-c", close, str(native_client), "sandbox", "run", "--", "true"]
    ran = _run(argv, [], _env(controller))
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
    controller.serve(_answer(controller, _exit(0)))
    env = _env(controller, {"LC_X": value})
    ran = _run([native_client], ["sandbox", "run", "--", "p", *args], env, cwd="/")
    assert ran.returncode == 0, ran.stderr
    request = controller.check().message
    controller.launches.clear()
    assert request["argv"] == ["p", *(os.fsdecode(a) for a in args)]
    assert request["env"] == {"LANG": "C.UTF-8", "LC_X": os.fsdecode(value)}


# --- the dialogue: the same answers as the Python client ----------------------------------

BAD_STATUS = (
    b"lnk: the controller sent a bad frame (an exit status that is not 0-255); see its log\n"
)
SAME_AS_PYTHON = {
    "exit 0": ([_exit(0)], 0, b""),
    "exit 3": ([_exit(3)], 3, b""),
    "exit 137": ([_exit(137)], 137, b""),
    # the controller sends 128+N for a signal: -9 was read as 247, now refused as no status
    "exit -9": ([_exit(-9)], EXIT_RUN_ERROR, BAD_STATUS),
    "exit not a number": ([{"type": "exit", "status": "7"}], EXIT_RUN_ERROR, BAD_STATUS),
    "started then exit": ([{"type": "started", "id": "s1"}, _exit(5)], 5, b""),
    "exit at a limit": (
        [
            {"type": "started", "id": "s1", "limits": "64 processes, 512 MiB memory"},
            {"type": "exit", "status": 137, "message": "the sandbox reached its memory limit"},
        ],
        137,
        b"lnk: the sandbox reached its memory limit\n",
    ),
    "exit at a limit, escapes": (
        [{"type": "exit", "status": 0, "message": "\ud800 \x00."}],
        0,
        b"lnk: \\ud800 \x00.\n",
    ),
    "error": (
        [{"type": "error", "exit": 3, "run_exit": 126, "message": "refused [launch]: no Landlock"}],
        EXIT_RUN_REFUSED,
        b"lnk: refused [launch]: no Landlock\n",
    ),
    "error without a code": (
        [{"type": "error", "exit": 1, "message": "gone"}],
        EXIT_RUN_ERROR,
        b"lnk: gone\n",
    ),
    "error, a run's code only": ([{"type": "error", "run_exit": 127, "message": "x"}], 127, b"x"),
    "error, a number for message": (
        [{"type": "error", "exit": 1, "run_exit": 4, "message": 42}],
        4,
        b"lnk: 42",
    ),
    "error with escapes": (
        [{"type": "error", "run_exit": 4, "message": '🙂 é \ud800x \udcff "q" / \\ \x00.'}],
        4,
        'lnk: 🙂 é \\ud800x \\udcff "q" / \\ \x00.\n'.encode(),
    ),
    "approve?": (
        [{"type": "approve?", "lines": ["opens:", "  read \udcff", 5, None], "hash": "h"}],
        EXIT_RUN_REFUSED,
        b"opens:\n  read \\udcff\n5\nNone\nlnk: not approved: there is no terminal to ask on",
    ),
    "approved (dry)": (
        [{"type": "approved", "hash": "0123456789abcdefXYZ", "already": True}],
        0,
        b"",
    ),
    "unknown type": (
        [{"type": "bogus"}],
        EXIT_RUN_ERROR,
        b"unexpected answer from the controller: 'bogus'",
    ),
    "no type": ([{"status": 0}], EXIT_RUN_ERROR, b"unexpected answer from the controller: None"),
    "a type quoting": (
        [{"type": "it's\n\x85é"}],
        EXIT_RUN_ERROR,
        b'controller: "it\'s\\n\\x85\xc3\xa9"\n',
    ),
    "a type not a string": (
        [{"type": [1, True, {"a": None}]}],
        EXIT_RUN_ERROR,
        b"controller: [1, True, {'a': None}]\n",
    ),
    "error after started": (
        [{"type": "started", "id": "s"}, {"type": "error", "exit": 2, "message": "m"}],
        EXIT_RUN_ERROR,
        b"lnk: m\n",
    ),
    "EOF at once": (
        [],
        EXIT_RUN_ERROR,
        b"lnk: the controller ended the launch without an answer (the peer closed the "
        b"connection); see its log\n",
    ),
    "EOF after started": ([{"type": "started", "id": "s"}], EXIT_RUN_ERROR, b"without an answer"),
    "open, not a list": (
        [{"type": "open", "paths": "/etc"}],
        EXIT_RUN_ERROR,
        b"lnk: the controller asked to open something that is not a list of paths\n",
    ),
    "open, unreachable": (
        [{"type": "open", "paths": ["/", "/nonexistent/x"]}],
        EXIT_RUN_ERROR,
        b"lnk: cannot open /nonexistent/x: No such file or directory\n",
    ),
    "open, a path not a string": (
        [{"type": "open", "paths": ["/", 5]}],
        EXIT_RUN_ERROR,
        b"lnk: the controller asked to open something that is not a list of paths\n",
    ),
    "open, no paths": (
        [{"type": "open"}],
        EXIT_RUN_ERROR,
        b"lnk: the controller asked to open something that is not a list of paths\n",
    ),
    "approve?, lines not a list": (
        [{"type": "approve?", "lines": "ab", "hash": "h"}],
        EXIT_RUN_REFUSED,
        b"lnk: not approved: there is no terminal to ask on",
    ),
    "approved, fields of other types": (
        [{"type": "approved", "hash": 12345, "already": "yes"}],
        0,
        b"already approved: 12345\n",
    ),
    "started, fields of other types": (
        [{"type": "started", "id": 5, "limits": [1]}, _exit(4)],
        4,
        b"",
    ),
    "exit, no status": ([{"type": "exit"}], EXIT_RUN_ERROR, BAD_STATUS),
    "exit, a message not a string": (
        [{"type": "exit", "status": 3, "message": None}],
        3,
        b"lnk: None\n",
    ),
    "error, no fields": ([{"type": "error"}], EXIT_RUN_ERROR, b"lnk: None\n"),
    # A note: the controller wrote it on the program's stderr before the program started;
    # neither client prints it again (nor does an old one, which does not know the field).
    "started with a note": (
        [{"type": "started", "id": "s", "note": "lnk: note: \x1b[31m not shown"}, _exit(0)],
        0,
        b"",
    ),
    "started, a note not a string": (
        [{"type": "started", "id": "s", "note": {"a": [1]}}, _exit(3)],
        3,
        b"",
    ),
    # A status that is not one a process has: refused, never passed on (256 reads as 0).
    "exit, 256": ([_exit(256)], EXIT_RUN_ERROR, BAD_STATUS),
    "exit, past 32 bits": ([_exit(2**40)], EXIT_RUN_ERROR, BAD_STATUS),
    "exit, 255": ([_exit(255)], 255, b""),
}


@pytest.mark.parametrize("case", list(SAME_AS_PYTHON))
def test_each_answer_ends_as_the_python_client_ends(
    native_client: Path, controller: Controller, case: str
) -> None:
    frames, status, said = SAME_AS_PYTHON[case]
    results = []
    for program in ([native_client], _python()):
        controller.serve(_answer(controller, *frames))
        ran = _run(program, ["sandbox", "run", "--yes", "--", "true"], _env(controller))
        controller.check()
        results.append((ran.returncode, ran.stdout, ran.stderr))
    native, python = results
    assert native == python
    assert native[0] == status
    assert said in native[1] + native[2]


def test_open_passes_o_path_descriptors_of_exactly_those_paths(
    native_client: Path, controller: Controller, tmp_path: Path
) -> None:
    folder, file = tmp_path / "project", tmp_path / "tool"
    folder.mkdir()
    file.write_text("#!/bin/sh\n")
    odd = bytes(tmp_path) + b"/odd \xff\xfe dir"
    os.mkdir(odd)
    paths = [str(folder), str(file), os.fsdecode(odd), str(folder)]  # a repeat, as a dict does
    answers: dict[str, tuple[bytes, list[tuple[int, int, int]]]] = {}

    def script(conn: socket.socket, _launch: Launch) -> None:
        controller.write_frame(conn, {"type": "open", "paths": paths}, [])
        raw, fds = controller.read_frame(conn)
        try:
            described = [(os.fstat(fd).st_dev, os.fstat(fd).st_ino, _flags(fd)) for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)
        answers[threading.current_thread().name] = (raw, described)
        controller.write_frame(conn, _exit(0), [])

    results = []
    for program in ([native_client], _python()):
        answers.clear()
        controller.serve(script)
        ran = _run(program, ["sandbox", "run", "--yes", "--", "true"], _env(controller))
        assert ran.returncode == 0, ran.stderr
        controller.check()
        results.append(next(iter(answers.values())))
    (raw, described), (python_raw, _) = results
    assert raw == python_raw
    opened = json.loads(raw)
    assert opened == {"type": "opened", "grants": {paths[0]: 3, paths[1]: 1, paths[2]: 2}}
    assert set(opened["grants"]) == set(paths)  # the controller's own check
    for path, (dev, ino, flags) in zip(paths, described, strict=True):
        info = os.stat(os.fsencode(path))
        assert (dev, ino) == (info.st_dev, info.st_ino)
        assert flags & os.O_PATH


def _flags(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)


# --- frames no controller should send: a clean error, no crash, no hang ----------------------

NESTED_32 = b'{"type":"exit","status":6,"x":' + b"[" * 31 + b"]" * 31 + b"}"
BAD_FRAMES = {
    "not JSON": (b'{"type":', "not JSON"),
    "an unclosed object": (b'{"type":"exit"', "an object without its '}'"),
    "an unclosed array": (b'{"type":["exit"}', "an array without its ']'"),
    "a duplicate key": (b'{"type":"exit","status":0,"type":"exit"}', "a duplicate key"),
    "a float": (b'{"type":"exit","status":1.0}', "not an integer"),
    "an exponent": (b'{"type":"exit","status":1e3}', "not an integer"),
    "NaN": (b'{"type":"exit","status":NaN}', "not JSON"),
    "an integer past 64 bits": (b'{"type":"exit","status":99999999999999999999}', "64 bits"),
    "a leading zero": (b'{"type":"exit","status":01}', "leading zero"),
    "too deep": (b'{"type":"exit","x":' + b"[" * 32 + b"]" * 32 + b"}", "nested too deep"),
    "trailing bytes": (b'{"type":"exit","status":0} ', "bytes after"),
    "leading space": (b' {"type":"exit","status":0}', "not a JSON object"),
    "an array": (b"[1]", "not a JSON object"),
    "not UTF-8": (b'{"type":"\xff"}', "not UTF-8"),
    "UTF-8 of a surrogate": (b'{"type":"\xed\xa0\x80"}', "not UTF-8"),
    "a control character": (b'{"type":"a\nb"}', "control character"),
    "a bad escape": (b'{"type":"\\x41"}', "invalid escape"),
    "a short \\u": (b'{"type":"\\u12"}', "invalid escape"),
    "an unclosed string": (b'{"type":"exit', "closing quote"),
    "a key not a string": (b"{1:2}", "key that is not a string"),
    "a trailing comma": (b'{"type":"exit",}', "key that is not a string"),
    "a missing colon": (b'{"type" "exit"}', "without ':'"),
}


@pytest.mark.parametrize("case", list(BAD_FRAMES))
def test_a_bad_frame_is_a_clean_error(
    native_client: Path, controller: Controller, case: str
) -> None:
    body, why = BAD_FRAMES[case]
    controller.serve(_answer(controller, body))
    ran = _run([native_client], ["sandbox", "run", "--", "true"], _env(controller))
    controller.check()
    assert ran.returncode == EXIT_RUN_ERROR
    assert ran.stderr.startswith(b"lnk: the controller sent a bad frame (")
    assert why.encode() in ran.stderr


@pytest.mark.parametrize("case", list(BAD_FRAMES))
def test_a_bad_frame_is_a_clean_error_from_the_python_client_too(
    native_client: Path, controller: Controller, case: str
) -> None:
    """The same refusal in the Python client: one line naming a bad frame, never "an error lnk
    did not expect" (a ValueError, or the scanner's SystemError) nor a traceback."""
    body, _why = BAD_FRAMES[case]
    controller.serve(_answer(controller, body))
    ran = _run(_python(), ["sandbox", "run", "--", "true"], _env(controller))
    controller.check()
    assert ran.returncode == EXIT_RUN_ERROR
    assert ran.stderr.startswith(b"lnk: the controller sent a bad frame ("), ran.stderr
    assert ran.stderr.endswith(b"); see its log\n") and ran.stderr.count(b"\n") == 1


def test_32_levels_deep_is_still_read(native_client: Path, controller: Controller) -> None:
    controller.serve(_answer(controller, NESTED_32))
    ran = _run([native_client], ["sandbox", "run", "--", "true"], _env(controller))
    controller.check()
    assert (ran.returncode, ran.stderr) == (6, b"")


def test_an_oversized_frame_is_refused_without_waiting_for_it(
    native_client: Path, controller: Controller
) -> None:
    done = threading.Event()

    def script(conn: socket.socket, _launch: Launch) -> None:
        conn.sendall((MAX_FRAME + 1).to_bytes(4, "big"))  # and nothing more, connection open
        done.wait(TIMEOUT_S)

    controller.serve(script)
    try:
        ran = _run([native_client], ["sandbox", "run", "--", "true"], _env(controller))
    finally:
        done.set()
    controller.check()
    assert ran.returncode == EXIT_RUN_ERROR
    assert b"frame of 1048577 bytes is over the limit of 1048576" in ran.stderr


def test_a_frame_cut_short_is_the_eof_error(native_client: Path, controller: Controller) -> None:
    def script(conn: socket.socket, _launch: Launch) -> None:
        conn.sendall((100).to_bytes(4, "big") + b'{"type":')

    controller.serve(script)
    ran = _run([native_client], ["sandbox", "run", "--", "true"], _env(controller))
    controller.check()
    assert ran.returncode == EXIT_RUN_ERROR
    assert b"without an answer (the peer closed the connection)" in ran.stderr


def test_too_many_descriptors_are_refused_and_closed(
    native_client: Path, controller: Controller
) -> None:
    def script(conn: socket.socket, _launch: Launch) -> None:
        fd = os.open("/dev/null", os.O_RDONLY)
        # The client may be gone after the first byte (the descriptors'): the rest may not go.
        try:
            with suppress(BrokenPipeError, ConnectionResetError):
                controller.write_frame(conn, _exit(0), [fd] * (MAX_FDS + 1))
        finally:
            os.close(fd)

    controller.serve(script)
    ran = _run([native_client], ["sandbox", "run", "--", "true"], _env(controller))
    controller.check()
    assert ran.returncode == EXIT_RUN_ERROR
    assert b"too many descriptors in one frame" in ran.stderr


@FAST
@given(st.binary(max_size=200))
def test_any_bytes_as_a_frame_end_the_client_cleanly(
    native_client: Path, controller: Controller, body: bytes
) -> None:
    controller.serve(_answer(controller, body))
    ran = _run([native_client], ["sandbox", "run", "--", "true"], _env(controller))
    controller.check()
    controller.launches.clear()
    assert ran.returncode >= 0  # not killed: no overflow became a crash or an abort
    assert ran.returncode == EXIT_RUN_ERROR or ran.stderr == b""


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63) + 1, 2**63 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@FAST
@given(JSON)
def test_any_json_message_is_printed_as_python_prints_it(
    native_client: Path, controller: Controller, said: object
) -> None:
    frame = {"type": "error", "exit": 1, "run_exit": 9, "message": said}
    controller.serve(_answer(controller, frame))
    ran = _run([native_client], ["sandbox", "run", "--", "true"], _env(controller))
    controller.check()
    controller.launches.clear()
    assert ran.returncode == 9
    if isinstance(said, str):  # str(said) on stderr, errors="backslashreplace"
        assert ran.stderr == f"lnk: {said}\n".encode("utf-8", "backslashreplace")
    else:
        assert ran.stderr.startswith(b"lnk: ")


# --- signals ----------------------------------------------------------------------------------


def _signal_script(
    controller: Controller,
    started: threading.Event,
    got: list[object],
    before: threading.Event | None,
) -> object:
    def script(conn: socket.socket, _launch: Launch) -> None:
        if before is not None:  # the test signals the client while the sandbox "starts"
            before.wait(TIMEOUT_S)
        controller.write_frame(conn, {"type": "started", "id": "s1"}, [])
        started.set()
        raw, _fds = controller.read_frame(conn)
        got.append(json.loads(raw))
        controller.write_frame(conn, _exit(7), [])

    return script


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_after_started_goes_to_the_program(
    native_client: Path, controller: Controller, number: int
) -> None:
    started, got = threading.Event(), []
    controller.serve(_signal_script(controller, started, got, None))
    with subprocess.Popen(
        [native_client, "sandbox", "run", "--", "sleep", "9"],
        env=_env(controller),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    ) as client:
        assert started.wait(TIMEOUT_S)
        client.send_signal(number)
        assert client.wait(TIMEOUT_S) == 7
        assert client.stderr is not None and client.stderr.read() == b""
    controller.check()
    assert got == [{"type": "signal", "signal": number}]


def test_a_signal_while_the_sandbox_starts_is_held_then_forwarded(
    native_client: Path, controller: Controller
) -> None:
    started, got, signalled = threading.Event(), [], threading.Event()
    launched = threading.Event()

    def script(conn: socket.socket, launch: Launch) -> None:
        launched.set()
        _signal_script(controller, started, got, signalled)(conn, launch)

    controller.serve(script)
    with subprocess.Popen(
        [native_client, "sandbox", "run", "--", "sleep", "9"],
        env=_env(controller),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    ) as client:
        assert launched.wait(TIMEOUT_S)  # the request was sent: the signals are held
        client.send_signal(signal.SIGINT)
        signalled.set()
        assert client.wait(TIMEOUT_S) == 7
        assert client.stderr is not None and client.stderr.read() == b""
    controller.check()
    assert got == [{"type": "signal", "signal": signal.SIGINT}]


def _signal_frame_sent(controller: Controller, program: list[Word], number: int) -> bytes:
    """The frame `program` sends when it gets signal `number` after "started"."""
    started, raw = threading.Event(), []

    def script(conn: socket.socket, _launch: Launch) -> None:
        controller.write_frame(conn, protocol.started_frame("s1", "none"), [])
        started.set()
        frame, fds = controller.read_frame(conn)
        for fd in fds:
            os.close(fd)
        raw.append(frame)
        controller.write_frame(conn, _exit(7), [])

    controller.serve(script)
    with subprocess.Popen(
        [*program, "sandbox", "run", "--", "sleep", "9"],
        env=_env(controller),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    ) as client:
        assert started.wait(TIMEOUT_S)
        client.send_signal(number)  # held until the client forwards it (both hold them)
        assert client.wait(TIMEOUT_S) == 7
    controller.check()
    assert len(raw) == 1
    return raw[0]


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGQUIT])
def test_a_signal_frame_is_the_python_clients_byte_for_byte(
    native_client: Path, controller: Controller, number: int
) -> None:
    native = _signal_frame_sent(controller, [native_client], number)
    python = _signal_frame_sent(controller, _python(), number)
    assert native == python
    assert json.loads(native) == protocol.signal_frame(number)


# --- parity, keyed to the protocol's frames ---------------------------------------------------

# Each frame a client sends, and the test above that holds the C client's to the Python one's
# byte for byte.
SENT_THE_SAME = {
    protocol.LAUNCH: test_the_request_is_the_python_clients_byte_for_byte,
    protocol.OPENED: test_open_passes_o_path_descriptors_of_exactly_those_paths,
    protocol.SIGNAL: test_a_signal_frame_is_the_python_clients_byte_for_byte,
}
# The C client never sends these: it runs only without a terminal, where the question cannot
# be asked; it refuses as the Python client does (SAME_AS_PYTHON's "approve?").
NEVER_SENT_BY_THE_C_CLIENT = {protocol.APPROVE, protocol.DECLINE}
# Each frame the controller sends, and the SAME_AS_PYTHON cases that answer with it malformed
# (a field missing or of another type): both clients read each the same way.
MALFORMED = {
    protocol.APPROVE_QUESTION: ["approve?", "approve?, lines not a list"],
    protocol.OPEN: ["open, not a list", "open, a path not a string", "open, no paths"],
    protocol.APPROVED: ["approved, fields of other types"],
    protocol.STARTED: ["started, fields of other types"],
    protocol.EXIT: ["exit not a number", "exit, no status", "exit, a message not a string"],
    protocol.ERROR: [
        "error without a code",
        "error, a run's code only",
        "error, a number for message",
        "error, no fields",
    ],
}


def test_every_frame_of_the_protocol_is_held_to_parity_between_the_clients() -> None:
    assert set(SENT_THE_SAME) | NEVER_SENT_BY_THE_C_CLIENT == set(protocol.CLIENT_FRAMES)
    assert not set(SENT_THE_SAME) & NEVER_SENT_BY_THE_C_CLIENT
    assert set(MALFORMED) == set(protocol.SERVER_FRAMES)
    for kind, cases in MALFORMED.items():
        assert cases, kind
        for case in cases:
            frames, _status, _said = SAME_AS_PYTHON[case]
            assert kind in [frame.get(protocol.TYPE) for frame in frames], case
    answered = [
        frame.get(protocol.TYPE) for frames, _, _ in SAME_AS_PYTHON.values() for frame in frames
    ]
    assert all(kind in answered for kind in protocol.SERVER_FRAMES)  # each well-formed too


# --- everything else: the Python CLI ----------------------------------------------------------


@pytest.mark.parametrize(
    "words",
    [
        ["--version"],
        ["--help"],
        ["sandbox", "run", "--help"],
        ["sandbox", "list"],
        ["sandbox", "run", "--spec", "-x", "--", "true"],  # argparse's usage error
        ["sandbox", "run", "--yes", "--"],  # no program
    ],
)
def test_other_words_get_the_python_clis_answer(
    native_client: Path, controller: Controller, words: list[str]
) -> None:
    env = _env(controller, {"LNK_STATE_DIR": str(controller.run_dir / "state")})
    native = _run([native_client], list(words), env)
    python = _run(_python(), list(words), env)
    assert (native.returncode, native.stdout, native.stderr) == (
        python.returncode,
        python.stdout,
        python.stderr,
    )
    assert native.stdout or native.stderr


@pytest.mark.parametrize(
    "words",
    [
        ["sandbox", "run", "--read", ".", "--", "true"],  # a spec flag
        ["sandbox", "run", "--ye", "--", "true"],  # an abbreviation argparse takes
    ],
)
def test_a_form_that_is_not_plain_is_the_python_clients(
    native_client: Path, controller: Controller, words: list[str], tmp_path: Path
) -> None:
    controller.serve(_answer(controller, _exit(0)))
    ran = _run([native_client], words, _env(controller), cwd=tmp_path)
    launch = controller.check()
    assert ran.returncode == 0, ran.stderr
    assert os.path.basename(launch.exe).startswith("python")


@pytest.mark.parametrize("terminal_on", ["stdin", "stdout", "both"])
def test_a_terminal_sends_it_to_the_python_client(
    native_client: Path, controller: Controller, terminal_on: str
) -> None:
    primary, secondary = os.openpty()
    try:
        controller.serve(_answer(controller, _exit(0)))
        streams = {
            "stdin": secondary if terminal_on in ("stdin", "both") else subprocess.DEVNULL,
            "stdout": secondary if terminal_on in ("stdout", "both") else subprocess.PIPE,
        }
        ran = subprocess.run(
            [native_client, "sandbox", "run", "--yes", "--", "true"],
            env=_env(controller, {"TERM": "dumb"}),
            stderr=subprocess.PIPE,
            timeout=TIMEOUT_S,
            check=False,
            **streams,  # type: ignore[arg-type]
        )
        launch = controller.check()
    finally:
        os.close(primary)
        os.close(secondary)
    assert ran.returncode == 0, ran.stderr
    assert os.path.basename(launch.exe).startswith("python")
    # Only with both a terminal does Python relay one (the C path never does).
    assert (launch.message["terminal"] is not None) is (terminal_on == "both")


def test_a_lnk_cli_folder_in_the_callers_folder_is_not_imported(
    native_client: Path, tmp_path: Path
) -> None:
    planted = tmp_path / "lnk_cli"
    planted.mkdir()
    marker = tmp_path / "imported"
    code = f"open({str(marker)!r}, 'w').close()\nprint('planted')\n"
    (planted / "__init__.py").write_text(code)
    (planted / "__main__.py").write_text("def main():\n    print('planted main')\n")
    env: dict[Word, Word] = {"PATH": "/usr/bin:/bin"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    ran = _run([native_client], ["--version"], env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(b"lnk ")
    assert b"planted" not in ran.stdout
    assert not marker.exists()


def test_without_a_python_beside_it_the_fallback_says_so(
    native_client: Path, tmp_path: Path
) -> None:
    alone = tmp_path / "lnk"
    alone.write_bytes(native_client.read_bytes())
    alone.chmod(0o755)
    ran = _run([alone], ["--version"], {"PATH": "/usr/bin:/bin"})
    assert ran.returncode == 1
    expected = f"lnk: cannot run the Python CLI ({tmp_path}/python3): No such file or directory\n"
    assert ran.stderr == expected.encode()


def test_without_a_python_beside_it_a_run_fails_with_a_runs_status(
    native_client: Path, tmp_path: Path
) -> None:
    alone = tmp_path / "lnk"
    alone.write_bytes(native_client.read_bytes())
    alone.chmod(0o755)
    for words, status in (
        (["sandbox", "run", "--read", ".", "--", "true"], EXIT_RUN_ERROR),
        (["agent", "start", "bot1"], EXIT_RUN_ERROR),
        (["sandbox", "list"], EXIT_ERROR),
    ):
        ran = _run([alone], words, {"PATH": "/usr/bin:/bin"})
        assert ran.returncode == status, (words, ran.stderr)
        assert ran.stderr.startswith(b"lnk: cannot run the Python CLI (")


def test_the_c_clients_statuses_are_the_python_ones() -> None:
    import re

    from lnk_cli.exit_statuses import RUNS
    from lnk_shared import errors

    native = Path(__file__).parents[3] / "cli/lnk_cli/native"
    header = (native / "lnk_client.h").read_text()
    for name in ("EXIT_ERROR", "EXIT_RUN_ERROR", "EXIT_RUN_REFUSED"):
        found = re.search(rf"#define {name} (\d+)", header)
        assert found is not None and int(found[1]) == getattr(errors, name), name
    listed = re.search(r"runs\[\]\[2\] = \{(.*?)\};", (native / "lnk_client.c").read_text())
    assert listed is not None
    assert set(re.findall(r'\{"(\w+)", "(\w+)"\}', listed[1])) == set(RUNS)


def test_no_launch_socket_is_the_python_message(native_client: Path, tmp_path: Path) -> None:
    env: dict[Word, Word] = {"PATH": "/usr/bin:/bin", "LNK_RUN_DIR": str(tmp_path)}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    words = ["sandbox", "run", "--yes", "--", "true"]
    native, python = _run([native_client], words, env), _run(_python(), words, env)
    assert (native.returncode, native.stderr) == (python.returncode, python.stderr)
    assert (
        native.stderr
        == (
            f"lnk: the box is not running (no launch socket in {tmp_path}); "
            "start it with `lnk box up`\n"
        ).encode()
    )
    assert native.returncode == EXIT_RUN_ERROR


def test_a_spec_file_that_cannot_be_opened_is_the_python_message(
    native_client: Path, controller: Controller, tmp_path: Path
) -> None:
    words = ["sandbox", "run", "--spec", "missing \xe9.toml", "--", "true"]
    env = _env(controller)
    native = _run([native_client], words, env, cwd=tmp_path)
    python = _run(_python(), words, env, cwd=tmp_path)
    assert (native.returncode, native.stderr) == (python.returncode, python.stderr)
    assert native.returncode == EXIT_RUN_ERROR
    assert (
        native.stderr
        == "lnk: missing é.toml: cannot open the spec file: No such file or directory\n".encode()
    )


def test_an_oversized_spec_is_refused_by_both_clients_before_anything_is_sent(
    native_client: Path, controller: Controller, tmp_path: Path
) -> None:
    from lnk_shared.spec_size import MAX_SPEC_BYTES

    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (MAX_SPEC_BYTES + 1))
    words = ["sandbox", "run", "--spec", str(big), "--", "true"]
    env = _env(controller)
    native = _run([native_client], words, env, cwd=tmp_path)
    python = _run(_python(), words, env, cwd=tmp_path)
    assert (native.returncode, native.stderr) == (python.returncode, python.stderr)
    assert native.returncode == EXIT_RUN_ERROR
    assert (
        native.stderr
        == (
            f"lnk: {big}: the spec is larger than {MAX_SPEC_BYTES} bytes (256 KiB; this one has "
            f"{MAX_SPEC_BYTES + 1} or more): a spec is a few lines of TOML, so this is not one\n"
        ).encode()
    )
    controller.listener.settimeout(0)
    with pytest.raises(BlockingIOError):  # neither client connected: nothing was sent
        controller.listener.accept()


def test_the_c_clients_spec_limit_is_the_python_one() -> None:
    import re

    from lnk_shared.spec_size import MAX_SPEC_BYTES

    source = Path(__file__).parents[3] / "cli/lnk_cli/native/lnk_client.c"
    found = re.search(r"#define SPEC_MAX_BYTES \((\d+) \* (\d+)\)", source.read_text())
    assert found is not None
    assert int(found[1]) * int(found[2]) == MAX_SPEC_BYTES


# --- the caller's terminal ------------------------------------------------------------------


@pytest.mark.parametrize("client", ["native", "python", "python-full"])
def test_the_terminals_modes_are_put_back_whatever_was_done_to_them_meanwhile(
    native_client: Path, controller: Controller, client: str
) -> None:
    """stderr a terminal (the quick path of both, and the Python client's full path): whatever
    turns its echo off as soon as the request has come (a controller that passed it through),
    the client puts the modes back."""
    master, secondary = os.openpty()
    before = termios.tcgetattr(secondary)

    def script(conn: socket.socket, _launch: Launch) -> None:
        controller.write_frame(conn, {"type": "started", "id": "sbx-1"}, [])
        raw = termios.tcgetattr(secondary)
        raw[3] &= ~(termios.ECHO | termios.ICANON)
        termios.tcsetattr(secondary, termios.TCSANOW, raw)
        controller.write_frame(conn, _exit(3), [])

    controller.serve(script)
    program = [str(native_client)] if client == "native" else _python()
    flags = ["--command", "true"] if client == "python-full" else []  # not the plain form
    try:
        ran = subprocess.run(
            [*program, "sandbox", "run", *flags, "--", "true"],
            env=_env(controller),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=secondary,
            timeout=TIMEOUT_S,
            check=False,
        )
        controller.check()
        after = termios.tcgetattr(secondary)
    finally:
        os.close(secondary)
        os.close(master)
    assert ran.returncode == 3
    assert after == before


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
        **_env(controller),
        "E2E_KEY": "k-1",
        "E2E_UNNAMED": "stays-out",
        "ODD": b"\xff odd \xe2\x82",
    }
    native = _sent_as_python_sends(native_client, controller, words, env, odd_cwd)
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
    env = {**_env(controller), "E2E_KEY": "k-1"}
    out = {}
    for name, program in (("native", [native_client]), ("python", _python())):
        controller.serve(_answer(controller, _exit(0)))
        ran = _run(program, ["sandbox", "run", *words], env, cwd=tmp_path)
        out[name] = (ran.returncode, ran.stdout, ran.stderr)
        if ran.returncode == 0:
            launch = controller.check()
            assert os.path.basename(launch.exe).startswith("python")
    assert out["native"] == out["python"]
