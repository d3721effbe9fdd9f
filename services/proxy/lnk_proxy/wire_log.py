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

Keeping the truth under a flood (`MAX_LOG_BYTES` per sandbox, or the config's bound):
- repeated refusals are aggregated: the first refusal of a (rule, method, target, reason) is
  written at once; the same ones within `AGGREGATE_WINDOW_S` are counted and written as one line
  with `repeated` (the count) and the reason they share when the window ends (`flush`). The reason
  is part of the key because one rule refuses for several reasons (a hosted rule's refused model,
  tool or body spelling), and a count under the first reason would hide the others. Past
  `MAX_AGGREGATED_KEYS` keys in a window, further refusals count under their rule with the target
  `(many targets)` and no reason, so varying the reason buys a flood nothing more than varying
  the target does;
- refusals use at most three quarters of the bound: the last quarter is kept for allowed
  decisions, so a refusal flood never blinds the log to what did go out;
- `can_admit` says whether a new exchange's line is sure to fit (`ADMIT_MARGIN_BYTES` left);
  the server refuses new exchanges (`log-full`) when it is not, rather than let them go
  unlogged.

The whole box's wire logs (`MAX_BOX_BYTES`, or the config's `wire_box_max_bytes`): the folder's
size (every `*.log` in it, running and ended sandboxes', read again every `BOX_SCAN_S`, on
the `scanner` thread when one is set: thousands of files take milliseconds, never spent on
the event loop; counted up by every line written between) takes the same shares: refusals
stop at three quarters of it, allowed lines at all of it, and a new exchange is admitted only
with `ADMIT_MARGIN_BYTES` (an eighth of the box's bound at most) left, so at the box's bound
running sandboxes' exchanges are refused (`log-full`), never sent unlogged. Room comes back
when the controller's retention removes the logs of the sandboxes that ended longest ago
(`lnk_controller.retention`, its `wire_keep_bytes`, below this bound); a running sandbox's log
is never removed to make room.

Limits: this module does NOT
- rotate a sandbox's log (the controller's reader follows one file by byte offset, and dropping
  its oldest lines would let a refusal flood push out the allowed decisions); past the refusal
  share, refusals are only counted in the proxy's own log;
- log allowed tunnels while they are open: a tunnel's line appears when it closes, and is lost
  if the proxy dies first;
- fsync: a power cut can drop the last lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import json.encoder
import logging
import os
import re
import stat
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from lnk_proxy.http_request import LOG_LIMIT, cut_for_log

__all__ = [
    "AGGREGATE_WINDOW_S",
    "LOG_FILE_MODE",
    "LOG_LIMIT",
    "MAX_LOG_BYTES",
    "SANDBOX_ID",
    "RefusalCounter",
    "WireEntry",
    "WireLog",
    "format_line",
]

log = logging.getLogger(__name__)

LOG_FILE_MODE = 0o640  # the proxy writes; its group (the controller's readers) may read
LOG_DIR_MODE = 0o750  # likewise for the folder: other users see no sandbox's traffic
MAX_LOG_BYTES = 256 << 20  # a busy sandbox's month of lines; bounds the disk a sandbox can fill
MAX_BOX_BYTES = 8 << 30  # every sandbox's log together: 32 sandboxes at their bound
BOX_SCAN_S = 1.0  # the folder's size is read again this often (retention frees room meanwhile)
LOG_SUFFIX = ".log"
AGGREGATE_WINDOW_S = 5.0  # repeats of one refusal within this become one line with a count
MAX_AGGREGATED_KEYS = 256  # distinct refusals counted per window; the rest by rule only
MANY_TARGETS = "(many targets)"  # the target of refusals counted by rule only
# Room a new exchange needs to be admitted: far above the lines of every exchange that may be
# open at once (a line is at most ~2 KiB: 300-character target, two 600-character texts).
ADMIT_MARGIN_BYTES = 4 << 20
METHOD_LIMIT = 32  # every real method is shorter; a longer one is shown cut
REASON_LIMIT = 2 * LOG_LIMIT  # a reason quotes a cut target and says why
SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # a file name: no '/', no '..'

Decision = Literal["allowed", "refused"]
# (sandbox, method, target, address, decision, rule, reason) -> their text in a line
KeptFields = dict[tuple[str, str, str, str, str, str, str], tuple[str, str]]
MAX_KEPT_FIELDS = 256  # a sandbox's distinct decisions at once; past it all are forgotten
# JSON's quoting of a string with every non-ASCII character escaped (C, where available).
_quote: Callable[[str], str] = json.encoder.encode_basestring_ascii


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
    repeated: int = 0  # an aggregate: this many more like it within the window


