"""What the kernel denied each sandbox, read from Landlock's audit records as they are logged.

The reader subscribes to the audit subsystem's read-only multicast group (NETLINK_AUDIT,
AUDIT_NLGRP_READLOG; root holds CAP_AUDIT_READ): it does not become the host's audit daemon,
adds no audit rule, and the host's auditd (if any) keeps receiving every record. Landlock logs a
denial only while audit is enabled: where it is off (no auditd ever ran: the kernel's default
without `audit=1`) the controller turns it on (AUDIT_SET enabled=1, nothing else) unless the
box's config says `denials.enable_audit = false`; a locked setting (enabled=2) is left as is.
`lnk box status` says which. The confiner passes LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON so that
the sandbox's program, which it execs, is logged at all.

Each denial's domain is mapped to its sandbox by the domain's first record (status=allocated),
which names the host uid that created it: each sandbox runs as a host user of its own.

Denials are hostile input (a sandbox chooses the paths and can deny itself in a loop): per
sandbox a count and at most MAX_EXAMPLES distinct examples are kept, each line escaped and cut;
once a sandbox's examples are full its records are only counted (no parsing); the socket's
buffer is bounded, and what the kernel drops past it (ENOBUFS) is counted as lost. The reader is
one daemon thread; the end of a run only drains what is already queued (never waits).

Does NOT: see a denial the kernel has not yet passed to the group when the run ends (kauditd
sends records asynchronously: a sandbox already denied something waits for its domain's end
record, which follows every denial, but a run whose first denial is still queued when it ends
is missed),
see what the sandbox's mount view refuses before Landlock looks (a noexec `/usr` under a finite
`[commands]` list, a read-only bind, a path not in the view: the kernel logs none of those),
see denials when audit cannot be
enabled, or see what seccomp refuses or the proxy denies (those are logged elsewhere).
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

from lnk_controller.denial_hints import Refused, explain, key, priority
from lnk_controller.denial_records import AUDIT_LANDLOCK_ACCESS, Access, Domain, parse
from lnk_shared.display import shown_cut

__all__ = ["STATUS_FILE", "DenialReader", "Summary", "write_status"]

log = logging.getLogger(__name__)

NETLINK_AUDIT = 9
AUDIT_NLGRP_READLOG = 1
AUDIT_GET = 1000
AUDIT_SET = 1001
AUDIT_STATUS_ENABLED = 1
_NLMSG = struct.Struct("=IHHII")
_NLM_F_REQUEST = 1
NLMSG_ERROR = 2
CONTROL_TIMEOUT_S = 2.0  # the kernel answers audit's control requests at once
MAX_CONTROL_REPLIES = 8  # messages read for one answer (an ack may come first)
MAX_EXAMPLES = 5  # distinct denials kept per sandbox: a summary, not a log
MAX_LINE_CHARS = 300  # one example's shown line: a path is the sandbox's choice
MAX_PENDING_DOMAINS = 64  # domains seen before their owner is known (normally none)
RECV_BUFFER_BYTES = 1 << 20  # the socket's buffer: a flood past it is dropped by the kernel
MAX_DRAIN_RECORDS = 4096  # records the end of a run reads itself before it returns
STATUS_FILE = "denials.status"  # in the run dir: what `lnk box status` says of denials
SUMMARY_LINES = 2
TTY_IOCTL_TYPE = 0x54  # the type byte of the terminal ioctls (include/uapi/asm-generic/ioctls.h)
# The end of a run waits this long, at most, for the `deallocated` record of each domain of the
# sandbox that denied something: the kernel logs it an RCU grace period and a work item after
# the domain's last process is gone (milliseconds); a record dropped past the kernel's backlog
# costs this once.
DEALLOCATED_WAIT_S = 1.0  # examples said on stderr after a failed run; the rest in `show`


def _terminal_probe(access: Access) -> bool:
    """A terminal ioctl (TCGETS and its family, 0x54xx) on a device that is no terminal: what
    every `isatty` on a redirected stream does, which fails there with or without Landlock
    (ENOTTY). Counted, never an example: it is never why a program failed."""
    return access.ioctl is not None and access.ioctl >> 8 == TTY_IOCTL_TYPE


@dataclass
class Summary:
    """A sandbox's denials: how many, and the first few distinct ones (said at the end)."""

    count: int = 0
    examples: list[Access] = field(default_factory=list)
    _keys: set[tuple[str, str]] = field(default_factory=set)

    def full(self) -> bool:
        return len(self.examples) >= MAX_EXAMPLES

    def add(self, access: Access) -> None:
        self.count += 1
        k = key(access)
        if self.full() or k in self._keys or _terminal_probe(access):
            return
        self._keys.add(k)
        self.examples.append(access)

    def lines(self, home: str | None, refused: Refused) -> list[str]:
        """The examples as shown lines, what a program needed first (denial_hints.priority)."""
        ranked = sorted(self.examples, key=priority)
        return [shown_cut(explain(a, home, refused), MAX_LINE_CHARS) for a in ranked]

    def said(self, sandbox_id: str, lines: list[str]) -> str | None:
        """One short line for stderr after a failed run; None when nothing worth an example
        was denied (terminal probes only: `show` still counts them)."""
        if not lines:
            return None
        head = "; ".join(lines[:SUMMARY_LINES])
        more = self.count - min(len(lines), SUMMARY_LINES)
        tail = f"; {more} more (lnk sandbox show {sandbox_id})" if more > 0 else ""
        return f"denied: {head}{tail}"


