"""The client half of the launch socket: open what the owner may reach, pass it with stdio,
answer the approval question, relay a terminal, forward signals, return the exit status."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import socket
import struct
import sys
import termios
import tty

from lnk_cli.launch_dialogue import LAUNCH_SOCKET, dialogue, held_signals, launch_request
from lnk_cli.terminal_modes import kept_modes
from lnk_shared.box_env import box_run_dir
from lnk_shared.errors import SpecError, StateError, UsageError
from lnk_shared.launch_protocol import add_spec, add_with_fd, terminal_size
from lnk_shared.spec_flags import flags_document
from lnk_shared.spec_size import refuse_oversized_spec
from lnk_shared.unix import recv_frame, send_frame

# typing.TYPE_CHECKING without importing typing, which `lnk sandbox run` never needs.
TYPE_CHECKING = False

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator
    from typing import Any

__all__ = ["run_in_sandbox"]

PROGRAM_DIRS = ("/usr/local/bin", "/usr/bin", "/bin")  # the sandbox's PATH, to find the program
RELAY_CHUNK = 65536  # bytes moved per read between the terminal and the sandbox's pty


def _winsize(fd: int) -> tuple[int, int]:
    rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    return rows, cols


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _relay(sock: socket.socket, master: int) -> dict[str, Any]:
    """Move bytes between this terminal and the sandbox's pty until the exit frame arrives."""
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()

    def resize(*_: object) -> None:
        rows, cols = _winsize(stdin)
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    old = signal.signal(signal.SIGWINCH, resize)
    watch = [stdin, master, sock.fileno()]
    try:
        with _raw(stdin):
            while True:
                ready, _, _ = select.select(watch, [], [])
                if master in ready:
                    try:
                        data = os.read(master, RELAY_CHUNK)
                    except OSError:
                        data = b""
                    if data:
                        os.write(stdout, data)
                    else:
                        watch.remove(master)
                if stdin in ready:
                    data = os.read(stdin, RELAY_CHUNK)
                    if data and master in watch:
                        os.write(master, data)
                    elif not data:
                        watch.remove(stdin)
                if sock.fileno() in ready:
                    message, extra = recv_frame(sock)
                    for fd in extra:
                        os.close(fd)
                    return message
    finally:
        signal.signal(signal.SIGWINCH, old)
        os.close(master)


def _refuse_closed(fd: int, item: str) -> None:
    """A --with-fd descriptor this process does not hold is the caller's mistake, named."""
    try:
        os.fstat(fd)
    except (OSError, OverflowError):
        raise UsageError(
            f"--with-fd {item}: descriptor {fd} is not open here; open it in the shell that "
            f"runs lnk (for example `{fd}<FILE` to read, `{fd}>>FILE` to append)"
        ) from None


def run_in_sandbox(
    args: argparse.Namespace, command: list[str], *, dry: bool = False, agent: str | None = None
) -> int:
    """Run `command` in the sandbox the arguments describe; with `dry`, only judge and approve
    the spec (asking if it is new or changed) and run nothing."""
    terminal = None
    if not dry and sys.stdin.isatty() and sys.stdout.isatty():
        rows, cols = _winsize(0)
        terminal = terminal_size(rows, cols)
    fds: list[int] = [0, 1, 2]
    opened: list[int] = []
    # With `agent` (`lnk agent start`), the controller checks it is the caller's.
    request = launch_request(
        command, flags_document(args), yes=bool(args.yes), dry=dry, terminal=terminal, agent=agent
    )
    try:
        if args.spec:
            try:
                opened.append(
                    os.open(args.spec, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
                )
            except OSError as exc:
                raise SpecError(
                    f"cannot open the spec file: {exc.strerror}", source=args.spec
                ) from None
            refuse_oversized_spec(opened[-1], args.spec)  # `opened` is closed below
            add_spec(request, len(fds))
            fds.append(opened[-1])
        for item in args.with_fd:
            number = int(str(item).partition(":")[0]) if str(item)[:1].isdigit() else -1
            if number >= 0:
                _refuse_closed(number, str(item))
                add_with_fd(request, number, len(fds))
                fds.append(number)
        run_dir = box_run_dir()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(os.path.join(run_dir, LAUNCH_SOCKET))
        except OSError:
            sock.close()
            raise StateError(
                f"the box is not running (no launch socket in {run_dir}); "
                "start it with `lnk box up`"
            ) from None
        with sock, kept_modes(), held_signals():  # the modes as they were, after (launch_dialogue)
            try:
                send_frame(sock, request, fds)
                for fd in opened:
                    os.close(fd)
                opened.clear()
                return dialogue(
                    lambda m, f: send_frame(sock, m, f),
                    lambda: recv_frame(sock, want_fds=True),
                    relay=lambda master: _relay(sock, master),
                )
            except (EOFError, ConnectionError) as exc:
                raise StateError(
                    f"the controller ended the launch without an answer ({exc}); see its log"
                ) from None
    finally:
        for fd in opened:
            os.close(fd)
