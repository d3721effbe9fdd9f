"""The launch dialogue, the client's half, as both Python clients speak it: the launch request,
the answers that follow it (opening grants as the owner, the approval question, forwarding
signals), and holding signals while the sandbox starts. And `lnk sandbox run [--spec FILE]
[--yes] -- PROGRAM [ARGS...]` without a terminal (`quick_run`), on as few imports as a launch
needs.

Why a second path: on a small machine each of argparse, json, socket and signal costs 10-15 ms
to import (mostly the enum and re modules they pull in), and the client was a third of a
sandbox's start. This path takes only that plain form, with stdin and stdout not both a
terminal; any other flag or spelling, a terminal, or a Python without the `_json` accelerator
goes to the full client (`launch_client`), whose argparse reads the same words into the same
request (tests/unit/lnk_cli/test_launch_dialogue.py holds them equal). It speaks the launch
socket's frames (`lnk_shared.unix`: a 4-byte big-endian length, then a JSON object; descriptors
ride on the first byte) with the C modules under those: `_socket`, `_signal` and `_json`.

The installed `lnk` is a C program (lnk_cli/native/lnk_client.c) that speaks this same
form itself when neither stdin nor stdout is a terminal, and runs this CLI otherwise; this path
serves the rest of the form (one of them a terminal), and its request is the one the C client
must send byte for byte (tests/unit/lnk_cli/test_native_client.py).

Only the client side is here: what the controller receives is judged by it, as from any client.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C half: no enum
import _socket
import os
import sys

from lnk_cli.terminal_modes import kept_modes
from lnk_shared import launch_protocol as protocol
from lnk_shared.box_env import box_run_dir
from lnk_shared.display import shown_lines
from lnk_shared.errors import (
    EXIT_ERROR,
    EXIT_RUN_ERROR,
    LnkError,
    NotConfirmedError,
    RemoteError,
    SpecError,
    StateError,
)
from lnk_shared.frames import no_duplicate_keys
from lnk_shared.launch_protocol import HEADER_BYTES, MAX_FDS, MAX_FRAME
from lnk_shared.spec_flags import FLAG_NAMES
from lnk_shared.spec_size import refuse_oversized_spec

# typing.TYPE_CHECKING without importing typing, which `lnk sandbox run` never needs.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Send = Callable[[dict[str, Any], list[int]], None]  # a frame and its descriptors
    Receive = Callable[[], tuple[dict[str, Any], list[int]]]
    Relay = Callable[[int], dict[str, Any]]  # a terminal's pty master -> the final frame

__all__ = [
    "LAUNCH_SOCKET",
    "RemoteError",
    "ask",
    "dialogue",
    "held_signals",
    "launch_request",
    "no_flags",
    "open_as_owner",
    "plain_run",
    "quick_run",
    "released_signals",
    "reported",
]

LAUNCH_SOCKET = protocol.LAUNCH_SOCKET
FORWARDED_SIGNALS = tuple(getattr(_signal, name) for name in protocol.FORWARDED_SIGNALS)
_INT = 4  # bytes of a C int: a descriptor in SCM_RIGHTS


class _SignalMask:
    """`with held_signals():` keeps the forwarded signals pending (blocked) from the launch
    request until this client forwards them: a Ctrl-C or SIGTERM that comes while the sandbox
    starts (its program may already run and print before the "started" frame arrives here)
    would otherwise end this client by default, and the controller would stop the sandbox
    instead of signalling its program. `released_signals()` lets them through for a while (the
    approval question, a terminal, the forwarding wait). The signals' mask as it was comes back
    at the end."""

    def __init__(self, how: int) -> None:
        self._how = how
        self._before: object = None

    def __enter__(self) -> None:
        self._before = _signal.pthread_sigmask(self._how, FORWARDED_SIGNALS)

    def __exit__(self, *_: object) -> None:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, self._before)


def held_signals() -> _SignalMask:
    return _SignalMask(_signal.SIG_BLOCK)


def released_signals() -> _SignalMask:
    return _SignalMask(_signal.SIG_UNBLOCK)


def launch_request(
    command: list[str],
    flags: dict[str, object],
    *,
    yes: bool,
    dry: bool = False,
    terminal: dict[str, int] | None = None,
    agent: str | None = None,
) -> dict[str, Any]:
    """The launch frame of this process, without its descriptors (stdio 0-2 are always
    passed): its folder, PATH, and terminal and locale variables."""
    return protocol.launch_frame(
        command,
        cwd=os.getcwd(),
        path_env=os.environ.get("PATH", ""),
        flags=flags,
        env={k: v for k, v in os.environ.items() if k in ("TERM", "LANG") or k.startswith("LC_")},
        terminal=terminal,
        yes=yes,
        dry=dry,
        agent=agent,
    )


def no_flags() -> dict[str, object]:
    """The spec flags' document when none is given (as argparse's defaults make it)."""
    return {name: None if name == "network_mode" else [] for name in FLAG_NAMES}


def plain_run(words: list[str]) -> tuple[str | None, bool, list[str]] | None:
    """(spec file, --yes, command) when `words` (after `sandbox run`) are the plain form;
    None for anything else, which argparse then reads (and errors on, where it must)."""
    spec: str | None = None
    yes = False
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            command = words[i + 1 :]
            return (spec, yes, command) if command else None
        if word == "--yes":
            yes = True
        elif word.startswith("--spec=") and len(word) > len("--spec="):
            spec = word.removeprefix("--spec=")
        elif word == "--spec" and i + 1 < len(words) and not words[i + 1].startswith("-"):
            spec = words[i + 1]
            i += 1
        else:
            return None
        i += 1
    return None


def quick_run(words: list[str]) -> int | None:
    """Run the plain form and return its exit status; None when the full client must."""
    parsed = plain_run(words)
    if parsed is None or (os.isatty(0) and os.isatty(1)):
        return None
    try:
        from _json import encode_basestring_ascii, make_scanner
    except ImportError:
        return None
    spec, yes, command = parsed
    frames = _Frames(encode_basestring_ascii, make_scanner)
    return reported(
        lambda: _launch(frames, launch_request(command, no_flags(), yes=yes), spec), runs=True
    )


def reported(run: Callable[[], int], *, runs: bool = False) -> int:
    """`run()`'s exit status, or the CLI's for what it raised: an LnkError's message and code,
    "interrupted" on Ctrl-C, and a quiet failure when the reader of stdout went away. Whatever
    else escapes is a bug of lnk's, never the user's to decode from a traceback: it is one line
    naming it (LNK_DEBUG=1 shows the traceback). `runs`: the command runs a program, whose own
    status `run()` returns; lnk's own failures are then 125, 126 or 127 (lnk_shared.errors)."""
    failed = EXIT_RUN_ERROR if runs else EXIT_ERROR
    try:
        return run()
    except RemoteError as exc:  # the controller showed it (launch_socket), as the C client prints
        print(f"lnk: {exc}", file=sys.stderr)
        return exc.run_exit_code if runs else exc.exit_code
    except LnkError as exc:
        print(f"lnk: {shown_lines(str(exc))}", file=sys.stderr)
        return exc.run_exit_code if runs else exc.exit_code
    except KeyboardInterrupt:
        print("lnk: interrupted", file=sys.stderr)
        return failed
    except BrokenPipeError:
        return failed
    except OSError as exc:
        if os.environ.get("LNK_DEBUG") == "1":
            raise
        where = f": {exc.filename}" if exc.filename else ""
        print(f"lnk: {shown_lines(f'{exc.strerror or exc}{where}')}", file=sys.stderr)
        return failed
    except Exception as exc:
        if os.environ.get("LNK_DEBUG") == "1":
            raise
        what = shown_lines(f"{type(exc).__name__}: {exc}")[:300]
        print(
            f"lnk: an error lnk did not expect ({what}); this is a bug: please report it with "
            "the command that caused it (LNK_DEBUG=1 shows where)",
            file=sys.stderr,
        )
        return failed


