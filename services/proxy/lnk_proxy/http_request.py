"""One proxy request head from the sandbox, parsed strictly: bytes in, a `ProxyRequest` or a
`RequestRefused` out. Sans-io: no sockets, no clocks, no logging.

Accepted: `CONNECT host:port` and absolute-form `http://` requests, in HTTP/1.1 or HTTP/1.0
(Python's `http.client` still sends `CONNECT ... HTTP/1.0`). Anything another parser could
read differently is refused with a stable rule id (`RULES`): lines end in CRLF only, header
names are tokens, no obs-fold, no control characters in values, a host is letters, digits,
`.`, `-`, `_` or a bracketed IPv6 literal. Framing sent upstream is derived, never copied.

What this does NOT do:
- decide whether a host may be reached, normalize names (IDNA, odd IPv4 spellings) or resolve
  them: that is the policy's job, and `host` is passed on exactly as written;
- read bodies, parse chunked data or responses: the I/O module must re-frame a chunked body
  chunk by chunk, not copy bytes blindly;
- check `Proxy-Authorization` (it is kept in `headers` for the caller and never sent upstream);
- see inside a CONNECT tunnel: the TLS name and inner `Host` (domain fronting) are invisible;
- carry `Upgrade` (plain-http WebSocket) upstream: it is hop-by-hop and dropped.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from dataclasses import dataclass
from typing import Literal, NamedTuple

Version = Literal["HTTP/1.1", "HTTP/1.0"]
Headers = tuple[tuple[str, str], ...]

__all__ = [
    "HOP_BY_HOP_HEADERS",
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "MAX_LINE",
    "REFUSAL_STATUS",
    "RULES",
    "BodyLength",
    "ProxyRequest",
    "RequestRefused",
    "cut_for_log",
    "find_head_end",
    "format_upstream_head",
    "parse_request_head",
    "refusal_response",
    "shown_target",
]

MAX_HEAD_BYTES = 32 * 1024  # nginx's default head budget (4 x 8 KiB); bounds memory per client
MAX_LINE = 8 * 1024  # Apache's and nginx's per-line limit: an origin would refuse longer anyway
MAX_HEADERS = 100  # Apache's LimitRequestFields; real clients send a dozen or two
MAX_CONTENT_LENGTH_DIGITS = 18  # below 2**63: a length every peer can hold in a signed int64
MAX_PORT = 65535  # TCP's port space
LOG_LIMIT = 300  # the wire's log cuts untrusted names here (DESIGN.md)

HTTP_PORT = 80  # the port an http:// URI means without one
_VERSIONS: dict[bytes, Version] = {b"HTTP/1.1": "HTTP/1.1", b"HTTP/1.0": "HTTP/1.0"}
REFUSAL_STATUS = b"403 Forbidden"  # the one status every refusal gets, whatever the rule

RULES = frozenset(
    {
        "incomplete-head",  # no blank line at the end, or data after it
        "head-too-large",  # past MAX_HEAD_BYTES or a line past MAX_LINE
        "too-many-headers",  # past MAX_HEADERS
        "bad-request-line",  # not `METHOD SP target SP version`, or bytes outside printable ASCII
        "bad-method",  # a method that is not a token
        "bad-version",  # neither HTTP/1.1 nor HTTP/1.0
        "origin-form",  # `GET /path`: a proxy needs the absolute URI
        "bad-target",  # neither absolute-form nor CONNECT's authority-form; or a fragment
        "bad-scheme",  # an absolute URI whose scheme is not http
        "connect-with-path",  # CONNECT with a scheme, path, query or fragment
        "userinfo",  # `user@` in a host
        "bad-host-char",  # a character no host holds (\, #, ?, %, NUL, space, stray brackets)
        "bad-host",  # empty, unbracketed IPv6, or a bracketed literal that is not IPv6
        "bad-port",  # missing (CONNECT), empty, non-digits, 0 or > 65535
        "missing-host",  # HTTP/1.1 http request without Host
        "host-mismatch",  # Host differs from the target, or several Host headers
        "bad-header",  # a name that is not a token, obs-fold, control characters in a value
        "ambiguous-framing",  # CL and TE, differing CLs, TE in HTTP/1.0, a CONNECT with a body
        "bad-content-length",  # a Content-Length that is not 1 to 18 digits
        "bad-transfer-encoding",  # a Transfer-Encoding other than exactly `chunked`
    }
)

# RFC 9110 7.6.1 and the older proxy ones; plus every `Proxy-*` name, dropped by prefix.
HOP_BY_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization"}
    | {"proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
)
# Set by this module from the parse, never copied from the client (see `upstream_headers`).
_DERIVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding"})
_NEVER_SENT = HOP_BY_HOP_HEADERS | _DERIVED_HEADERS
# The fields the parse itself reads, by lowercased name.
_FRAMING_FIELDS = {
    name: name for name in ("host", "content-length", "transfer-encoding", "connection")
}

_TOKEN_CHARS = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
_TOKEN = re.compile(_TOKEN_CHARS + rb"+")
_FIELD_VALUE = rb"[^\x00-\x08\x0a-\x1f\x7f]*"  # no control characters but HT (RFC 9110 5.5)
# A whole head: `METHOD SP target SP version CRLF`, field lines, CRLF. What it refuses,
# `_diagnose` names; what it accepts is exactly what the line-by-line reading accepts.
_HEAD = re.compile(
    rb"(" + _TOKEN_CHARS + rb"+) ([\x21-\x7e]+) (HTTP/1\.[01])\r\n"
    rb"((?:" + _TOKEN_CHARS + rb"+:" + _FIELD_VALUE + rb"\r\n)*)\r\n"
)
# One field line of a head `_HEAD` accepted: its name and its value without surrounding OWS.
_FIELD = re.compile(
    rb"(" + _TOKEN_CHARS + rb"+):[ \t]*((?:" + _FIELD_VALUE + rb"[^\x00-\x20\x7f])?)[ \t]*\r\n"
)
# The common authority: a name of `_NAME_CHARS` and an optional port (range checked after).
_NAME_AUTHORITY = re.compile(r"([A-Za-z0-9._-]+)(?::([0-9]{1,5}))?")
_PRINTABLE_ASCII = re.compile(rb"[\x21-\x7e]+( [\x21-\x7e]+)*")
_CONTROL_IN_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://")
_PORT = re.compile(r"[0-9]{1,5}")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")
_IPV6_CHARS = frozenset("0123456789abcdefABCDEF:.")
_RULE_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_NO_OPTIONS: frozenset[str] = frozenset()


class RequestRefused(Exception):
    """A request head the proxy will not serve: `rule` goes to the sandbox, `reason` to the log.
    Not an `LnkError`: it never leaves the proxy, whose I/O answers it with `refusal_response`."""

    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(f"{rule}: {reason}")
        self.rule = rule
        self.reason = reason


class BodyLength(NamedTuple):
    """How the request's body is framed: `length` is set only for kind "length"."""

    kind: Literal["none", "length", "chunked"]
    length: int | None = None