def format_line(entry: WireEntry, now: datetime, kept: KeptFields | None = None) -> str:
    """The log line for `entry` at `now`, newline included; ValueError for a bad sandbox id.
    The JSON `json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))` writes for the same
    fields, built in one f-string around the encoder's own string quoting (a dict and the
    encoder's walk were half of the line's cost). `kept`: the fixed fields' text as earlier
    lines of the same sandbox, method, target, address, decision, rule and reason had it
    (cleaning, cutting and quoting them was half of what was left)."""
    e = entry
    key = (e.sandbox, e.method, e.target, e.address, e.decision, e.rule, e.reason)
    fixed = kept.get(key) if kept is not None else None
    if fixed is None:
        fixed = _fixed_fields(entry)
        if kept is not None:
            if len(kept) >= MAX_KEPT_FIELDS:
                kept.clear()
            kept[key] = fixed
    stamp = _quote(now.astimezone(UTC).isoformat(timespec="milliseconds"))
    line = f'{{"time":{stamp},{fixed[0]}{int(entry.up)},"down":{int(entry.down)}{fixed[1]}'
    if entry.error:
        line += f',"error":{_quote(cut_for_log(entry.error, REASON_LIMIT))}'
    if entry.repeated:
        line += f',"repeated":{int(entry.repeated)}'
    return line + "}\n"


def _fixed_fields(entry: WireEntry) -> tuple[str, str]:
    """The line's text from `sandbox` to `"up":`, and its `reason` field."""
    if not SANDBOX_ID.fullmatch(entry.sandbox):
        raise ValueError(f"not a sandbox id: {entry.sandbox!r}")
    q = _quote
    head = (
        f'"sandbox":{q(entry.sandbox)},"method":{q(cut_for_log(entry.method, METHOD_LIMIT))},'
        f'"target":{q(cut_for_log(entry.target, LOG_LIMIT))},'
        f'"address":{q(cut_for_log(entry.address, LOG_LIMIT))},"decision":{q(entry.decision)},'
        f'"rule":{q(cut_for_log(entry.rule, METHOD_LIMIT))},"up":'
    )
    return head, f',"reason":{q(cut_for_log(entry.reason, REASON_LIMIT))}'


_Key = tuple[str, str, str, str]  # rule, method, target, reason


class RefusalCounter:
    """One sandbox's repeated refusals, per window (pure: the caller passes the clock)."""

    def __init__(self, window_s: float = AGGREGATE_WINDOW_S, max_keys: int = MAX_AGGREGATED_KEYS):
        self.window_s = window_s
        self.max_keys = max_keys
        self._windows: dict[_Key, list[float]] = {}  # key -> [window start, repeats]

    def admit(self, key: _Key, now: float) -> bool:
        """True: write this refusal now; False: it was counted into its window."""
        counted = self._windows.get(key)
        if counted is None and len(self._windows) >= self.max_keys:
            key = (key[0], "", MANY_TARGETS, "")
            counted = self._windows.get(key)
            if counted is None:
                self._windows[key] = [now, 1]
                return False
        if counted is None:
            self._windows[key] = [now, 0]
            return True
        counted[1] += 1
        return False

    def due(self, now: float, *, every: bool = False) -> list[tuple[_Key, int]]:
        """Windows that ended (all of them when `every`), with their repeats (> 0 only)."""
        ended = [
            k for k, (start, _) in self._windows.items() if every or now - start >= self.window_s
        ]
        found = []
        for key in ended:
            repeats = int(self._windows.pop(key)[1])
            if repeats:
                found.append((key, repeats))
        return found