def _launch(frames: _Frames, request: dict[str, Any], spec: str | None) -> int:
    fds = [0, 1, 2]
    if spec:
        try:
            fd = os.open(spec, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError as exc:
            raise SpecError(f"cannot open the spec file: {exc.strerror}", source=spec) from None
        try:
            refuse_oversized_spec(fd, spec)
        except BaseException:
            os.close(fd)
            raise
        protocol.add_spec(request, len(fds))
        fds.append(fd)
    run_dir = box_run_dir()
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            sock.connect(os.path.join(run_dir, LAUNCH_SOCKET))
        except OSError:
            raise StateError(
                f"the box is not running (no launch socket in {run_dir}); "
                "start it with `lnk box up`"
            ) from None
        # The caller's terminal modes are saved before the request goes, and put back after
        # the answer, whatever happened in between (terminal_modes.py).
        with kept_modes(), held_signals():
            try:
                frames.send(sock, request, fds)
            finally:
                if spec:
                    os.close(fds[3])
            return dialogue(lambda m, f: frames.send(sock, m, f), lambda: frames.receive(sock))
    except (EOFError, ConnectionError) as exc:
        raise StateError(
            f"the controller ended the launch without an answer ({exc}); see its log"
        ) from None
    finally:
        sock.close()


def dialogue(send: Send, receive: Receive, relay: Relay | None = None) -> int:
    """The launch's answers to its end, for both clients: open what the controller asks as this
    user, ask the approval question, then wait for the exit (forwarding signals) or, given
    `relay` and a terminal, relay the terminal. The exit status, or RemoteError; a frame that
    cannot be read (not JSON, too large) is the controller's bad frame, as the C client says."""
    receive = _readable(receive)
    while True:
        message, extra = receive()
        kind = message.get(protocol.TYPE)
        if kind == protocol.STARTED and extra and relay is not None:  # the sandbox's pty master
            for fd in extra[1:]:
                os.close(fd)
            with released_signals():
                return _ended(relay(extra[0]))
        for fd in extra:
            os.close(fd)
        if kind == protocol.OPEN:
            open_as_owner(send, protocol.asked_paths(message))
        elif kind == protocol.APPROVE_QUESTION:
            lines, digest = protocol.question(message)
            with released_signals():  # Ctrl-C at the question ends this client
                approved = ask(lines)
            if not approved:
                send(protocol.decline_frame(), [])
                raise NotConfirmedError("not approved: nothing was run")
            send(protocol.approve_frame(digest), [])
        elif kind == protocol.APPROVED:  # a dry run: approved, nothing started
            already, digest = protocol.approved_hash(message)
            print(f"{'already approved' if already else 'approved'}: {digest[:16]}")
            return 0
        elif kind == protocol.STARTED:
            return _ended(_wait(send, receive))
        else:
            return _ended(message)


def _readable(receive: Receive) -> Receive:
    """`receive`, with a frame it cannot read (its ValueError: not JSON, not UTF-8, a key
    twice, past MAX_FRAME or MAX_FDS) made `protocol.bad_frame`: one line, never a traceback."""

    def received() -> tuple[dict[str, Any], list[int]]:
        try:
            return receive()
        except ValueError as exc:
            raise protocol.bad_frame(str(exc)[:200]) from None

    return received


def ask(lines: list[str]) -> bool:
    for line in lines:  # the controller showed what they quote; shown again as printed
        print(shown_lines(line), file=sys.stderr)
    if not sys.stdin.isatty():
        raise NotConfirmedError(
            "not approved: there is no terminal to ask on; "
            "read what it opens (lnk spec show) and pass --yes to approve it"
        )
    print("Run it with these grants? [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _ended(message: dict[str, Any]) -> int:
    kind = message.get(protocol.TYPE)
    if kind == protocol.EXIT:
        status, said = protocol.exit_status(message)
        if said is not None:  # a limit the sandbox met, said as an error's message is
            print(f"lnk: {said}", file=sys.stderr)
        return status
    if kind == protocol.ERROR:
        raise protocol.remote_error(message)
    raise StateError(f"unexpected answer from the controller: {kind!r}")


def open_as_owner(send: Send, paths: list[str]) -> None:
    """Open what the controller will bind (an "open" frame's paths), as this user (what we
    cannot reach is refused), and `send` the "opened" frame with the descriptors."""
    opened: list[int] = []
    try:
        for path in paths:
            try:
                opened.append(os.open(path, os.O_PATH | os.O_CLOEXEC))
            except OSError as exc:
                raise StateError(f"cannot open {path}: {exc.strerror}") from None
        send(protocol.opened_frame(paths), opened)
    finally:
        for fd in opened:
            os.close(fd)


def _wait(send: Send, receive: Receive) -> dict[str, Any]:
    """The final frame; meanwhile Ctrl-C and friends go to the program, not to this client."""

    def forward(number: int, _frame: object) -> None:
        try:  # noqa: SIM105 - contextlib is one more import on this path
            send(protocol.signal_frame(number), [])
        except OSError:
            pass

    old = {n: _signal.signal(n, forward) for n in FORWARDED_SIGNALS}
    try:
        with released_signals():  # what came while the sandbox started is forwarded now
            message, extra = receive()
        for fd in extra:
            os.close(fd)
        return message
    finally:
        for n, handler in old.items():
            _signal.signal(n, handler)


class _Frames:
    """lnk_shared.unix's frames over `_socket`, with JSON from `_json`'s own encoder and scanner
    (what the json module uses underneath, without its imports)."""

    def __init__(self, quote: Any, make_scanner: Any) -> None:
        self._quote = quote
        self._scan = make_scanner(_ScanContext())

    def encode(self, value: object) -> str:
        """json.dumps(value, separators=(",", ":")) for the types a request holds."""
        if value is None:
            return "null"
        if value is True:
            return "true"
        if value is False:
            return "false"
        if type(value) is int:
            return int.__repr__(value)
        if type(value) is str:
            return str(self._quote(value))
        if type(value) is list:
            return "[" + ",".join(self.encode(v) for v in value) + "]"
        if type(value) is dict:
            return (
                "{" + ",".join(f"{self._quote(k)}:{self.encode(v)}" for k, v in value.items()) + "}"
            )
        raise TypeError(f"cannot encode a {type(value).__name__} in a frame")

    def decode(self, text: str) -> dict[str, Any]:
        try:
            value, end = self._scan(text, 0)
        except (StopIteration, SystemError, RecursionError):
            # SystemError: the scanner's own error, raised without json.decoder imported.
            raise ValueError("a frame is not JSON") from None
        if end != len(text) or not isinstance(value, dict):
            raise ValueError("a frame must be one JSON object")
        return value

    def send(
        self, sock: _socket.socket, message: dict[str, Any], fds: list[int] | None = None
    ) -> None:
        data = self.encode(message).encode("utf-8")
        if len(data) > MAX_FRAME:
            raise ValueError(f"frame of {len(data)} bytes is over the limit of {MAX_FRAME}")
        payload = memoryview(len(data).to_bytes(HEADER_BYTES, "big") + data)
        if fds:
            if len(fds) > MAX_FDS:
                raise ValueError(f"{len(fds)} descriptors is over the limit of {MAX_FDS}")
            rights = b"".join(fd.to_bytes(_INT, sys.byteorder) for fd in fds)
            cmsg = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)]
            payload = payload[sock.sendmsg([payload[:1]], cmsg) :]
        while payload:
            payload = payload[sock.send(payload) :]

    def receive(self, sock: _socket.socket) -> tuple[dict[str, Any], list[int]]:
        fds: list[int] = []
        try:
            data, ancillary, flags, _ = sock.recvmsg(
                HEADER_BYTES, _socket.CMSG_SPACE(MAX_FDS * _INT)
            )
            for level, kind, rights in ancillary:
                if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                    usable = len(rights) - len(rights) % _INT
                    fds += [
                        int.from_bytes(rights[i : i + _INT], sys.byteorder, signed=True)
                        for i in range(0, usable, _INT)
                    ]
            if flags & _socket.MSG_CTRUNC:
                raise ValueError("too many descriptors in one frame")
            header = data + self._exactly(sock, HEADER_BYTES - len(data))
            length = int.from_bytes(header, "big")
            if length > MAX_FRAME:
                raise ValueError(f"frame of {length} bytes is over the limit of {MAX_FRAME}")
            return self.decode(self._exactly(sock, length).decode("utf-8")), fds
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise

    @staticmethod
    def _exactly(sock: _socket.socket, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = sock.recv(count - len(data))
            if not chunk:
                raise EOFError("the peer closed the connection")
            data += chunk
        return data


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


class _ScanContext:
    """What `_json.make_scanner` reads from a decoder: strict JSON, exact ints and floats."""

    strict = True
    object_hook = None
    object_pairs_hook = staticmethod(no_duplicate_keys)
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_no_constant)
