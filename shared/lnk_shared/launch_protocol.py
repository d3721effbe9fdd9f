"""The launch socket's protocol, defined once: each frame, who sends it, its fields and their
limits, and the order of the dialogue. The controller (`lnk_controller.launch_socket`,
`launch_request`), the Python clients (`lnk_cli.launch_dialogue`, `launch_client`,
`check/launch`) build and read frames with what is here; the C client
(`lnk_client_dialogue.c`, `lnk_client.c`) uses `lnk_launch_protocol.h`, which
`lnk_shared.launch_protocol_c` writes from this module (a unit test holds them equal).

Each frame is one JSON object with a "type" (`lnk_shared.frames`: a 4-byte big-endian length,
at most MAX_FRAME bytes, at most MAX_FDS descriptors on its first byte). In order:
    client -> launch      + stdin, stdout, stderr (+ the spec file, the --with-fd descriptors)
    server -> approve?    (a new or changed spec, unless the request said yes)
    client -> approve | decline
    server -> open        (folders and programs to bind)
    client -> opened      + those paths opened O_PATH, as the owner
    server -> approved    (a dry request: nothing runs, the end)
    server -> started     (+ the pty's master when the request had a terminal)
    client -> signal      (any number of times, until the end)
    server -> exit | error   (the end; an error may come instead of any server frame)

What a client sends is judged here (`launch_fields`, `approval`, `opened_grants`,
`forwarded_signal`): a field outside the definition is a FrameError naming the frame and the
field (each launch field's own form is `lnk_controller.launch_request`'s, with the limits here);
a signal frame that is not one is ignored, as a running sandbox is not stopped for it. What the
controller sends is read here too (`asked_paths`, `question`, `exit_status`, ...), as the
clients have always read it: the controller is trusted, and a malformed answer is read the
same way by the C client (tests/unit/lnk_cli/test_native_client.py holds them to it).

`lnk sandbox run`'s quick path imports this: nothing is imported here at run time but
`lnk_shared.frames` and `lnk_shared.errors`, and patterns are strings the controller compiles.
"""

from __future__ import annotations

from lnk_shared.errors import (
    EXIT_ERROR,
    EXIT_RUN_ERROR,
    FrameError,
    NotConfirmedError,
    RemoteError,
    StateError,
)
from lnk_shared.frames import HEADER_BYTES, MAX_FDS, MAX_FRAME

# typing.TYPE_CHECKING without importing typing, which `lnk sandbox run` never needs.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "AGENT_NAME_PATTERN",
    "APPROVE",
    "APPROVED",
    "APPROVE_QUESTION",
    "CLIENT_FRAMES",
    "DECLINE",
    "ENV_ALLOWED_PATTERN",
    "ENV_VALUE_PATTERN",
    "ERROR",
    "EXIT",
    "FIELDS",
    "FORWARDED_SIGNALS",
    "HEADER_BYTES",
    "LAUNCH",
    "LAUNCH_FDS_FIELDS",
    "LAUNCH_SOCKET",
    "MAX_ARGS",
    "MAX_ARG_BYTES",
    "MAX_ENV_VALUE",
    "MAX_FDS",
    "MAX_FRAME",
    "MAX_STATUS",
    "MAX_TERMINAL",
    "MAX_TEXT",
    "OPEN",
    "OPENED",
    "ORDER",
    "SERVER_FRAMES",
    "SIGNAL",
    "STARTED",
    "STDIO",
    "TERMINAL_FIELDS",
    "TYPE",
    "add_spec",
    "add_with_fd",
    "approval",
    "approve_frame",
    "approve_question_frame",
    "approved_frame",
    "approved_hash",
    "asked_paths",
    "bad_frame",
    "decline_frame",
    "error_frame",
    "exit_frame",
    "exit_status",
    "expect",
    "forwarded_signal",
    "launch_fields",
    "launch_frame",
    "open_frame",
    "opened_frame",
    "opened_grants",
    "question",
    "remote_error",
    "signal_frame",
    "started_frame",
    "started_sandbox",
    "terminal_size",
]

LAUNCH_SOCKET = "launch.sock"  # in the box's run folder ($LNK_RUN_DIR, /run/lnk)
TYPE = "type"  # the field every frame has: one of the names below

