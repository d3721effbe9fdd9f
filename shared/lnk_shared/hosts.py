"""Host names as a spec lists them: checked, normalized (lower case, IDNA to ASCII, one trailing
dot removed, port kept) and matched on label boundaries.

What this does NOT do: resolve names, or judge addresses (that is `addresses`); a name that is
valid here may still resolve somewhere the proxy refuses to dial.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import idna

__all__ = [
    "LISTED_ONLY_PORTS",
    "MAX_HOST_LENGTH",
    "HostPattern",
    "normalize_name",
    "parse_host_pattern",
]

MAX_HOST_LENGTH = 253  # DNS limit on a name's text form, without the trailing dot
MAX_LABEL_LENGTH = 63  # DNS limit on one label
MAX_PORT = 65535
# Ports an `[internet]` entry reaches only when it names the port itself (`host:22`), never as
# a bare name's "any port" nor through `*`: ssh (22) carries the user's keys and logins and
# forwards ports through the far host, a way out as wide as a shell there, so a spec that
# listed a host for its HTTPS must not open it by accident.
LISTED_ONLY_PORTS = frozenset({22})

_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
_NUMERIC_LABEL = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)$")
# Characters that change what a URL's host means (userinfo, path, query, fragment, escapes) or
# that no name holds; checked before IDNA so a lenient mapping cannot hide them.
_FORBIDDEN = set("/\\@#?%[]{}<>\"'`^|~!$&()+,;= ")


def _has_control(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def normalize_name(text: str) -> str:
    """Return the ASCII form of a DNS name, or raise ValueError saying what is wrong with it."""
    if not text:
        raise ValueError("an empty host name")
    if "\x00" in text or _has_control(text):
        raise ValueError("a host name with a control character or NUL")
    if any(c in _FORBIDDEN or c.isspace() for c in text):
        raise ValueError("a host name may hold only letters, digits, '-' and '.'")
    if ":" in text:
        raise ValueError("a host name with ':' (an IPv6 address or a stray port)")
    name = text[:-1] if text.endswith(".") else text
    if not name or name.startswith(".") or ".." in name:
        raise ValueError("a host name with an empty label")
    if name.isascii() and "xn--" not in name.lower():
        # Plain ASCII with no punycode: IDNA would only lower-case it (and costs ~45 us, a
        # proxy's largest share of deciding a request); the label checks below still apply.
        return _checked(name.lower())
    try:
        ascii_name = idna.encode(name, uts46=True).decode("ascii")
    except idna.IDNAError as exc:
        raise ValueError(f"not a valid international host name ({exc})") from None
    return _checked(ascii_name.lower())


def _checked(ascii_name: str) -> str:
    """The length, label and numeric-last-label checks every normalized name passes."""
    if len(ascii_name) > MAX_HOST_LENGTH:
        raise ValueError(f"a host name longer than {MAX_HOST_LENGTH} characters")
    labels = ascii_name.split(".")
    for label in labels:
        if len(label) > MAX_LABEL_LENGTH:
            raise ValueError(f"a label longer than {MAX_LABEL_LENGTH} characters")
        if label.startswith("-") or label.endswith("-"):
            raise ValueError(f"the label {label!r} starts or ends with a hyphen")
        if not _LABEL.match(label):
            raise ValueError(f"the label {label!r} is not letters, digits and inner '-'")
    if _NUMERIC_LABEL.match(labels[-1]):
        # A name whose last label is numeric is read as an IPv4 address by URL parsers.
        raise ValueError("an address, not a name (its last label is numeric)")
    return ascii_name


@dataclass(frozen=True, order=True)
class HostPattern:
    """A listed host: `name`, or every name below it when `wildcard`; any port when port is None."""

    name: str
    wildcard: bool = False
    port: int | None = None

    def __str__(self) -> str:
        text = f"*.{self.name}" if self.wildcard else self.name
        return text if self.port is None else f"{text}:{self.port}"

    def matches(self, name: str, port: int) -> bool:
        """True when the normalized `name` and `port` fall under this pattern."""
        if self.port is not None and self.port != port:
            return False
        if self.wildcard:
            return name.endswith("." + self.name)
        return name == self.name


def _parse_port(text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 5:
        raise ValueError(f"the port {text!r} is not a number")
    port = int(text)
    if not 1 <= port <= MAX_PORT:
        raise ValueError(f"the port {port} is not between 1 and {MAX_PORT}")
    return port


def parse_host_pattern(text: str, *, allow_port: bool = True) -> HostPattern:
    """Parse `name`, `*.name`, optionally with `:port`; raise ValueError naming what is wrong.

    `*` alone is not a pattern here: callers handle "every host" before calling.
    """
    if not isinstance(text, str):
        raise ValueError("a host must be a string")
    if _has_control(text):
        # Checked before the port is split off, so "name\r\nHost: x" is named for what it is.
        raise ValueError("a host name with a control character or NUL")
    port: int | None = None
    body = text
    if ":" in text and not text.startswith("["):
        body, _, port_text = text.rpartition(":")
        if not allow_port:
            raise ValueError("a port is not allowed here")
        port = _parse_port(port_text)
    wildcard = False
    if body.startswith("*."):
        wildcard = True
        body = body[2:]
    if "*" in body:
        raise ValueError("'*' only as the whole entry or as a leading '*.' label")
    name = normalize_name(body)
    if wildcard and "." not in name:
        raise ValueError(f"'*.{name}' covers a whole top-level domain; list names, or use '*'")
    if name == "localhost" or name.endswith(".localhost"):
        raise ValueError("localhost is this machine, never a listed host; use [localhost] ports")
    return HostPattern(name=name, wildcard=wildcard, port=port)
