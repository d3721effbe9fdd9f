"""Run a command on a real pty and answer the approval question it asks there."""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["PROMPT", "answer_on_pty"]

PROMPT = b"[y/N]"
PTY_TIMEOUT_S = 30.0  # a launch's question on a loaded 2-core machine comes in a few seconds


def answer_on_pty(
    argv: Sequence[str], answer: str, *, env: dict[str, str], cwd: Path, prompt: bytes = PROMPT
) -> tuple[int, bytes]:
    """Run `argv` with a pty as stdin, stdout and stderr; write `answer` and a newline once
    `prompt` shows (the approval question's, or a shell's). Its exit status and every byte it
    wrote to the terminal."""
    main, secondary = os.openpty()
    proc = subprocess.Popen(
        list(argv),
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env=env,
        cwd=str(cwd),
        start_new_session=True,
    )
    os.close(secondary)
    seen = b""
    deadline = time.monotonic() + PTY_TIMEOUT_S
    answered = False
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(main, 4096)
                except OSError:  # EIO: every writer of the pty is gone
                    break
                if not chunk:
                    break
                seen += chunk
            if prompt in seen and not answered:
                os.write(main, answer.encode() + b"\n")
                answered = True
            if proc.poll() is not None and not ready:
                break
        return proc.wait(timeout=PTY_TIMEOUT_S), seen
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