# The frames, by who sends them.
LAUNCH = "launch"
APPROVE = "approve"
DECLINE = "decline"
OPENED = "opened"
SIGNAL = "signal"
APPROVE_QUESTION = "approve?"
OPEN = "open"
APPROVED = "approved"
STARTED = "started"
EXIT = "exit"
ERROR = "error"
CLIENT_FRAMES = (LAUNCH, APPROVE, DECLINE, OPENED, SIGNAL)
SERVER_FRAMES = (APPROVE_QUESTION, OPEN, APPROVED, STARTED, EXIT, ERROR)
# Which frames may answer which: the dialogue's order (ERROR may end it anywhere).
ORDER = {
    LAUNCH: (APPROVE_QUESTION, OPEN, APPROVED, STARTED, EXIT, ERROR),
    APPROVE_QUESTION: (APPROVE, DECLINE),
    APPROVE: (OPEN, APPROVED, STARTED, ERROR),
    OPEN: (OPENED,),
    OPENED: (STARTED, ERROR),
    STARTED: (SIGNAL, EXIT, ERROR),
    SIGNAL: (SIGNAL, EXIT, ERROR),
}

# Each frame's fields besides "type", in the order the clients write them (the C client's
# request is the Python one's byte for byte, so the order is part of the definition).
FIELDS: dict[str, tuple[str, ...]] = {
    LAUNCH: (
        "check",  # `lnk sandbox check`: argv is the box's probe's arguments (written first)
        "argv",
        "cwd",
        "path_env",
        "flags",  # the spec flags' document (lnk_shared.spec_flags)
        "env",  # the caller's terminal and locale variables: only those pass
        "terminal",  # {rows, cols}, or null
        "yes",
        "dry",  # judge and approve only (`lnk spec approve`)
        "fds",  # indexes into the descriptors passed: LAUNCH_FDS_FIELDS
        "with_fds",  # the caller's descriptor number -> index of the one passed
        "agent",  # `lnk agent start NAME`: run as the caller's agent
    ),
    APPROVE: ("hash",),
    DECLINE: (),
    OPENED: ("grants",),  # each asked path -> index of its O_PATH descriptor
    SIGNAL: ("signal",),
    APPROVE_QUESTION: ("lines", "hash"),
    OPEN: ("paths",),
    APPROVED: ("hash", "already"),
    # note: what the controller wrote on the program's stderr before it started (the folder
    # it did not start in), absent when nothing; said already, so a client never prints it.
    STARTED: ("id", "limits", "note"),
    EXIT: ("status", "message"),  # message: a limit the sandbox met, said by the client
    ERROR: ("exit", "run_exit", "message"),  # a command's status (1-3) and a run's (125-127)
}
STDIO = ("stdin", "stdout", "stderr")  # always the first three descriptors passed: 0, 1, 2
LAUNCH_FDS_FIELDS = (*STDIO, "spec", "grants")
TERMINAL_FIELDS = ("rows", "cols")

# The limits of what a client sends.
MAX_ARGS = 4096  # arguments to the sandboxed program
MAX_ARG_BYTES = 128 * 1024  # one argument (the kernel's MAX_ARG_STRLEN)
MAX_TEXT = 4096  # cwd, path_env and a grant's path, in characters
MAX_ENV_VALUE = 256  # TERM, LANG and LC_* values are short names
MAX_TERMINAL = 10000  # rows and cols are below this
ENV_ALLOWED_PATTERN = r"^(TERM|LANG|LANGUAGE|COLORTERM|LC_[A-Z]+)$"  # what of env passes
ENV_VALUE_PATTERN = r"^[A-Za-z0-9_.:@+,=-]*$"
AGENT_NAME_PATTERN = r"[a-z0-9][a-z0-9-]{0,39}"
MAX_STATUS = 255  # an exit status, as a process's is (the controller's: 128+N for a signal)
# The signals a client forwards to the program, by name (each side has its own numbers' module).
FORWARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")


# --- what a client sends ----------------------------------------------------------------------


