"""The answers this machine's resolver takes from /etc/hosts, given on the event loop itself.

Why: a sandbox's uncached lookup went to one of its lookup threads (`lookup_workers`) even when
the answer is a line of /etc/hosts, or no line with nothing after `files` in nsswitch's `hosts:`
(the bench's and the e2e tests' proxies: `hosts: files`). Under a flood of such lookups from one
sandbox, the threads' wake-ups and GIL hand-backs stretched every other sandbox's requests: the
measuring sandbox's median went from 0.27 to 2.3 ms and its p99 about 8x (bench/README.md,
session 11). An answer read here costs a `stat` of two files and a dict look-up, no thread.

What getaddrinfo would do, as far as this answers (`HostsFile.answer`; None means "ask
getaddrinfo", which then answers as it always did):
- nsswitch's `hosts:` line is read for its order (`files_order`, pure): `files` first with no
  action item after it. `files` alone makes a name /etc/hosts does not name a final "no
  address" (glibc: NOTFOUND, then no source left); with other sources after it (`files dns`),
  such a name goes to getaddrinfo. Any other line (files not first, an action item such as
  `[SUCCESS=continue]` after it, several `hosts:` lines, none: glibc's default asks DNS first)
  answers nothing here.
- /etc/hosts is parsed as glibc's files source does for getaddrinfo: every line naming the
  name (canonical name or alias, case-insensitively) counts, IPv4 and IPv6 alike. Only a name
  with exactly one distinct address is answered here: with more, getaddrinfo orders them (RFC
  6724, /etc/gai.conf) and that order decides what is dialed first, so it is asked. A name on a
  line this parser reads differently from glibc (an address it cannot read strictly, a scope)
  is left to getaddrinfo too, and so is a name that looks numeric (`inet_aton` forms).
- Both files are read again when their inode, size or modification time changed (glibc reads
  /etc/hosts on every lookup and nsswitch.conf when it changed): an edit is seen at the next
  lookup. A file over `MAX_BYTES`, or unreadable, answers nothing here.

Security limitations: this does NOT
- judge an answer: the policy judges every address, as from getaddrinfo;
- read /etc/host.conf (glibc ignores its `multi` for getaddrinfo, which gathers every line)
  or HOSTALIASES (which applies to DNS searches only);
- look anything up in DNS: a name /etc/hosts does not settle still takes a lookup thread.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from lnk_shared.addresses import IPAddress

__all__ = ["MAX_BYTES", "FilesOrder", "HostsFile", "files_order", "parse_hosts"]

HOSTS = Path("/etc/hosts")
NSSWITCH = Path("/etc/nsswitch.conf")
# A hosts file of a few thousand lines parses in milliseconds on the loop; block lists of
# hundreds of thousands would stall it once per edit, so those stay with getaddrinfo.
MAX_BYTES = 256 * 1024
# A name inet_aton would read as an address (getaddrinfo then never reads /etc/hosts).
_NUMERIC = re.compile(r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+))*")
_UNCLEAR: tuple[IPAddress, ...] = ()  # the marker of a name on a line read differently


class FilesOrder(Enum):
    ONLY = "only"  # `files` alone: not named there is no address
    FIRST = "first"  # `files` first, other sources after it: not named there goes on
    NOT_FIRST = "not-first"  # anything else: getaddrinfo answers every name


def files_order(nsswitch: str) -> FilesOrder:
    """Where `files` stands in `nsswitch`'s `hosts:` line. Pure: table-tested."""
    lines = []
    for raw in nsswitch.splitlines():
        line = raw.split("#", 1)[0].strip()
        database, colon, sources = line.partition(":")
        if colon and database.strip() == "hosts":
            lines.append(sources.split())
    if len(lines) != 1 or not lines[0] or lines[0][0] != "files":
        return FilesOrder.NOT_FIRST
    rest = lines[0][1:]
    if not rest:
        return FilesOrder.ONLY
    if rest[0].startswith("["):  # an action on files' own outcome: glibc's to apply
        return FilesOrder.NOT_FIRST
    return FilesOrder.FIRST


def parse_hosts(text: str) -> dict[str, tuple[IPAddress, ...]]:
    """Each name of `text` (lower case) with its distinct addresses in file order; a name on
    a line whose address this cannot read strictly maps to () (ask getaddrinfo). Pure."""
    names: dict[str, list[IPAddress]] = {}
    unclear: set[str] = set()
    for raw in text.splitlines():
        fields = raw.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        try:
            address: IPAddress | None = ipaddress.ip_address(fields[0])
        except ValueError:
            address = None
        if address is None or "%" in fields[0]:
            unclear.update(name.lower() for name in fields[1:])
            continue
        for name in fields[1:]:
            kept = names.setdefault(name.lower(), [])
            if address not in kept:
                kept.append(address)
    answers = {name: tuple(addresses) for name, addresses in names.items()}
    for name in unclear:
        answers[name] = _UNCLEAR
    return answers


@dataclass
class _Read:
    version: tuple[int, int, int, int] | None  # st_dev, st_ino, st_size, st_mtime_ns
    text: str | None  # None: unreadable or too large


def _read(path: Path, kept: _Read) -> _Read:
    try:
        info = os.stat(path)
    except OSError:
        return _Read(None, None)
    version = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    if version == kept.version:
        return kept
    if info.st_size > MAX_BYTES:
        return _Read(version, None)
    try:
        with path.open("rb") as file:
            data = file.read(MAX_BYTES + 1)
    except OSError:
        return _Read(None, None)
    if len(data) > MAX_BYTES:
        return _Read(version, None)
    return _Read(version, data.decode("utf-8", "replace"))


class HostsFile:
    """/etc/hosts and nsswitch.conf as getaddrinfo reads them, for the answers they settle."""

    def __init__(self, hosts: Path = HOSTS, nsswitch: Path = NSSWITCH) -> None:
        self.hosts = hosts
        self.nsswitch = nsswitch
        self._hosts_read = _Read(None, None)
        self._nss_read = _Read(None, None)
        self._names: dict[str, tuple[IPAddress, ...]] = {}
        self._order = FilesOrder.NOT_FIRST

    def answer(self, name: str) -> tuple[IPAddress, ...] | None:
        """getaddrinfo's answer for `name` (normalized: lower case, no trailing dot) when
        /etc/hosts settles it: one address, or () for none; None to ask getaddrinfo."""
        nss = _read(self.nsswitch, self._nss_read)
        if nss is not self._nss_read:
            self._nss_read = nss
            self._order = FilesOrder.NOT_FIRST if nss.text is None else files_order(nss.text)
        if self._order is FilesOrder.NOT_FIRST or _NUMERIC.fullmatch(name):
            return None
        hosts = _read(self.hosts, self._hosts_read)
        if hosts is not self._hosts_read:
            self._hosts_read = hosts
            self._names = {} if hosts.text is None else parse_hosts(hosts.text)
        if hosts.text is None:
            return None
        found = self._names.get(name)
        if found is None:
            return () if self._order is FilesOrder.ONLY else None
        return found if len(found) == 1 else None  # () too: a line read differently