@dataclass(frozen=True)
class ProxyRequest:
    """A parsed, syntactically safe request; whether it may go anywhere is the policy's call."""

    method: str
    kind: Literal["connect", "http"]
    host: str  # as written in the target (brackets kept on IPv6), not normalized
    port: int
    path: str  # http: the origin-form path and query to send upstream; connect: ""
    headers: Headers  # as received; values decoded as latin-1 (byte-exact)
    version: Version
    keep_alive: bool  # may the client connection carry another request after this one
    framing: BodyLength

    def body_length(self) -> BodyLength:
        """The body's framing: ("none", None), ("length", n) or ("chunked", None)."""
        return self.framing

    def header_values(self, name: str) -> tuple[str, ...]:
        """Every value of header `name` (case-insensitive), in the order received."""
        wanted = name.lower()
        return tuple(value for key, value in self.headers if key.lower() == wanted)

    def authority(self) -> str:
        """`host[:port]` for the upstream Host header (the port omitted when it is 80)."""
        if self.kind == "http" and self.port == HTTP_PORT:
            return self.host
        return f"{self.host}:{self.port}"

    def upstream_headers(self) -> Headers:
        """Host from the target; the headers received minus hop-by-hop ones, those `Connection`
        names, every `Proxy-*` and framing; then framing from `body_length()` (kept chunked, or
        one Content-Length): `Connection: content-length` cannot turn a body into a request."""
        named = _connection_options(self.headers)
        kept: list[tuple[str, str]] = [("Host", self.authority())]
        for name, value in self.headers:
            lower = name.lower()
            if lower in _NEVER_SENT or lower in named or lower.startswith("proxy-"):
                continue
            kept.append((name, value))
        if self.framing.kind == "length":
            kept.append(("Content-Length", str(self.framing.length)))
        elif self.framing.kind == "chunked":
            kept.append(("Transfer-Encoding", "chunked"))
        return tuple(kept)