def launch_frame(
    argv: list[str],
    *,
    cwd: str,
    path_env: str,
    flags: dict[str, object],
    env: dict[str, str],
    terminal: dict[str, int] | None = None,
    yes: bool = False,
    dry: bool = False,
    check: bool = False,
    agent: str | None = None,
) -> dict[str, Any]:
    """The launch frame, without its descriptors: stdio is always passed as 0, 1 and 2; the
    spec file's index goes in `fds`, the --with-fd ones in `with_fds`, as they are opened."""
    frame: dict[str, Any] = {TYPE: LAUNCH}
    if check:
        frame["check"] = True
    frame.update(
        {
            "argv": argv,
            "cwd": cwd,
            "path_env": path_env,
            "flags": flags,
            "env": env,
            "terminal": terminal,
            "yes": yes,
            "dry": dry,
            "fds": {name: i for i, name in enumerate(STDIO)},
            "with_fds": {},
        }
    )
    if agent is not None:
        frame["agent"] = agent
    return frame


def terminal_size(rows: int, cols: int) -> dict[str, int]:
    """The launch frame's `terminal`: the caller's terminal's size, for the sandbox's pty."""
    return {"rows": rows, "cols": cols}


def add_spec(frame: dict[str, Any], index: int) -> None:
    """The launch frame's spec file is the descriptor passed at `index`."""
    frame["fds"]["spec"] = index


def add_with_fd(frame: dict[str, Any], number: int, index: int) -> None:
    """The caller's descriptor `number` (--with-fd) is the one passed at `index`."""
    frame["with_fds"][str(number)] = index


def approve_frame(digest: object) -> dict[str, Any]:
    return {TYPE: APPROVE, "hash": digest}


def decline_frame() -> dict[str, Any]:
    return {TYPE: DECLINE}


def opened_frame(paths: list[str]) -> dict[str, Any]:
    """The answer to "open" whose descriptors are `paths` opened in their order (a path asked
    twice takes its last index, as a dict does)."""
    return {TYPE: OPENED, "grants": {path: i for i, path in enumerate(paths)}}


def signal_frame(number: int) -> dict[str, Any]:
    return {TYPE: SIGNAL, "signal": number}


# --- what the controller sends ----------------------------------------------------------------


def approve_question_frame(lines: list[str], digest: str) -> dict[str, Any]:
    return {TYPE: APPROVE_QUESTION, "lines": lines, "hash": digest}


def open_frame(paths: list[str]) -> dict[str, Any]:
    return {TYPE: OPEN, "paths": paths}


def approved_frame(digest: str, already: bool) -> dict[str, Any]:
    return {TYPE: APPROVED, "hash": digest, "already": already}


def started_frame(sandbox_id: str, limits: str, note: str = "") -> dict[str, Any]:
    """The sandbox runs; `note` (when there is one) is what the caller was told before it
    started, on the program's stderr, so that it comes first (`FIELDS`)."""
    return {TYPE: STARTED, "id": sandbox_id, "limits": limits, **({"note": note} if note else {})}


def exit_frame(status: int, message: str = "") -> dict[str, Any]:
    """The program's status; `message`, when there is one, names a limit the sandbox met."""
    return {TYPE: EXIT, "status": status, **({"message": message} if message else {})}


def error_frame(exit_code: int, run_exit_code: int, message: str) -> dict[str, Any]:
    return {TYPE: ERROR, "exit": exit_code, "run_exit": run_exit_code, "message": message}


# --- what the controller judges -------------------------------------------------------------


def expect(untrusted: dict[str, Any], kind: str) -> None:
    """The frame is of type `kind`, or a FrameError."""
    if untrusted.get(TYPE) != kind:
        raise FrameError(f"must be {kind!r}, not {untrusted.get(TYPE)!r}", frame=kind, field=TYPE)


def _only_fields(kind: str, untrusted: dict[str, Any]) -> None:
    unknown = sorted(set(untrusted) - {TYPE, *FIELDS[kind]})
    if unknown:
        raise FrameError(
            f"is not a field of it (unknown fields: {unknown})", frame=kind, field=unknown[0]
        )


def launch_fields(untrusted: dict[str, Any]) -> dict[str, Any]:
    """A launch frame's body with no field outside the definition (its type is `expect`'s to
    check); each field's own checks are `lnk_controller.launch_request`'s, with the limits
    above."""
    _only_fields(LAUNCH, untrusted)
    return untrusted


def approval(untrusted: dict[str, Any], digest: str) -> bool:
    """True for an "approve" of exactly `digest`. Anything else (a decline, another hash,
    another frame) leaves the spec not approved: False. An approve or decline with a field
    outside the definition is a FrameError."""
    kind = untrusted.get(TYPE)
    if kind in (APPROVE, DECLINE):
        _only_fields(str(kind), untrusted)
    return kind == APPROVE and untrusted.get("hash") == digest


