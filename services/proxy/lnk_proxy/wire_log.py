"""The wire's log: one line per decision the proxy takes for a sandbox, written outside it.

Each line is a JSON object: `time` (UTC, ISO 8601), `sandbox`, `method`, `target`, `address`
(the one address dialed or judged; "" when none), `decision` (`allowed` or `refused`), `rule`
(the rule id), `up` and `down` (bytes from and to the sandbox, heads included), `reason` (the
detail the sandbox never sees) and, when dialing or relaying failed, `error`. A refusal is
written when it is decided; an allowed request or tunnel when it ends, so its bytes are known:
lines are in the order decisions were written, not the order requests arrived.

Every text that came from the sandbox or the network (method, target, reason, error) goes
through `cut_for_log`: control and format characters (escape sequences, bidi overrides, line
breaks) removed, then cut to `LOG_LIMIT` characters (300) for the target and the method, a
little more for the reason, which quotes the target. Files are `<dir>/<sandbox>.log`, mode
0640, opened append-only without following links.

Limits: this module does NOT
- rotate logs, nor keep writing past `MAX_LOG_BYTES` per sandbox: a sandbox that fills its log
  with refusals loses later lines (a warning goes to the proxy's own log, once per sandbox);
- log allowed tunnels while they are open: a tunnel's line appears when it closes, and is lost
  if the proxy dies first;
- fsync: a power cut can drop the last lines.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from lnk_proxy.http_request import LOG_LIMIT, cut_for_log

__all__ = [
    "LOG_FILE_MODE",
    "LOG_LIMIT",
    "MAX_LOG_BYTES",
    "SANDBOX_ID",
    "WireEntry",
    "WireLog",
    "format_line",
]

log = logging.getLogger(__name__)

LOG_FILE_MODE = 0o640  # the proxy writes; its group (the controller's readers) may read
LOG_DIR_MODE = 0o750  # likewise for the folder: other users see no sandbox's traffic
MAX_LOG_BYTES = 256 << 20  # a busy sandbox's month of lines; bounds the disk a sandbox can fill
METHOD_LIMIT = 32  # every real method is shorter; a longer one is shown cut
REASON_LIMIT = 2 * LOG_LIMIT  # a reason quotes a cut target and says why
SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # a file name: no '/', no '..'

Decision = Literal["allowed", "refused"]
# One encoder for every line: json.dumps with these options would build a new one each call.
_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))


@dataclass(frozen=True)
class WireEntry:
    """One decision. Texts may be untrusted: `format_line` cleans and cuts them."""

    sandbox: str
    method: str
    target: str
    decision: Decision
    rule: str
    address: str = ""
    up: int = 0
    down: int = 0
    reason: str = ""
    error: str = ""


def format_line(entry: WireEntry, now: datetime) -> str:
    """The log line for `entry` at `now`, newline included; ValueError for a bad sandbox id."""
    if not SANDBOX_ID.fullmatch(entry.sandbox):
        raise ValueError(f"not a sandbox id: {entry.sandbox!r}")
    document: dict[str, str | int] = {
        "time": now.astimezone(UTC).isoformat(timespec="milliseconds"),
        "sandbox": entry.sandbox,
        "method": cut_for_log(entry.method, METHOD_LIMIT),
        "target": cut_for_log(entry.target, LOG_LIMIT),
        "address": cut_for_log(entry.address, LOG_LIMIT),
        "decision": entry.decision,
        "rule": cut_for_log(entry.rule, METHOD_LIMIT),
        "up": entry.up,
        "down": entry.down,
        "reason": cut_for_log(entry.reason, REASON_LIMIT),
    }
    if entry.error:
        document["error"] = cut_for_log(entry.error, REASON_LIMIT)
    return _ENCODER.encode(document) + "\n"


class WireLog:
    """Appends lines to `<directory>/<sandbox>.log`; never raises to the caller on I/O errors
    (a full disk must not stop the proxy from refusing), it logs them instead."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._full: set[str] = set()
        # One open file per sandbox, and its size: a line costs one write, not an open, an
        # fstat and a close (those were a tenth of a small request's time in the proxy).
        self._open: dict[str, tuple[int, int]] = {}

    def prepare(self) -> None:
        """Create the folder (mode set explicitly); StateError-free: OSError goes up at start."""
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, LOG_DIR_MODE)

    def path(self, sandbox: str) -> Path:
        if not SANDBOX_ID.fullmatch(sandbox):
            raise ValueError(f"not a sandbox id: {sandbox!r}")
        return self.directory / f"{sandbox}.log"

    def _file(self, sandbox: str) -> tuple[int, int] | None:
        opened = self._open.get(sandbox)
        if opened is not None:
            return opened
        path = self.path(sandbox)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, LOG_FILE_MODE)
        except OSError as exc:
            log.error("wire log %s: cannot open: %s", path, exc)
            return None
        try:
            info = os.fstat(fd)
            if info.st_mode & 0o777 != LOG_FILE_MODE:
                os.fchmod(fd, LOG_FILE_MODE)  # a umask may have narrowed it at creation
        except OSError as exc:
            os.close(fd)
            log.error("wire log %s: cannot check: %s", path, exc)
            return None
        self._open[sandbox] = (fd, info.st_size)
        return self._open[sandbox]

    def write(self, entry: WireEntry) -> None:
        line = format_line(entry, datetime.now(UTC)).encode("ascii")
        opened = self._file(entry.sandbox)
        if opened is None:
            return
        fd, size = opened
        if size + len(line) > MAX_LOG_BYTES:
            if entry.sandbox not in self._full:
                self._full.add(entry.sandbox)
                log.warning("wire log of %s is full (%d bytes): lines dropped", entry.sandbox, size)
            return
        try:
            os.write(fd, line)
        except OSError as exc:
            log.error("wire log of %s: cannot write: %s", entry.sandbox, exc)
            return
        self._open[entry.sandbox] = (fd, size + len(line))

    def close(self, sandbox: str) -> None:
        """The sandbox's listener is closed: close its file (a later line reopens it)."""
        opened = self._open.pop(sandbox, None)
        self._full.discard(sandbox)
        if opened is not None:
            os.close(opened[0])
