"""The `lnk` command in C (lnk_cli/native/lnk_client.c): the quick path of `lnk sandbox run` sends
the request the Python quick path sends, byte for byte, answers the controller as it does (same
messages, same exit codes), passes the descriptors it is asked to open and forwards a signal in
the same frame; every frame of the protocol is held to that parity here. The Python client runs
beside it against the same fake controller (conftest.py, tests/unit/helpers/native_launch.py),
so "the same" is checked, not assumed.

Elsewhere: what the caller gives it (test_native_client_input.py), frames no controller should
send (_frames), signals and the caller's terminal (_signals_terminal), and everything it leaves
to the Python CLI (_fallback).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from native_launch import (
    TIMEOUT_S,
    Controller,
    Launch,
    Word,
    answer_with,
    client_env,
    exit_frame,
    python_client,
    run_client,
    sent_as_python_sends,
)

from lnk_cli.launch_dialogue import no_flags
from lnk_shared import launch_protocol as protocol
from lnk_shared.errors import EXIT_RUN_ERROR, EXIT_RUN_REFUSED

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


@pytest.mark.parametrize(("words", "extra_env"), REQUESTS)
def test_the_request_is_the_python_clients_byte_for_byte(
    native_client: Path,
    controller: Controller,
    odd_cwd: bytes,
    words: list[Word],
    extra_env: dict[Word, Word],
) -> None:
    env = client_env(controller, extra_env)
    native = sent_as_python_sends(native_client, controller, words, env, odd_cwd)
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


# --- the dialogue: the same answers as the Python client --------------------------------------

BAD_STATUS = (
    b"lnk: the controller sent a bad frame (an exit status that is not 0-255); see its log\n"
)

SAME_AS_PYTHON = {
    "exit 0": ([exit_frame(0)], 0, b""),
    "exit 3": ([exit_frame(3)], 3, b""),
    "exit 137": ([exit_frame(137)], 137, b""),
    # the controller sends 128+N for a signal: -9 was read as 247, now refused as no status
    "exit -9": ([exit_frame(-9)], EXIT_RUN_ERROR, BAD_STATUS),
    "exit not a number": ([{"type": "exit", "status": "7"}], EXIT_RUN_ERROR, BAD_STATUS),
    "started then exit": ([{"type": "started", "id": "s1"}, exit_frame(5)], 5, b""),
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
        [{"type": "started", "id": 5, "limits": [1]}, exit_frame(4)],
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
        [{"type": "started", "id": "s", "note": "lnk: note: \x1b[31m not shown"}, exit_frame(0)],
        0,
        b"",
    ),
    "started, a note not a string": (
        [{"type": "started", "id": "s", "note": {"a": [1]}}, exit_frame(3)],
        3,
        b"",
    ),
    # A status that is not one a process has: refused, never passed on (256 reads as 0).
    "exit, 256": ([exit_frame(256)], EXIT_RUN_ERROR, BAD_STATUS),
    "exit, past 32 bits": ([exit_frame(2**40)], EXIT_RUN_ERROR, BAD_STATUS),
    "exit, 255": ([exit_frame(255)], 255, b""),
}


@pytest.mark.parametrize("case", list(SAME_AS_PYTHON))
def test_each_answer_ends_as_the_python_client_ends(
    native_client: Path, controller: Controller, case: str
) -> None:
    frames, status, said = SAME_AS_PYTHON[case]
    results = []
    for program in ([native_client], python_client()):
        controller.serve(answer_with(controller, *frames))
        ran = run_client(program, ["sandbox", "run", "--yes", "--", "true"], client_env(controller))
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
        controller.write_frame(conn, exit_frame(0), [])

    results = []
    for program in ([native_client], python_client()):
        answers.clear()
        controller.serve(script)
        ran = run_client(program, ["sandbox", "run", "--yes", "--", "true"], client_env(controller))
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


# --- a signal, in the same frame --------------------------------------------------------------


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
        controller.write_frame(conn, exit_frame(7), [])

    controller.serve(script)
    with subprocess.Popen(
        [*program, "sandbox", "run", "--", "sleep", "9"],
        env=client_env(controller),
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
    python = _signal_frame_sent(controller, python_client(), number)
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
