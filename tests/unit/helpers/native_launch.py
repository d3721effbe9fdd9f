"""The two `lnk` launch clients side by side, for tests/unit/lnk_cli/test_native_client*.py: the
C client (`native_client`, conftest.py) and the Python CLI, each run with a small environment
against the fake controller (`controller`, conftest.py), and the scripts that answer them.

`sent_as_python_sends` runs `sandbox run WORDS` from each and holds the C client's request to
the Python client's, byte for byte."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

Controller = Any  # conftest.Controller: the fake controller on a real launch socket
Launch = Any  # conftest.Launch: what a client sent first, and who it was
Word = str | bytes

TIMEOUT_S = 10.0
PYTHON_MAIN = "from lnk_cli.__main__ import main; main()"
FAST = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def client_env(controller: Controller, extra: dict[Word, Word] | None = None) -> dict[Word, Word]:
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


def run_client(
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


def python_client() -> list[Word]:
    return [sys.executable, "-P", "-c", PYTHON_MAIN]


def exit_frame(status: int) -> dict[str, object]:
    return {"type": "exit", "status": status}


def answer_with(controller: Controller, *frames: dict[str, object] | bytes | None) -> object:
    """A script: send each frame after the request (None: read one from the client)."""

    def script(conn: socket.socket, _launch: Launch) -> None:
        for frame in frames:
            if frame is None:
                controller.read_frame(conn)
            else:
                controller.write_frame(conn, frame, [])

    return script


def sent_as_python_sends(
    native_client: Path,
    controller: Controller,
    words: list[Word],
    env: dict[Word, Word],
    cwd: bytes,
) -> Launch:
    """`sandbox run WORDS` from each client: the C path's request, once it is the Python
    client's byte for byte."""
    sent: dict[str, Launch] = {}
    for name, program in (("native", [native_client]), ("python", python_client())):
        controller.serve(answer_with(controller, exit_frame(0)))
        ran = run_client(program, ["sandbox", "run", *words], env, cwd=cwd)
        assert ran.returncode == 0, ran.stderr
        sent[name] = controller.check()
    native, python = sent["native"], sent["python"]
    assert native.exe == str(native_client)  # the C path answered, not an exec'd Python
    assert native.raw == python.raw
    return native