def find_head_end(untrusted_buffer: bytes | bytearray) -> int | None:
    """The offset just past the head's blank line, None if more bytes are needed.

    Raises RequestRefused("head-too-large") once MAX_HEAD_BYTES arrived without a blank line.
    """
    end = untrusted_buffer.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES)
    if end >= 0:
        return end + 4
    if len(untrusted_buffer) >= MAX_HEAD_BYTES:
        raise RequestRefused("head-too-large", f"no blank line in the first {MAX_HEAD_BYTES} B")
    return None


def parse_request_head(untrusted: bytes) -> ProxyRequest:
    """Parse one request head (request line, headers, blank line; nothing after it).

    The grammar is `_HEAD` (request line, field lines, blank line) and the common target and
    authority shapes `_HTTP_TARGET` and `_NAME_AUTHORITY`, each matched in one pass; a head or
    a target they do not match is read again piece by piece (`_diagnose`, `_parse_authority`)
    only to name the rule it breaks."""
    if len(untrusted) > MAX_HEAD_BYTES:
        raise RequestRefused("head-too-large", f"{len(untrusted)} B > {MAX_HEAD_BYTES} B")
    if not untrusted.endswith(b"\r\n\r\n"):
        raise RequestRefused("incomplete-head", "the head does not end with a blank line")
    lines = untrusted[:-4].split(b"\r\n")
    if b"" in lines:
        raise RequestRefused("incomplete-head", "a blank line before the end: data after the head")
    longest = max(map(len, lines))
    if longest > MAX_LINE:
        raise RequestRefused("head-too-large", f"a line of {longest} B > {MAX_LINE} B")
    if len(lines) - 1 > MAX_HEADERS:
        raise RequestRefused("too-many-headers", f"{len(lines) - 1} headers > {MAX_HEADERS}")
    match = _HEAD.fullmatch(untrusted)
    if match is None:
        _diagnose(lines)
        raise RequestRefused("bad-header", "a head this parser cannot read")  # not reached
    raw_method, raw_target, raw_version = match.group(1, 2, 3)
    version = _VERSIONS[raw_version]
    method, target = raw_method.decode("ascii"), raw_target.decode("ascii")
    fields = _FIELD.findall(untrusted, match.start(4), match.end(4))
    headers = tuple((name.decode("ascii"), value.decode("latin-1")) for name, value in fields)
    if method == "CONNECT":
        kind: Literal["connect", "http"] = "connect"
        host, port = _parse_connect_target(target)
        path = ""
    else:
        kind = "http"
        host, port, path = _parse_absolute_target(target)
    hosts: list[str] = []
    lengths: list[str] = []
    codings: list[str] = []
    options: list[str] = []
    for name, value in headers:
        wanted = _FRAMING_FIELDS.get(name.lower())
        if wanted == "host":
            hosts.append(value)
        elif wanted == "content-length":
            lengths.append(value)
        elif wanted == "transfer-encoding":
            codings.append(value)
        elif wanted == "connection":
            options.append(value)
    _check_host_header(hosts, kind, version, host, port)
    framing = _framing(lengths, codings, kind, version)
    keep_alive = _keep_alive(_options(options), kind, version)
    return ProxyRequest(method, kind, host, port, path, headers, version, keep_alive, framing)


def _diagnose(lines: list[bytes]) -> None:
    """Name the rule a head that `_HEAD` refused breaks (RequestRefused), line by line."""
    _parse_request_line(lines[0])
    for line in lines[1:]:
        _parse_header_line(line)


def format_upstream_head(request: ProxyRequest) -> bytes:
    """The origin-form head for the origin, in the client's HTTP version. HTTP/1.1 asks for
    `Connection: keep-alive` (the caller may pool the connection for this sandbox's next request
    judged to the same address); HTTP/1.0 says `Connection: close`. Raises ValueError for a
    CONNECT (a tunnel sends no head)."""
    if request.kind != "http":
        raise ValueError("a CONNECT has no upstream head: its connection becomes a tunnel")
    fields = "".join([f"{name}: {value}\r\n" for name, value in request.upstream_headers()])
    connection = "keep-alive" if request.version == "HTTP/1.1" else "close"
    head = f"{request.method} {request.path} {request.version}\r\n{fields}Connection: {connection}"
    return (head + "\r\n\r\n").encode("latin-1")


def refusal_response(rule: str) -> bytes:
    """The one answer every refusal gets: 403, the rule id in the body, then the close; the
    reason is for the wire's log. ValueError for a malformed rule id (a bug, not client data)."""
    if not _RULE_ID.fullmatch(rule):
        raise ValueError(f"not a rule id: {rule!r}")
    body = f"lnk: refused ({rule})\n".encode("ascii")
    return (
        b"HTTP/1.1 %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s" % (REFUSAL_STATUS, len(body), body)
    )