class WireLog:
    """Appends lines to `<directory>/<sandbox>.log`; never raises to the caller on I/O errors
    (a full disk must not stop the proxy from refusing), it logs them instead."""

    def __init__(
        self,
        directory: Path,
        max_bytes: int | None = None,
        box_max_bytes: int | None = None,
        *,
        unsafe_every_refusal: bool = False,
    ) -> None:
        self.directory = directory
        self.max_bytes = MAX_LOG_BYTES if max_bytes is None else max_bytes
        # A test box's (`lnk sandbox check` shows the leak): every refusal its own line, and
        # refusals may take the whole bound.
        self.unsafe_every_refusal = unsafe_every_refusal
        self.refusal_bytes = _refusal_share(self.max_bytes)  # the rest: allowed lines
        if unsafe_every_refusal:
            self.refusal_bytes = self.max_bytes
        self.admit_margin = min(ADMIT_MARGIN_BYTES, self.max_bytes // 8)
        self.box_max_bytes = MAX_BOX_BYTES if box_max_bytes is None else box_max_bytes
        self.box_admit_margin = min(ADMIT_MARGIN_BYTES, self.box_max_bytes // 8)
        self._box_used = 0  # the folder's size at the last scan, plus the lines written since
        self._box_scanned = -BOX_SCAN_S  # monotonic time of that scan: none yet
        self.scanner: Executor | None = None  # the thread that scans (else the caller's)
        self._scanning: asyncio.Future[int] | None = None
        self._written_since = 0  # bytes written while a scan runs: added to its result
        self._full: set[tuple[str, str]] = set()  # (sandbox or "the box", what) warned about
        self._counters: dict[str, RefusalCounter] = {}
        # One open file per sandbox, and its size: a line costs one write, not an open, an
        # fstat and a close (those were a tenth of a small request's time in the proxy).
        self._open: dict[str, tuple[int, int]] = {}
        self._kept: dict[str, KeptFields] = {}  # per sandbox: no sandbox's lines time another's

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

    def box_used(self) -> int:
        """The box's wire logs' size: scanned at most every `BOX_SCAN_S`, counted between
        (with a `scanner`, the scan runs there and its result counts from when it is back)."""
        now = time.monotonic()
        if now - self._box_scanned >= BOX_SCAN_S and self._scanning is None:
            self._box_scanned = now
            if self.scanner is None:
                self._scanned(_folder_size(self.directory))
            else:
                self._written_since = 0
                loop = asyncio.get_running_loop()
                self._scanning = loop.run_in_executor(self.scanner, _folder_size, self.directory)
                self._scanning.add_done_callback(self._scan_done)
        return self._box_used

    def _scan_done(self, future: asyncio.Future[int]) -> None:
        self._scanning = None
        if not future.cancelled() and future.exception() is None:
            self._scanned(future.result() + self._written_since)

    def _scanned(self, size: int) -> None:
        self._box_used = size
        if size + self.box_admit_margin <= self.box_max_bytes:  # room again: warn anew
            self._full = {(whose, what) for whose, what in self._full if whose != "the box"}

    def can_admit(self, sandbox: str) -> bool:
        """Whether a new exchange's line is sure to be written (room in the sandbox's log and
        in the box's, and an open file)."""
        opened = self._file(sandbox)
        if opened is None or opened[1] + self.admit_margin > self.max_bytes:
            return False
        if self.box_used() + self.box_admit_margin > self.box_max_bytes:
            self._warn_full("the box", "new exchanges (refused: log-full)", self._box_used)
            return False
        return True

    def write(self, entry: WireEntry) -> None:
        if self.unsafe_every_refusal:
            self._append(entry)
            return
        if entry.decision == "refused" and not entry.repeated:
            counter = self._counters.setdefault(entry.sandbox, RefusalCounter())
            key = (entry.rule, entry.method, entry.target, entry.reason)
            if not counter.admit(key, time.monotonic()):
                return  # counted: one line with the count when its window ends
        self._append(entry)

    def flush(self, sandbox: str, *, every: bool = False) -> None:
        """Write the counts of the sandbox's ended windows (of all, when `every`)."""
        counter = self._counters.get(sandbox)
        if counter is None:
            return
        for (rule, method, target, why), repeats in counter.due(time.monotonic(), every=every):
            reason = f"{repeats} more like it within {AGGREGATE_WINDOW_S:g} s"
            if why:
                reason = f"{reason}: {why}"
            self._append(
                WireEntry(sandbox, method, target, "refused", rule, reason=reason, repeated=repeats)
            )

    def _append(self, entry: WireEntry) -> None:
        kept = self._kept.get(entry.sandbox)
        if kept is None:
            kept = self._kept[entry.sandbox] = {}
        line = format_line(entry, datetime.now(UTC), kept).encode("ascii")
        opened = self._file(entry.sandbox)
        if opened is None:
            return
        fd, size = opened
        refusal = entry.decision == "refused" and not self.unsafe_every_refusal
        limit = self.refusal_bytes if refusal else self.max_bytes
        box_limit = _refusal_share(self.box_max_bytes) if refusal else self.box_max_bytes
        if size + len(line) > limit:
            self._warn_full(entry.sandbox, f"{entry.decision} lines (dropped)", size)
            return
        if self.box_used() + len(line) > box_limit:
            self._warn_full("the box", f"{entry.decision} lines (dropped)", self._box_used)
            return
        try:
            os.write(fd, line)
        except OSError as exc:
            log.error("wire log of %s: cannot write: %s", entry.sandbox, exc)
            return
        self._open[entry.sandbox] = (fd, size + len(line))
        self._box_used += len(line)
        self._written_since += len(line)

    def _warn_full(self, whose: str, what: str, size: int) -> None:
        if (whose, what) not in self._full:
            self._full.add((whose, what))
            log.warning("wire log of %s is full for %s: %d bytes", whose, what, size)

    def close(self, sandbox: str) -> None:
        """The sandbox's listener is closed: write its counts, close its file (a later line
        reopens it)."""
        self.flush(sandbox, every=True)
        self._counters.pop(sandbox, None)
        self._kept.pop(sandbox, None)
        opened = self._open.pop(sandbox, None)
        self._full = {(whose, what) for whose, what in self._full if whose != sandbox}
        if opened is not None:
            os.close(opened[0])


def _refusal_share(bound: int) -> int:
    """Refusals stop at three quarters of a bound: the last quarter is for allowed lines."""
    return bound - bound // 4


def _folder_size(directory: Path) -> int:
    """The bytes of every `*.log` file in `directory` (links are not followed)."""
    total = 0
    try:
        with os.scandir(directory) as entries:
            for found in entries:
                if not found.name.endswith(LOG_SUFFIX):
                    continue
                with contextlib.suppress(FileNotFoundError):  # removed by retention meanwhile
                    info = found.stat(follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        total += info.st_size
    except OSError as exc:
        log.error("wire logs in %s: cannot read their size: %s", directory, exc)
    return total
