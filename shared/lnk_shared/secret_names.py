"""What a secret's name and value may be: pure checks shared by `lnk secret`, the controller's
secret store and the spec (which names a secret, never holds one).

A name is an identifier an owner picks (`telegram-bot`, `OPENAI_KEY`). A value is what the proxy
puts at one template position upstream (a path segment after `/bot`, an `Authorization` header),
so it is visible ASCII only: a space, CR, LF, NUL or any control character in it could split a
header or a request line there, and no token or API key a service issues holds one.

Every error here names what was wrong and never repeats the value, nor any part of it: the
message may end up in a terminal, a log or a bug report.

Security limitations: these checks do NOT tell a real secret from a guessable one, and do NOT
stop an owner from giving a secret a name that says what it is.
"""

from __future__ import annotations

import re

from lnk_shared.errors import UsageError

__all__ = [
    "MAX_SECRET_BYTES",
    "MAX_SECRET_NAME_CHARS",
    "check_secret_name",
    "check_secret_value",
    "looks_like_a_value",
]

MAX_SECRET_NAME_CHARS = 64  # a name a person types and reads in a spec
# Far above any token or API key issued today (Telegram ~46, OpenAI ~170, JWTs ~2 KiB),
# and small enough that one header holding it stays well under any server's header limit.
MAX_SECRET_BYTES = 4096

_SHOWN_NAME_CHARS = 24  # a rejected name longer than this may be a pasted value: not repeated
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
_VISIBLE_ASCII = re.compile(rb"[\x21-\x7e]+")
# Shapes of values a spec might carry by mistake in place of a name: a Telegram bot token
# (digits, a colon, 35 URL-safe characters), a provider key with its prefix, a JWT.
_VALUE_SHAPES = (
    re.compile(r"\d{5,}:[A-Za-z0-9_-]{30,}"),
    re.compile(r"(sk|pk|rk|xox[abp]|gh[pousr]|glpat)[-_][A-Za-z0-9_-]{16,}"),
    re.compile(r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}(\.[A-Za-z0-9_-]*)?"),
)
# A long run of mixed letters and digits is a key, not a name a person picked.
_LONG_RANDOM = re.compile(r"[A-Za-z0-9_-]{32,}")


def check_secret_name(name: str) -> str:
    """`name` if it may name a secret; UsageError saying what a name may be otherwise."""
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"{_shown_name(name)} is not a secret's name: a name is 1 to "
            f"{MAX_SECRET_NAME_CHARS} letters, digits, '_' or '-', starting with a letter"
        )
    if looks_like_a_value(name):
        raise UsageError(
            f"{_shown_name(name)} looks like a secret's value, not its name: give it a name "
            "(`lnk secret set NAME` reads the value from standard input)"
        )
    return name


def check_secret_value(value: bytes) -> bytes:
    """`value` if it may be kept; UsageError (never quoting it) otherwise."""
    if not value:
        raise UsageError("the secret's value is empty: give it on standard input or at the prompt")
    if len(value) > MAX_SECRET_BYTES:
        raise UsageError(
            f"the secret's value is {len(value)} bytes long; the most is {MAX_SECRET_BYTES}"
        )
    if not _VISIBLE_ASCII.fullmatch(value):
        raise UsageError(
            "the secret's value holds a space, a control character or a non-ASCII byte: a token "
            "or key is visible ASCII only (check for a stray character from the copy)"
        )
    return value


def looks_like_a_value(text: str) -> bool:
    """Pure: does `text` look like a token or key rather than a name a person picked?"""
    if any(shape.fullmatch(text) for shape in _VALUE_SHAPES):
        return True
    if _LONG_RANDOM.fullmatch(text):
        has_digit = any(c.isdigit() for c in text)
        has_upper = any(c.isupper() for c in text)
        has_lower = any(c.islower() for c in text)
        return has_digit and has_upper and has_lower
    return False


def _shown_name(name: str) -> str:
    """A rejected name, for the message: only its start, in case it was a pasted value."""
    if len(name) > _SHOWN_NAME_CHARS or looks_like_a_value(name) or not name.isprintable():
        return "the name given"
    return repr(name)