def shown_target(request: ProxyRequest) -> str:
    """The request's target as the wire's log shows it: `host:port` or the absolute URI."""
    if request.kind == "connect":
        return f"{request.host}:{request.port}"
    return f"http://{request.authority()}{request.path}"


def cut_for_log(text: str, limit: int = LOG_LIMIT) -> str:
    """`text` for the wire's log: control and format characters (escapes, bidi overrides, line
    separators) removed, then cut to at most `limit` characters, ending in `…` when cut."""
    if text.isascii() and text.isprintable():  # the common case, at C speed: nothing to remove
        clean = text
    else:
        clean = "".join(c for c in text if unicodedata.category(c)[0] not in "CZ" or c == " ")
    if len(clean) <= limit:
        return clean
    return clean[: limit - 1] + "…" if limit > 0 else ""


def _quote(untrusted: str | bytes) -> str:
    text = untrusted.decode("latin-1") if isinstance(untrusted, bytes) else untrusted
    return repr(cut_for_log(text, 80))


def _parse_request_line(line: bytes) -> tuple[str, str, Version]:
    if not _PRINTABLE_ASCII.fullmatch(line):
        raise RequestRefused("bad-request-line", f"not printable ASCII parts: {_quote(line)}")
    parts = line.split(b" ")
    if len(parts) != 3:
        raise RequestRefused("bad-request-line", f"{len(parts)} parts, not 3: {_quote(line)}")
    raw_method, raw_target, raw_version = parts
    if not _TOKEN.fullmatch(raw_method):
        raise RequestRefused("bad-method", f"the method is not a token: {_quote(raw_method)}")
    version = _VERSIONS.get(raw_version)
    if version is None:
        raise RequestRefused("bad-version", f"not HTTP/1.1 nor HTTP/1.0: {_quote(raw_version)}")
    return raw_method.decode("ascii"), raw_target.decode("ascii"), version


def _parse_header_line(line: bytes) -> tuple[str, str]:
    if line[:1] in (b" ", b"\t"):
        raise RequestRefused("bad-header", f"obs-fold (a continuation line): {_quote(line)}")
    raw_name, colon, raw_value = line.partition(b":")
    if not colon or not _TOKEN.fullmatch(raw_name):
        raise RequestRefused("bad-header", f"the name is not a token: {_quote(raw_name)}")
    value = raw_value.strip(b" \t")
    if _CONTROL_IN_VALUE.search(value):
        raise RequestRefused("bad-header", f"a control character in {_quote(raw_name)}'s value")
    return raw_name.decode("ascii"), value.decode("latin-1")


def _parse_connect_target(target: str) -> tuple[str, int]:
    if any(c in target for c in "/?#"):
        raise RequestRefused("connect-with-path", f"not just host:port: {_quote(target)}")
    host, port = _parse_authority(target)
    if port is None:
        raise RequestRefused("bad-port", f"CONNECT without a port: {_quote(target)}")
    return host, port


def _parse_absolute_target(target: str) -> tuple[str, int, str]:
    if target.startswith(("/", "*")):
        raise RequestRefused("origin-form", f"not an absolute http:// URI: {_quote(target)}")
    scheme = _SCHEME.match(target)
    if scheme is None:
        raise RequestRefused("bad-target", f"not an absolute URI: {_quote(target)}")
    if scheme.group(1).lower() != "http":
        raise RequestRefused("bad-scheme", f"only http:// is proxied: {_quote(scheme.group(1))}")
    # The authority runs to the first "/" only: a `?` or `#` before it is refused as a host
    # character, where RFC 3986 and WHATWG parsers would disagree about where the host ends.
    authority, slash, rest = target[scheme.end() :].partition("/")
    path = "/" + rest if slash else "/"
    if "#" in path:
        raise RequestRefused("bad-target", f"a fragment in the target: {_quote(target)}")
    host, port = _parse_authority(authority)
    return host, HTTP_PORT if port is None else port, path


