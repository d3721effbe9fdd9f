"""The check's launch: one "check" request on the controller's launch socket, the probes'
output read from pipes while it runs, and a way to end it early.

The request carries the spec (its file as a descriptor, its flags) exactly as `lnk sandbox run`
sends it, with `check: true` and the plan as the only arguments: the controller puts its own
probe program in front, judges the spec as for a run, neither asks nor remembers it, and builds
the sandbox the same way. stdout and stderr are pipes to this process; stdin is a pipe whose
write end this process closes once `during` (the look from outside, as another user) is done:
the probes' last steps hold the sandbox open until then (probes.HOLD_S at most).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lnk_cli.check.verdicts import clean_text
from lnk_cli.launch_dialogue import LAUNCH_SOCKET, open_as_owner
from lnk_shared import launch_protocol as protocol
from lnk_shared.errors import RemoteError, SpecError, StateError
from lnk_shared.paths import BoxPaths
from lnk_shared.spec_flags import flags_document
from lnk_shared.unix import recv_frame, send_frame

__all__ = ["MAX_OUTPUT", "CheckRun", "Interrupts", "RemoteError", "run_probes"]

MAX_OUTPUT = 8 * 1024 * 1024  # bytes of the probes' output kept; more is a hostile sandbox
READ_CHUNK = 65536
STOP_WAIT_S = 10.0  # after an interrupt: how long the controller may take to end the sandbox


@dataclass
class Interrupts:
    """Ctrl-C (SIGINT, SIGTERM, SIGHUP) during a check, handled in order: the first is noted
    and, once the sandbox runs, passed to it as SIGTERM, so the sandbox ends and the
    controller says so before the bait is removed (`check()` then ends the check). A second
    one ends the check at once (the sandbox is still asked to end, for a bounded wait)."""

    count: int = 0
    sock: socket.socket | None = None
    started: bool = False

    def signal(self, _number: int, _frame: object) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt
        self.forward()

    def forward(self) -> None:
        if self.count and self.started and self.sock is not None:
            with contextlib.suppress(OSError):
                send_frame(self.sock, protocol.signal_frame(int(signal.SIGTERM)))

    def check(self) -> None:
        if self.count:
            raise KeyboardInterrupt


@dataclass
class CheckRun:
    sandbox_id: str = ""
    status: int | None = None
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    limits: str = ""  # the sandbox's limits, as the controller said when it started it
    limit_met: str = ""  # the limit it met (its process limit, under the limits probe), if any


def _request(
    args: argparse.Namespace,
    plan: str,
    fds: list[int],
    env: dict[str, str] | None = None,
    path_env: str | None = None,
) -> dict[str, Any]:
    request = protocol.launch_frame(
        [plan],
        check=True,
        cwd=os.getcwd(),
        path_env=os.environ.get("PATH", "") if path_env is None else path_env,
        flags=flags_document(args),
        env=dict(env or {}),  # caller_env.py's bait: what the controller must drop
    )
    if args.spec:
        try:
            fd = os.open(args.spec, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError as exc:
            raise SpecError(
                f"cannot open the spec file: {exc.strerror}", source=args.spec
            ) from None
        protocol.add_spec(request, len(fds))
        fds.append(fd)
    for item in args.with_fd:
        text = str(item)
        if text[:1].isdigit():
            protocol.add_with_fd(request, int(text.partition(":")[0]), len(fds))
            fds.append(os.dup(int(text.partition(":")[0])))
    return request


def _connect() -> socket.socket:
    run_dir = str(BoxPaths.from_env().run_dir)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(os.path.join(run_dir, LAUNCH_SOCKET))
    except OSError:
        sock.close()
        raise StateError(
            f"the box is not running (no launch socket in {run_dir}); start it with `lnk box up`"
        ) from None
    return sock


def _until_started(
    sock: socket.socket, run: CheckRun, judged: Callable[[], None] | None = None
) -> None:
    while True:
        message, extra = recv_frame(sock, want_fds=True)
        for fd in extra:
            os.close(fd)
        kind = message.get(protocol.TYPE)
        if kind == protocol.OPEN:
            if judged is not None:  # judged, not yet bound: the window a swap aims at
                judged()
            open_as_owner(lambda m, f: send_frame(sock, m, f), protocol.asked_paths(message))
        elif kind == protocol.STARTED:
            run.sandbox_id, limits = protocol.started_sandbox(message)
            run.limits = clean_text(limits, 200)
            return
        elif kind == protocol.ERROR:
            raise protocol.remote_error(message)
        else:
            raise StateError(f"unexpected answer from the controller: {kind!r}")


def _collect(sock: socket.socket, out_r: int, err_r: int, run: CheckRun) -> None:
    """Read both pipes until the exit frame arrives (a full pipe would stall the probes)."""
    selector = selectors.DefaultSelector()
    buffers = {out_r: run.stdout, err_r: run.stderr}
    for fd in (out_r, err_r):
        selector.register(fd, selectors.EVENT_READ)
    selector.register(sock, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in selector.select():
                if key.fileobj is sock:
                    message, extra = recv_frame(sock)
                    for fd in extra:
                        os.close(fd)
                    if message.get(protocol.TYPE) == protocol.ERROR:
                        raise protocol.remote_error(message)
                    run.status, said = protocol.exit_status(message)
                    if said is not None:  # the limit it met, as `lnk sandbox run` says it
                        run.limit_met = clean_text(said, 300)
                    _drain(buffers)
                    return
                fd = int(key.fd)
                data = os.read(fd, READ_CHUNK)
                if not data:
                    selector.unregister(fd)
                elif len(buffers[fd]) < MAX_OUTPUT:
                    buffers[fd] += data
    finally:
        selector.close()


def _drain(buffers: dict[int, bytearray]) -> None:
    for fd, kept in buffers.items():
        os.set_blocking(fd, False)
        with contextlib.suppress(BlockingIOError, OSError):
            while len(kept) < MAX_OUTPUT and (data := os.read(fd, READ_CHUNK)):
                kept.extend(data)


def _stop(sock: socket.socket) -> None:
    """A check ended early while its sandbox runs: ask the sandbox to end and wait (bounded)
    until the controller says it has, so nothing of it runs while the bait is removed."""
    with contextlib.suppress(OSError):
        send_frame(sock, protocol.signal_frame(int(signal.SIGTERM)))
    sock.settimeout(STOP_WAIT_S)
    with contextlib.suppress(OSError, EOFError, ValueError):
        while recv_frame(sock)[0].get(protocol.TYPE) not in (protocol.EXIT, protocol.ERROR):
            pass


def run_probes(
    args: argparse.Namespace,
    plan: str,
    interrupts: Interrupts,
    during: Callable[[str], None] | None = None,
    *,
    stdin: int | None = None,
    stderr: int | None = None,
    judged: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
    path_env: str | None = None,
) -> CheckRun:
    """Run the probes in the sandbox the arguments describe; return their output. `during`
    is called with the sandbox's id while it runs (held open by the probes' last steps, which
    wait for the end of the hold pipe on their stdin). `stdin` (the caller's terminal, for its
    probe) takes the hold pipe's place: the hold steps then do not wait, and what `during` sees
    is what it saw while the probes ran. `stderr`, when given, replaces the stderr pipe (the
    caller reads what went to it). `judged`, when given, is called once the controller has judged
    the request and before it binds anything (its "open" frame): `swap_race.py` swaps there.
    `env`: the request's terminal variables (`caller_env.py` sends its bait there).
    `path_env`, when given, is the PATH its `[commands]` names are found on (`path_links.py`)."""
    run = CheckRun()
    fds: list[int] = []
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    hold_w = -1
    if stdin is None:
        hold_r, hold_w = os.pipe2(os.O_CLOEXEC)
        fds.append(hold_r)
    else:
        fds.append(os.dup(stdin))
    fds.append(out_w)
    if stderr is not None:  # nothing writes the pipe then: its reader sees its end at once
        os.close(err_w)
        err_w = os.dup(stderr)
    fds.append(err_w)
    sock: socket.socket | None = None
    try:
        request = _request(args, plan, fds, env, path_env)
        sock = _connect()
        send_frame(sock, request, fds)
        for fd in fds:
            os.close(fd)
        fds.clear()
        _until_started(sock, run, judged)
        interrupts.sock, interrupts.started = sock, True
        interrupts.forward()  # an interrupt while it was being made
        try:
            if during is not None:
                during(run.sandbox_id)
        finally:
            if hold_w >= 0:
                os.close(hold_w)
                hold_w = -1
        _collect(sock, out_r, err_r, run)
        return run
    except (EOFError, ConnectionError) as exc:
        raise StateError(
            f"the controller ended the check without an answer ({exc}); see its log"
        ) from None
    except BaseException:
        if interrupts.started and sock is not None and run.status is None:
            _stop(sock)
        raise
    finally:
        interrupts.sock, interrupts.started = None, False
        for fd in (*fds, out_r, err_r, *([hold_w] if hold_w >= 0 else [])):
            with contextlib.suppress(OSError):
                os.close(fd)
        if sock is not None:
            sock.close()
