"""A spec's `[[services]]`: a service the sandbox reaches through the proxy with a secret added
outside. The spec names the secret (`lnk secret set NAME` keeps it); it never holds one.

    [[services]]
    kind = "telegram"                       # the Bot API; host api.telegram.org
    secret = "telegram-bot"                 # a name from `lnk secret list`
    allow = ["getMe", "getUpdates", "sendMessage"]

    [[services]]
    kind = "bearer"                         # any API taking `Authorization: Bearer <secret>`
    host = "api.example.com"
    secret = "example-key"
    allow = ["GET /v1/items", "POST /v1/items/*"]

Flag: `--service KIND:SECRET[@HOST]:ALLOW,ALLOW` (`--service telegram:bot:getMe,sendMessage`).

The rules here are pure, on the text of the entry:
- `kind` is one of `KINDS`; `allow` is not empty (an empty list would open nothing: say so);
  Telegram's entries are Bot API method names, compared case-insensitively, and `setWebhook`,
  `logOut` and `close` are refused whatever the spec says (the seed's refusals, not the spec's to
  lift); a bearer entry is `METHOD /path` or `METHOD /prefix/*`, the path already in its judged
  form (no `.`/`..` segment, no `//`, `%`, `;`, `?`, `#`, NUL, control character, trailing `/`).
- A value never comes from a spec: a key that would carry one (`token`, `value`, `key`,
  `password`, ...) is refused, and so is any text in the entry that looks like a token rather
  than a name (`lnk_shared.secret_names.looks_like_a_value`). Those refusals never repeat the
  text, since it may be the value.

Security limitations: this does NOT know whether the named secret exists (the controller checks
at launch), nor that `host` serves what `kind` says: a bearer rule sends its secret to the host
the spec names, so a spec naming another's host sends the owner's key there (the approval shows
host and secret together for that reason).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lnk_shared.errors import ServiceRefused, UsageError
from lnk_shared.hosts import parse_host_pattern
from lnk_shared.secret_names import check_secret_name, looks_like_a_value
from lnk_shared.spec import MAX_ENTRIES, Origin

__all__ = [
    "BEARER_METHODS",
    "KINDS",
    "SERVICE_KEYS",
    "TELEGRAM_ALWAYS_REFUSED",
    "TELEGRAM_HOST",
    "ServiceRule",
    "parse_service_flag",
    "parse_service_table",
    "service_placeholder",
]

TELEGRAM_HOST = "api.telegram.org"
KINDS = ("telegram", "bearer")
# A bot's token moved elsewhere (setWebhook sends every update to a URL of the caller's
# choosing), or the bot logged out of the cloud Bot API (logOut) or its server closed (close).
TELEGRAM_ALWAYS_REFUSED = frozenset({"setwebhook", "logout", "close"})
BEARER_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
MAX_PATH_CHARS = 1024  # a route, not a document: far above any API's
SERVICE_KEYS = {
    "kind": f"one of {', '.join(KINDS)}",
    "secret": "a secret's name (lnk secret list)",
    "allow": "a list of methods (telegram) or 'METHOD /path' entries (bearer)",
    "host": "the service's host name (bearer; telegram is api.telegram.org)",
}
# Keys a person might use to put the value itself in the spec.
_VALUE_KEYS = frozenset(
    {"token", "value", "key", "api_key", "apikey", "password", "secret_value", "bearer", "auth"}
)
_TELEGRAM_METHOD = re.compile(r"[A-Za-z][A-Za-z0-9]{0,63}")
_SEGMENT = re.compile(r"[A-Za-z0-9_~!$&'()*+,=:@-]+")


@dataclass(frozen=True, order=True)
class ServiceRule:
    """One `[[services]]` entry, checked. `allow` is sorted and deduplicated; Telegram's
    methods are kept as written but compared case-insensitively (`allows_method`)."""

    kind: str
    host: str
    secret: str
    allow: tuple[str, ...]

    def canonical(self) -> dict[str, Any]:
        allow = sorted({a.lower() for a in self.allow}) if self.kind == "telegram" else self.allow
        return {"kind": self.kind, "host": self.host, "secret": self.secret, "allow": list(allow)}

    def allows_method(self, method: str) -> bool:
        """Telegram: whether the Bot API method `method` is allowed (never the refused ones)."""
        folded = method.lower()
        if self.kind != "telegram" or folded in TELEGRAM_ALWAYS_REFUSED:
            return False
        return folded in {a.lower() for a in self.allow}


def service_placeholder(rule: ServiceRule) -> str:
    """What the sandbox's program holds in the secret's place. Telegram's has a bot token's
    shape (`digits:word`), which libraries check before they send anything."""
    if rule.kind == "telegram":
        return f"0:lnk-secret-{rule.secret}"
    return f"lnk-secret-{rule.secret}"


def parse_service_table(table: object, origin: Origin) -> ServiceRule:
    """One `[[services]]` table of a spec file."""
    if not isinstance(table, dict):
        raise origin.error("expected a table ([[services]] with kind, secret and allow)")
    for key in table:
        _refuse_value_key(str(key), origin)
        if key not in SERVICE_KEYS:
            known = ", ".join(SERVICE_KEYS)
            raise origin.error(f"unknown key {key!r}; [[services]] takes: {known}")
    allow = table.get("allow")
    if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
        raise origin.error(f"allow: expected {SERVICE_KEYS['allow']}")
    return _rule(table.get("kind"), table.get("host"), table.get("secret"), allow, origin)


def parse_service_flag(text: str, origin: Origin) -> ServiceRule:
    """`--service KIND:SECRET[@HOST]:ALLOW,ALLOW`."""
    kind, sep, rest = text.partition(":")
    secret_part, sep2, allow_text = rest.partition(":")
    if not sep or not sep2:
        if _holds_a_value(text):
            _refuse_value_text("the flag", origin)
        raise origin.error(
            "expected KIND:SECRET[@HOST]:ALLOW,ALLOW (e.g. telegram:bot:getMe,sendMessage)"
        )
    secret, _, host = secret_part.partition("@")
    allow = [a.strip() for a in allow_text.split(",") if a.strip()]
    return _rule(kind, host or None, secret, allow, origin)


def _rule(
    kind: object, host: object, secret: object, allow: list[str], origin: Origin
) -> ServiceRule:
    for text in (host, secret, *allow):
        if isinstance(text, str) and _holds_a_value(text):
            _refuse_value_text("an entry", origin)
    if kind not in KINDS:
        raise origin.error(f"kind: expected one of {', '.join(KINDS)}, got {_kind_shown(kind)}")
    if not isinstance(secret, str):
        raise origin.error("secret: expected the name of a secret (`lnk secret list`)")
    try:
        check_secret_name(secret)
    except UsageError as exc:  # worded for the command line: said here for the spec
        raise origin.error(f"secret: {exc}") from None
    if not allow:
        raise origin.error(
            "allow is empty, which would open nothing: list the methods (telegram) or "
            "'METHOD /path' entries (bearer) this sandbox may call"
        )
    if len(allow) > MAX_ENTRIES:
        raise origin.error(f"allow: more than {MAX_ENTRIES} entries")
    if kind == "telegram":
        if host not in (None, TELEGRAM_HOST):
            raise origin.error(
                f"host: a telegram rule goes to {TELEGRAM_HOST} only; name another API with "
                'kind = "bearer"'
            )
        return ServiceRule("telegram", TELEGRAM_HOST, secret, _telegram_allow(allow, origin))
    if not isinstance(host, str):
        raise origin.error("host: a bearer rule names the host its secret goes to")
    try:
        pattern = parse_host_pattern(host, allow_port=False)
    except ValueError as exc:
        raise origin.error(f"host: {host!r}: {exc}") from None
    if str(pattern).startswith("*"):
        raise origin.error("host: one host, not a wildcard: the secret goes to exactly it")
    return ServiceRule("bearer", str(pattern), secret, _bearer_allow(allow, origin))


def _telegram_allow(allow: list[str], origin: Origin) -> tuple[str, ...]:
    methods: dict[str, str] = {}
    for entry in allow:
        if not _TELEGRAM_METHOD.fullmatch(entry):
            raise origin.error(f"allow: {entry!r} is not a Bot API method name (e.g. sendMessage)")
        if entry.lower() in TELEGRAM_ALWAYS_REFUSED:
            raise ServiceRefused(
                f"{origin.key} allow = {entry!r}",
                "setWebhook, logOut and close are never allowed: they hand the bot's updates "
                "to another URL or end the bot's session",
            )
        methods.setdefault(entry.lower(), entry)
    return tuple(sorted(methods.values(), key=str.lower))


def _bearer_allow(allow: list[str], origin: Origin) -> tuple[str, ...]:
    entries = set()
    for entry in allow:
        method, sep, path = entry.partition(" ")
        if not sep or method not in BEARER_METHODS:
            raise origin.error(
                f"allow: {entry!r}: expected 'METHOD /path' with METHOD one of "
                f"{', '.join(BEARER_METHODS)}"
            )
        _check_route(path, entry, origin)
        entries.add(f"{method} {path}")
    return tuple(sorted(entries))


def _check_route(path: str, entry: str, origin: Origin) -> None:
    if len(path) > MAX_PATH_CHARS or not path.startswith("/"):
        raise origin.error(f"allow: {entry!r}: the path starts with '/' (at most {MAX_PATH_CHARS})")
    body = path[:-2] if path.endswith("/*") else path
    segments = body[1:].split("/")
    for segment in segments:
        if segment in (".", "..") or not _SEGMENT.fullmatch(segment) or segment == "*":
            raise origin.error(
                f"allow: {entry!r}: each segment is plain (no '.', '..', '//', '%', ';', '?', "
                "'#', spaces or a trailing '/'); end with '/*' for every path below"
            )


def _holds_a_value(text: str) -> bool:
    """Whether `text`, or a word of it, looks like a token rather than a name."""
    return looks_like_a_value(text) or any(
        looks_like_a_value(word) for word in re.split("[ /@:,.]", text)
    )


def _refuse_value_key(key: str, origin: Origin) -> None:
    if key.lower() in _VALUE_KEYS:
        raise origin.error(
            f"{key!r}: a spec never holds a secret's value (a spec is a file anyone may have "
            "written or read): keep it with `lnk secret set NAME` and give its name in `secret`"
        )


def _refuse_value_text(where: str, origin: Origin) -> None:
    raise origin.error(
        f"{where} looks like a secret's value (not repeated here): a spec names a secret, "
        "never holds one; keep it with `lnk secret set NAME` and give its name in `secret`"
    )


def _kind_shown(kind: object) -> str:
    if isinstance(kind, str) and len(kind) <= 32 and kind.isprintable():
        return repr(kind)
    return f"a {type(kind).__name__}"
