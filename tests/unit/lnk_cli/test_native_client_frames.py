"""Frames no controller should send, to the C `lnk` client (lnk_cli/native/lnk_client.c): a clean
error, no crash, no hang, and the Python client's refusal is as clean; any JSON message is
printed as the Python client prints it.
"""

from __future__ import annotations

import os
import socket
import threading
from contextlib import suppress
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from native_launch import (
    FAST,
    TIMEOUT_S,
    Controller,
    Launch,
    answer_with,
    client_env,
    exit_frame,
    python_client,
    run_client,
)

from lnk_shared.errors import EXIT_RUN_ERROR
from lnk_shared.frames import MAX_FDS, MAX_FRAME

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
    controller.serve(answer_with(controller, body))
    ran = run_client([native_client], ["sandbox", "run", "--", "true"], client_env(controller))
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
    controller.serve(answer_with(controller, body))
    ran = run_client(python_client(), ["sandbox", "run", "--", "true"], client_env(controller))
    controller.check()
    assert ran.returncode == EXIT_RUN_ERROR
    assert ran.stderr.startswith(b"lnk: the controller sent a bad frame ("), ran.stderr
    assert ran.stderr.endswith(b"); see its log\n") and ran.stderr.count(b"\n") == 1


def test_32_levels_deep_is_still_read(native_client: Path, controller: Controller) -> None:
    controller.serve(answer_with(controller, NESTED_32))
    ran = run_client([native_client], ["sandbox", "run", "--", "true"], client_env(controller))
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
        ran = run_client([native_client], ["sandbox", "run", "--", "true"], client_env(controller))
    finally:
        done.set()
    controller.check()
    assert ran.returncode == EXIT_RUN_ERROR
    assert b"frame of 1048577 bytes is over the limit of 1048576" in ran.stderr


def test_a_frame_cut_short_is_the_eof_error(native_client: Path, controller: Controller) -> None:
    def script(conn: socket.socket, _launch: Launch) -> None:
        conn.sendall((100).to_bytes(4, "big") + b'{"type":')

    controller.serve(script)
    ran = run_client([native_client], ["sandbox", "run", "--", "true"], client_env(controller))
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
                controller.write_frame(conn, exit_frame(0), [fd] * (MAX_FDS + 1))
        finally:
            os.close(fd)

    controller.serve(script)
    ran = run_client([native_client], ["sandbox", "run", "--", "true"], client_env(controller))
    controller.check()
    assert ran.returncode == EXIT_RUN_ERROR
    assert b"too many descriptors in one frame" in ran.stderr


@FAST
@given(st.binary(max_size=200))
def test_any_bytes_as_a_frame_end_the_client_cleanly(
    native_client: Path, controller: Controller, body: bytes
) -> None:
    controller.serve(answer_with(controller, body))
    ran = run_client([native_client], ["sandbox", "run", "--", "true"], client_env(controller))
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
    controller.serve(answer_with(controller, frame))
    ran = run_client([native_client], ["sandbox", "run", "--", "true"], client_env(controller))
    controller.check()
    controller.launches.clear()
    assert ran.returncode == 9
    if isinstance(said, str):  # str(said) on stderr, errors="backslashreplace"
        assert ran.stderr == f"lnk: {said}\n".encode("utf-8", "backslashreplace")
    else:
        assert ran.stderr.startswith(b"lnk: ")
