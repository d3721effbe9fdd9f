"""The proxy's decisions for a service rule (`[[services]]`): which requests to a rule's host go
upstream, the one head that goes there with the secret at its template position, and the
secret scrubbed from what comes back.

Pure: no I/O, no secret store, no sockets. The caller (`server`, `service_relay`) does
1. refuse a CONNECT to any rule's host (`refuse_connect`): a tunnel would carry the sandbox's
   own key past every path rule, so the answer names the plain-http way instead;
2. judge an absolute-form `http://HOST/...` request to a rule's host (`judge_service`): the
   path is judged as written (no percent-escape, dot segment, `//`, `;`, NUL or trailing `/`
   anywhere in it, so there is no decoding for a parser differential to hide in), the token
   position (Telegram) or `Authorization` (bearer) must hold the sandbox's placeholder, never a
   key of its own, and every other credential header refuses the request;
3. fetch the secret for that sandbox's rule from the controller (fail closed when it is gone),
   send `upstream_head(forward, secret)` over verified TLS to the rule's host, and pass the
   answer through a `SecretScrubber`; the wire's log gets `forward.logged_path` (placeholder).

The head sent upstream is rebuilt from what was judged, never the client's bytes: the method,
the judged path with the secret put in, `Host` = the rule's host, the client's headers minus
hop-by-hop, framing and every credential header, then the rule's own credential.

Security limitations: this does NOT look at bodies (a `sendMessage` may carry what the sandbox
read to any chat the bot can reach: the seed says so), nor at the query's parameters, and does
NOT stop a bearer rule's API from doing with the owner's key whatever the allowed routes do.
`lnk_proxy.service_relay` holds a sandbox's rules and secrets and makes the exchange; the
server dispatches every request naming a rule's host there.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass

from lnk_proxy.http_request import HTTP_PORT, Headers, ProxyRequest, RequestRefused
from lnk_shared.hosts import normalize_name
from lnk_shared.spec_services import TELEGRAM_ALWAYS_REFUSED, ServiceRule, service_placeholder

__all__ = [
    "CREDENTIAL_HEADERS",
    "SecretScrubber",
    "ServiceForward",
    "judge_service",
    "placeholder",
    "refuse_connect",
    "rule_for_host",
    "upstream_head",
]

# Every header a client could carry a credential of its own in (so an account it controls at
# the same host would be an exfiltration channel): dropped and, unless it is the placeholder,
# the request refused.
CREDENTIAL_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "cookie",
        "openai-organization",
        "openai-project",
        "anthropic-admin-api-key",
    }
)
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "host"}
    | {"content-length", "proxy-connection"}
)
_PLAIN_SEGMENT = re.compile(r"[A-Za-z0-9_~!$&'()*+,=:@.-]+")
_QUERY = re.compile(r"[A-Za-z0-9_~!$&'()*+,=:@./?%-]*")
_TELEGRAM_METHOD = re.compile(r"[A-Za-z][A-Za-z0-9]{0,63}")


@dataclass(frozen=True)
class ServiceForward:
    """A judged request: `before` + secret + `after` is the upstream path (bearer: no slot,
    `before` is the whole path); `logged_path` has the placeholder in the secret's place."""

    rule: ServiceRule
    method: str
    before: str
    after: str
    logged_path: str
    headers: Headers
    version: str


def placeholder(rule: ServiceRule) -> str:
    """What the sandbox's program holds in the secret's place (`service_placeholder`)."""
    return service_placeholder(rule)


def rule_for_host(rules: Sequence[ServiceRule], host: str) -> ServiceRule | None:
    """The rule whose host `host` names (normalized as the policy does), or None."""
    try:
        name = normalize_name(host)
    except ValueError:
        return None
    return next((r for r in rules if r.host == name), None)


def refuse_connect(rules: Sequence[ServiceRule], request: ProxyRequest) -> None:
    """RequestRefused for a CONNECT to a rule's host, whatever `[internet]` lists."""
    if request.kind != "connect":
        return
    rule = rule_for_host(rules, request.host)
    if rule is not None:
        raise RequestRefused(
            "service-plain-http-only",
            f"CONNECT to {rule.host}, a {rule.kind} rule's host: send plain "
            f"http://{rule.host}/... through HTTP_PROXY, and the proxy adds the secret "
            f"{rule.secret} and speaks TLS upstream",
        )


def judge_service(
    rule: ServiceRule, request: ProxyRequest, *, check_route: bool = True
) -> ServiceForward:
    """The forward for an http request to `rule`'s host, or RequestRefused naming why.
    `check_route=False` (the proxy's `unsafe_skip_service_method_check`, tests only) skips
    the rule's method or route list, so `lnk sandbox check` can show that class leak."""
    if request.kind != "http" or request.port != HTTP_PORT:
        raise RequestRefused(
            "service-plain-http-only", f"{rule.host}:{request.port}: a rule is served on http:80"
        )
    path, _, query = request.path.partition("?")
    if not _QUERY.fullmatch(query):
        raise RequestRefused("service-path", "a query with a character no rule takes")
    if "%" in path or not path.startswith("/") or path.endswith("/"):
        raise RequestRefused("service-path", "a percent-escape, or no or a trailing '/'")
    segments = path[1:].split("/")
    if any(s in ("", ".", "..") or not _PLAIN_SEGMENT.fullmatch(s) for s in segments):
        raise RequestRefused(
            "service-path", "an empty or dot segment, or a character no path takes"
        )
    suffix = f"?{query}" if query else ""
    headers = _judged_headers(rule, request.headers)
    if rule.kind == "telegram":
        before, method_path = _telegram(rule, segments, check_route)
        return ServiceForward(
            rule,
            request.method,
            before,
            f"/{method_path}{suffix}",
            f"{before}{placeholder(rule)}/{method_path}{suffix}",
            headers,
            request.version,
        )
    if check_route and not _bearer_allows(rule, request.method, path):
        raise RequestRefused("service-route", f"{request.method} {path} is not in the rule")
    return ServiceForward(
        rule, request.method, path + suffix, "", path + suffix, headers, request.version
    )