def _parse_authority(text: str) -> tuple[str, int | None]:
    """`host[:port]` → (host as written, port or None); every oddity refused."""
    common = _NAME_AUTHORITY.fullmatch(text)
    if common is not None:  # a name and a port in range: what the reading below accepts
        host, digits = common.group(1, 2)
        if digits is None:
            return host, None
        if 0 < int(digits) <= MAX_PORT:
            return host, int(digits)
    if "@" in text:
        raise RequestRefused("userinfo", f"userinfo in a host: {_quote(text)}")
    if text.startswith("["):
        host, bracket, rest = text.partition("]")
        host += bracket
        inner = host[1:-1]
        if not bracket or not inner or not set(inner) <= _IPV6_CHARS:
            raise RequestRefused("bad-host-char", f"a bad IPv6 literal: {_quote(text)}")
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            raise RequestRefused("bad-host", f"not an IPv6 address: {_quote(text)}") from None
        if rest and not rest.startswith(":"):
            raise RequestRefused("bad-host-char", f"text after the IPv6 literal: {_quote(text)}")
        port_text: str | None = rest[1:] if rest else None
    else:
        host, colon, port_part = text.partition(":")
        if not set(host) <= _NAME_CHARS:
            raise RequestRefused("bad-host-char", f"a character no host holds: {_quote(text)}")
        if ":" in port_part:
            raise RequestRefused("bad-host", f"an IPv6 address needs brackets: {_quote(text)}")
        port_text = port_part if colon else None
        if not host:
            raise RequestRefused("bad-host", f"an empty host: {_quote(text)}")
    if port_text is None:
        return host, None
    if not _PORT.fullmatch(port_text) or not 0 < int(port_text) <= MAX_PORT:
        raise RequestRefused("bad-port", f"not a port from 1 to {MAX_PORT}: {_quote(port_text)}")
    return host, int(port_text)


def _comparable(host: str) -> str:
    if host.startswith("["):
        return f"[{ipaddress.IPv6Address(host[1:-1]).compressed}]"
    return host.lower().removesuffix(".")


def _check_host_header(values: list[str], kind: str, version: str, host: str, port: int) -> None:
    """Host (its `values`), when present, names the target; HTTP/1.1 http requests must send
    it. A CONNECT needs none (Python's http.client sends none) and may omit the port in it."""
    if len(values) > 1:
        raise RequestRefused("host-mismatch", f"{len(values)} Host headers")
    if not values:
        if kind == "http" and version == "HTTP/1.1":
            raise RequestRefused("missing-host", "an HTTP/1.1 request without Host")
        return
    header_host, header_port = _parse_authority(values[0])
    if header_port is None:
        header_port = HTTP_PORT if kind == "http" else port
    if (_comparable(header_host), header_port) != (_comparable(host), port):
        shown = f"Host {_quote(values[0])} vs target {_quote(host)} port {port}"
        raise RequestRefused("host-mismatch", shown)


def _framing(lengths: list[str], codings: list[str], kind: str, version: str) -> BodyLength:
    """From the Content-Length `lengths` and the Transfer-Encoding `codings` received."""
    if lengths and codings:
        raise RequestRefused("ambiguous-framing", "both Content-Length and Transfer-Encoding")
    if codings:
        if version != "HTTP/1.1":
            raise RequestRefused("ambiguous-framing", "Transfer-Encoding in HTTP/1.0")
        if len(codings) != 1 or codings[0].lower() != "chunked":
            shown = _quote(", ".join(codings))
            raise RequestRefused("bad-transfer-encoding", f"not exactly chunked: {shown}")
        framing = BodyLength("chunked")
    elif lengths:
        items = [item.strip(" \t") for value in lengths for item in value.split(",")]
        for item in items:
            if not (item.isascii() and item.isdigit()) or len(item) > MAX_CONTENT_LENGTH_DIGITS:
                raise RequestRefused("bad-content-length", f"not a length: {_quote(item)}")
        if len({int(item) for item in items}) > 1:
            raise RequestRefused("ambiguous-framing", f"differing lengths: {_quote(str(items))}")
        framing = BodyLength("length", int(items[0]))
    else:
        framing = BodyLength("none")
    if kind == "connect":
        if framing.kind == "chunked" or framing.length:
            raise RequestRefused("ambiguous-framing", "a CONNECT with a body: tunnel bytes")
        return BodyLength("none")
    return framing


def _connection_options(headers: Headers) -> frozenset[str]:
    return _options([value for name, value in headers if name.lower() == "connection"])


def _options(values: list[str]) -> frozenset[str]:
    """The lowercased options the Connection header `values` list."""
    if not values:
        return _NO_OPTIONS
    return frozenset(option.strip(" \t").lower() for option in ",".join(values).split(","))


def _keep_alive(options: frozenset[str], kind: str, version: str) -> bool:
    """RFC 9112 9.3: HTTP/1.1 persists unless `close` is among the Connection `options`; a
    proxy does not keep HTTP/1.0 clients; a CONNECT's connection becomes the tunnel and never
    carries another request."""
    if kind == "connect" or version != "HTTP/1.1":
        return False
    return "close" not in options