def opened_grants(untrusted: dict[str, Any], paths: list[str], fd_count: int) -> dict[str, int]:
    """Each asked path -> the index (among the `fd_count` descriptors that came with the
    frame) of its descriptor; exactly the paths asked for, each a passed descriptor. Another
    frame in its place is the client's refusal (NotConfirmedError)."""
    if untrusted.get(TYPE) != OPENED:
        raise NotConfirmedError("the client did not open what the sandbox needs")
    _only_fields(OPENED, untrusted)
    grants = untrusted.get("grants")
    if not isinstance(grants, dict) or set(grants) != set(paths):
        raise FrameError("must name exactly the paths asked for", frame=OPENED, field="grants")
    for index in grants.values():
        if type(index) is not int or not 0 <= index < fd_count:
            raise FrameError(
                "must give each the index of a passed descriptor", frame=OPENED, field="grants"
            )
    return dict(grants)


def forwarded_signal(untrusted: dict[str, Any], numbers: dict[str, int]) -> int | None:
    """The number of a "signal" frame's signal when it is one of FORWARDED_SIGNALS (`numbers`:
    their numbers by name, from the reader's own signal module). The client may send it any
    number of times while the program runs; any other frame, or signal, then is ignored (a
    refusal would have to stop a running sandbox over a client's slip)."""
    if untrusted.get(TYPE) != SIGNAL or set(untrusted) - {TYPE, *FIELDS[SIGNAL]}:
        return None
    number = untrusted.get("signal")
    if type(number) is not int or number not in {numbers[name] for name in FORWARDED_SIGNALS}:
        return None
    return number


# --- what a client reads ----------------------------------------------------------------------
# The controller is trusted, its bugs are not: a field of the wrong type is read as the clients
# have always read it (a message that is no string is shown as Python's str() shows it), the
# same in the C client, where that is harmless; a frame that is not JSON, too large, or whose
# exit status is not one is refused by both as a bad frame (`bad_frame`), never guessed at.


def asked_paths(frame: dict[str, Any]) -> list[str]:
    """An "open" frame's paths, each a string."""
    paths = frame.get("paths")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise StateError("the controller asked to open something that is not a list of paths")
    return paths


def question(frame: dict[str, Any]) -> tuple[list[str], object]:
    """An "approve?" frame's lines (each as str() shows it; none when they are not a list, as
    the C client reads them) and the hash to answer with."""
    lines = frame.get("lines")
    return ([str(line) for line in lines] if isinstance(lines, list) else []), frame.get("hash")


def approved_hash(frame: dict[str, Any]) -> tuple[bool, str]:
    """An "approved" frame: whether it was approved already, and its hash."""
    return bool(frame.get("already")), str(frame.get("hash"))


def started_sandbox(frame: dict[str, Any]) -> tuple[str, object]:
    """A "started" frame's sandbox id and its limits, as words (untrusted: shown cleaned)."""
    return str(frame.get("id", "")), frame.get("limits", "none")


def bad_frame(why: str) -> StateError:
    """A frame from the controller no client can act on, as both clients say it (the C
    client's `bad_frame`): the run fails with lnk's own status, never on a guess."""
    return StateError(f"the controller sent a bad frame ({why}); see its log")


def exit_status(frame: dict[str, Any]) -> tuple[int, str | None]:
    """An "exit" frame's status and the limit it met. A status that is not 0-255 (what the
    controller sends: 128+N for a signal) is a bad frame: passed on, 256 would be a success."""
    status = frame.get("status")
    if type(status) is not int or not 0 <= status <= MAX_STATUS:
        raise bad_frame(f"an exit status that is not 0-{MAX_STATUS}")
    said = str(frame["message"]) if "message" in frame else None
    return status, said


def remote_error(frame: dict[str, Any]) -> RemoteError:
    """An "error" frame as the error the client raises: its message and both statuses."""
    code, run_code = frame.get("exit"), frame.get("run_exit")
    return RemoteError(
        str(frame.get("message")),
        code if type(code) is int else EXIT_ERROR,
        run_code if type(run_code) is int else EXIT_RUN_ERROR,
    )