@dataclass
class _Sandbox:
    sandbox_id: str
    summary: Summary = field(default_factory=Summary)
    open_domains: set[str] = field(default_factory=set)  # seen allocated, not yet deallocated


def _request(kind: int, payload: bytes = b"") -> bytes:
    return _NLMSG.pack(_NLMSG.size + len(payload), kind, _NLM_F_REQUEST, 1, 0) + payload


def _enabled(ctl: socket.socket) -> int:
    """Audit's `enabled` (0 off, 1 on, 2 locked on), asked of the kernel (AUDIT_GET)."""
    ctl.send(_request(AUDIT_GET))
    for _ in range(MAX_CONTROL_REPLIES):
        data = ctl.recv(65536)
        _, kind, _, _, _ = _NLMSG.unpack_from(data)
        if kind == AUDIT_GET and len(data) >= _NLMSG.size + 8:
            return int(struct.unpack_from("=I", data, _NLMSG.size + 4)[0])
        if kind == NLMSG_ERROR and len(data) >= _NLMSG.size + 4:
            code = -struct.unpack_from("=i", data, _NLMSG.size)[0]
            if code:
                raise OSError(code, os.strerror(code))
    raise OSError(errno.EPROTO, "the kernel did not answer AUDIT_GET")


def _audit_enabled(enable: bool) -> str:
    """Audit's state said as `lnk box status` shows it; turns it on when asked and off."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT) as ctl:
        ctl.settimeout(CONTROL_TIMEOUT_S)
        ctl.bind((0, 0))
        enabled = _enabled(ctl)
        if enabled == 0 and enable:
            status = struct.pack("=II", AUDIT_STATUS_ENABLED, 1) + bytes(32)
            ctl.send(_request(AUDIT_SET, status))
            if _enabled(ctl) == 1:
                return "on (turned on by the controller: it was off)"
            return "off (the controller could not turn it on): runs do not say what was denied"
    if enabled == 0:
        return "off (denials_enable_audit = false): runs do not say what was denied"
    return "on" if enabled == 1 else "on (locked by the host)"


def write_status(run_dir: Path, status: str) -> None:
    """Say once, for `lnk box status`, whether runs can say what they were denied."""
    path = run_dir / STATUS_FILE
    path.write_text(status + "\n", encoding="utf-8")
    path.chmod(0o644)


class DenialReader:
    """Reads Landlock's denials for the running sandboxes; see the module's docstring."""

    def __init__(self, *, enable_audit: bool = True) -> None:
        self._enable_audit = enable_audit
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a domain of a sandbox ended
        self._by_uid: dict[int, _Sandbox] = {}
        self._by_domain: dict[str, _Sandbox] = {}
        self._pending: dict[str, list[Access]] = {}
        self._sock: socket.socket | None = None
        self.lost = 0
        self.status = "not started"

    def start(self) -> None:
        """Subscribe; a box that cannot (no audit in the kernel) says so once, and runs."""
        try:
            self.status = _audit_enabled(self._enable_audit)
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER_BYTES)
            sock.bind((0, AUDIT_NLGRP_READLOG))
            sock.setblocking(False)
        except OSError as exc:
            self.status = (
                f"unavailable ({os.strerror(exc.errno or 0)}): runs do not say what was denied"
            )
            log.warning("denials: %s", self.status)
            return
        self._sock = sock
        threading.Thread(target=self._loop, name="denials", daemon=True).start()

    @property
    def available(self) -> bool:
        return self._sock is not None

    def started(self, sandbox_id: str, host_uid: int) -> None:
        with self._lock:
            self._by_uid[host_uid] = _Sandbox(sandbox_id)

    def ended(self, sandbox_id: str, host_uid: int) -> Summary | None:
        """The sandbox's denials, once what is queued is read; None where audit is unreadable.

        A domain that denied anything is logged `deallocated` (with the kernel's own count) once
        its last process is gone: the record comes after every denial of the domain, so waiting
        for it (at most DEALLOCATED_WAIT_S, and only for a sandbox that was denied something)
        is what makes the summary whole."""
        if self._sock is None:
            return None
        self._drain(MAX_DRAIN_RECORDS)
        with self._changed:
            held = self._by_uid.get(host_uid)
            if held is not None and held.sandbox_id == sandbox_id:
                self._changed.wait_for(lambda: not held.open_domains, DEALLOCATED_WAIT_S)
            self._by_uid.pop(host_uid, None)
            for domain in [d for d, s in self._by_domain.items() if s is held]:
                del self._by_domain[domain]
        return held.summary if held is not None and held.sandbox_id == sandbox_id else Summary()

    def _loop(self) -> None:
        assert self._sock is not None
        while True:
            select.select([self._sock], [], [])
            self._drain(MAX_DRAIN_RECORDS)

    def _drain(self, limit: int) -> None:
        assert self._sock is not None
        with self._lock:
            for _ in range(limit):
                try:
                    data = self._sock.recv(65536)
                except BlockingIOError:
                    return
                except OSError as exc:
                    # ENOBUFS: the kernel dropped records past the buffer (the domain's end
                    # record still counts them). Anything else is counted too, never raised:
                    # the end of a run must not fail on what only explains it.
                    self.lost += 1
                    if exc.errno == errno.ENOBUFS:
                        continue
                    if self.lost == 1:
                        log.warning("denials: reading the audit group: %s", exc)
                    return
                self._record(data)

    def _record(self, data: bytes) -> None:
        if len(data) < _NLMSG.size:
            return
        length, kind, _, _, _ = _NLMSG.unpack_from(data)
        if kind not in (AUDIT_LANDLOCK_ACCESS, AUDIT_LANDLOCK_ACCESS + 1):
            return
        text = data[_NLMSG.size : max(_NLMSG.size, min(length, len(data)))]
        # The fast path for a flood: a domain whose examples are full is only counted.
        start = text.find(b"domain=")
        if kind == AUDIT_LANDLOCK_ACCESS and start >= 0:
            domain = text[start + 7 : start + 7 + 17].split(b" ", 1)[0].decode("ascii", "replace")
            held = self._by_domain.get(domain)
            if held is not None and held.summary.full():
                held.summary.count += 1
                return
        parsed = parse(kind, text.decode("utf-8", errors="replace"))
        if isinstance(parsed, Access):
            held = self._by_domain.get(parsed.domain)
            if held is not None:
                held.summary.add(parsed)
            elif parsed.domain in self._pending or len(self._pending) < MAX_PENDING_DOMAINS:
                waiting = self._pending.setdefault(parsed.domain, [])
                if len(waiting) < MAX_EXAMPLES:
                    waiting.append(parsed)
        elif isinstance(parsed, Domain):
            waiting = self._pending.pop(parsed.domain, [])
            if parsed.status != "allocated" or parsed.uid is None:
                ended = self._by_domain.pop(parsed.domain, None)
                if ended is not None:
                    ended.open_domains.discard(parsed.domain)
                    # The kernel counted every denial, the ones it dropped past its backlog too.
                    ended.summary.count = max(ended.summary.count, parsed.denials or 0)
                    self._changed.notify_all()
                return
            held = self._by_uid.get(parsed.uid)
            if held is None:
                return  # not a sandbox of this box: another program's own Landlock domain
            self._by_domain[parsed.domain] = held
            held.open_domains.add(parsed.domain)
            for access in waiting:
                held.summary.add(access)
