"""Landlock's audit records read as data: what was denied, in which domain, to which user.

The kernel (security/landlock/audit.c, Linux 6.15+, Landlock ABI 7) logs each denial as an
AUDIT_LANDLOCK_ACCESS record (`domain=<hex> blockers=<right,...> path=... | daddr=... dest=...`)
and, at a domain's first denial and at its end, an AUDIT_LANDLOCK_DOMAIN record (`domain=<hex>
status=allocated ... uid=<host uid>`, `status=deallocated denials=N`). The uid is the one that
created the domain, mapped to the host: each sandbox has a host user of its own, so the uid
names the sandbox (denials.py keeps the mapping).

Every value comes from a sandboxed program (a path it chose): hostile input. Values the kernel
logs as "untrusted strings" come either quoted (no quote, space or control inside) or as hex
(anything else); both are decoded here to the bytes' text, never trusted further: whoever
shows them escapes them (lnk_shared.display). Pure functions, no I/O.

Does NOT: decide what to grant (denial_hints.py) or read the socket (denials.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "AUDIT_LANDLOCK_ACCESS",
    "AUDIT_LANDLOCK_DOMAIN",
    "Access",
    "Domain",
    "parse",
]

AUDIT_LANDLOCK_ACCESS = 1423  # include/uapi/linux/audit.h
AUDIT_LANDLOCK_DOMAIN = 1424
# A record's text is at most a few kilobytes (a path is at most PATH_MAX, hex doubles it); one
# longer than this is not the kernel's and is dropped rather than scanned.
MAX_RECORD_CHARS = 3 * 4096

_HEADER = re.compile(r"audit\(\d+\.\d+:(\d+)\): ")
_FIELD = re.compile(r'([a-z_]+)=("[^"]*"|\S*)')
_HEX = re.compile(r"(?:[0-9A-F]{2})+")


@dataclass(frozen=True)
class Access:
    """One denial: the rights that blocked it and the object (a path, or address and port)."""

    serial: int
    domain: str
    blockers: tuple[str, ...]
    path: str | None = None
    address: str | None = None
    port: int | None = None
    ioctl: int | None = None  # fs.ioctl_dev: the command


@dataclass(frozen=True)
class Domain:
    """A domain's first denial (`allocated`, with its creator's host uid) or its end
    (`deallocated`, with the kernel's count of the domain's denials)."""

    serial: int
    domain: str
    status: str
    uid: int | None = None
    denials: int | None = None


def _value(raw: str) -> str:
    """An untrusted string's value: quoted text, or its bytes in hex (audit_log_untrustedstring)."""
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        return raw[1:-1]
    if _HEX.fullmatch(raw):
        return bytes.fromhex(raw).decode("utf-8", errors="replace")
    return raw


def _fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for match in _FIELD.finditer(text):
        fields.setdefault(match.group(1), match.group(2))
    return fields


def parse(kind: int, text: str) -> Access | Domain | None:
    """A Landlock record of `kind` read from its text; None for any other type or a malformed
    record (a record the kernel did not write that way is not guessed at)."""
    if kind not in (AUDIT_LANDLOCK_ACCESS, AUDIT_LANDLOCK_DOMAIN) or len(text) > MAX_RECORD_CHARS:
        return None
    header = _HEADER.match(text)
    if header is None:
        return None
    serial = int(header.group(1))
    fields = _fields(text[header.end() :])
    domain = fields.get("domain", "")
    if not re.fullmatch(r"[0-9a-f]{1,16}", domain):
        return None
    if kind == AUDIT_LANDLOCK_DOMAIN:
        uid, count = fields.get("uid", ""), fields.get("denials", "")
        return Domain(
            serial,
            domain,
            fields.get("status", ""),
            int(uid) if uid.isdigit() else None,
            int(count) if count.isdigit() else None,
        )
    blockers = tuple(b for b in fields.get("blockers", "").split(",") if b)
    if not blockers:
        return None
    if "path" in fields:
        command = re.fullmatch(r"0x([0-9a-f]{1,8})", fields.get("ioctlcmd", ""))
        ioctl = int(command.group(1), 16) if command else None
        return Access(serial, domain, blockers, path=_value(fields["path"]), ioctl=ioctl)
    dest = fields.get("dest", "")
    if "daddr" in fields and dest.isdigit():
        return Access(serial, domain, blockers, address=fields["daddr"], port=int(dest))
    return Access(serial, domain, blockers)