def _telegram(rule: ServiceRule, segments: list[str], check_route: bool) -> tuple[str, str]:
    """(the path up to the token, what follows it) for `/bot<T>/<method>` and
    `/file/bot<T>/<file path>` (a file download: allowed with getFile)."""
    if segments[0] == "file" and len(segments) >= 3 and segments[1].startswith("bot"):
        token, rest, before, method = segments[1][3:], segments[2:], "/file/bot", "getFile"
    elif len(segments) == 2 and segments[0].startswith("bot"):
        token, rest, before, method = segments[0][3:], segments[1:], "/bot", segments[1]
    else:
        raise RequestRefused("service-path", "not /bot<token>/<method> or /file/bot<token>/...")
    if not hmac.compare_digest(token.encode(), placeholder(rule).encode()):
        raise RequestRefused("service-own-key", "the token position holds no placeholder")
    if not _TELEGRAM_METHOD.fullmatch(method):
        raise RequestRefused("service-path", "not a Bot API method name")
    if method.lower() in TELEGRAM_ALWAYS_REFUSED:
        raise RequestRefused("service-never", f"{method} is never allowed")
    if check_route and not rule.allows_method(method):
        raise RequestRefused("service-method", f"{method} is not in the rule")
    return before, "/".join(rest)


def _bearer_allows(rule: ServiceRule, method: str, path: str) -> bool:
    for entry in rule.allow:
        allowed_method, _, allowed = entry.partition(" ")
        if allowed_method != method:
            continue
        if allowed.endswith("/*"):
            if path.startswith(allowed[:-1]) and len(path) > len(allowed) - 1:
                return True
        elif path == allowed:
            return True
    return False


def _judged_headers(rule: ServiceRule, headers: Headers) -> Headers:
    """The client's headers minus hop-by-hop, framing, `Proxy-*`, `Accept-Encoding` and
    credentials; a credential that is not the placeholder (bearer's `Authorization: Bearer
    <placeholder>`) refuses. The answer is asked for as `identity` (`upstream_head`): the
    scrubber reads its bytes, and a compressed answer would carry the secret past it."""
    kept = []
    for name, value in headers:
        lower = name.lower()
        if lower in CREDENTIAL_HEADERS:
            expected = f"Bearer {placeholder(rule)}"
            if not (
                rule.kind == "bearer"
                and lower == "authorization"
                and hmac.compare_digest(value.strip().encode("latin-1"), expected.encode())
            ):
                raise RequestRefused("service-own-key", f"a {lower} header of its own")
            continue
        if lower in _HOP_BY_HOP or lower.startswith("proxy-") or lower == "accept-encoding":
            continue
        kept.append((name, value))
    return tuple(kept)


def upstream_head(forward: ServiceForward, secret: bytes, framing: Headers = ()) -> bytes:
    """The head for the rule's host: the secret only at its template position. `framing` is
    the body's own (Content-Length or Transfer-Encoding), as the caller relays it."""
    value = secret.decode("ascii")
    rule = forward.rule
    path = forward.before + (value + forward.after if rule.kind == "telegram" else "")
    lines = [f"{forward.method} {path} {forward.version}", f"Host: {rule.host}"]
    lines += [f"{name}: {v}" for name, v in (*forward.headers, *framing)]
    if rule.kind == "bearer":
        lines.append(f"Authorization: Bearer {value}")
    lines += ["Accept-Encoding: identity", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class SecretScrubber:
    """Replaces the secret (and its `:` percent-escaped, as URLs carry it) in a stream of
    chunks, across chunk boundaries: holds back only a chunk's end that could begin a form
    (at most the longest form's length - 1 bytes), so a streamed event ending in anything
    else (an SSE event's blank line) goes out with its chunk, never behind the next one."""

    def __init__(self, secret: bytes, replacement: bytes) -> None:
        forms = {secret, secret.replace(b":", b"%3A"), secret.replace(b":", b"%3a")}
        self._forms = sorted(forms, key=len, reverse=True)
        self._replacement = replacement
        self._keep = max(len(f) for f in self._forms) - 1
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._scrub(self._held + chunk)
        if self._keep == 0:
            self._held = b""
            return data
        cut = len(data) - self._partial(data)
        out, self._held = data[:cut], data[cut:]
        return out

    def flush(self) -> bytes:
        data, self._held = self._scrub(self._held), b""
        return data

    def _partial(self, data: bytes) -> int:
        """The length of the longest end of `data` that some form begins with (0: none).

        Only where a form's first byte lies in the last `_keep` bytes can its end begin the
        form, so those places are found with `find` and the earliest that fits is the longest:
        a few C calls per chunk (one slice and a generator per length cost ~20 us a chunk
        for a 54-byte key on the streamed answer's path, and grew with the secret's length)."""
        start = max(0, len(data) - self._keep)
        longest = 0
        for form in self._forms:
            first = form[:1]
            at = data.find(first, start)
            while at >= 0 and len(data) - at > longest:
                if form.startswith(data[at:]):
                    longest = len(data) - at
                    break
                at = data.find(first, at + 1)
        return longest

    def _scrub(self, data: bytes) -> bytes:
        for form in self._forms:
            data = data.replace(form, self._replacement)
        return data
