"""The caller's process around the C `lnk` client (lnk_cli/native/lnk_client.c): a signal after
the sandbox started goes to the program, one while it starts is held then forwarded, and the
terminal's modes are put back whatever was done to them meanwhile (the Python client's too).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import termios
import threading
from pathlib import Path

import pytest
from native_launch import (
    TIMEOUT_S,
    Controller,
    Launch,
    client_env,
    exit_frame,
    python_client,
)

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
        controller.write_frame(conn, exit_frame(7), [])

    return script


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_after_started_goes_to_the_program(
    native_client: Path, controller: Controller, number: int
) -> None:
    started, got = threading.Event(), []
    controller.serve(_signal_script(controller, started, got, None))
    with subprocess.Popen(
        [native_client, "sandbox", "run", "--", "sleep", "9"],
        env=client_env(controller),
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
        env=client_env(controller),
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


# --- the caller's terminal --------------------------------------------------------------------


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
        controller.write_frame(conn, exit_frame(3), [])

    controller.serve(script)
    program = [str(native_client)] if client == "native" else python_client()
    flags = ["--command", "true"] if client == "python-full" else []  # not the plain form
    try:
        ran = subprocess.run(
            [*program, "sandbox", "run", *flags, "--", "true"],
            env=client_env(controller),
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
