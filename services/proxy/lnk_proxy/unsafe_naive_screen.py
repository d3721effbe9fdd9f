"""UNSAFE, tests of `lnk sandbox check` only (the proxy's `unsafe_naive_content_screen`): the
hosted fast form's screen made naive, the one a fast form without the C pass would have.

The fast form (hosted_bodies' docstring) forwards a conversation member as the client's own
bytes only where the C pass (`strict_json.read(content_as_bytes=True)`) proved it holds nothing
judged under any spelling and reads the same to every parser. This screen instead finds the
top-level content members with the standard library's decoder (lenient: a key given twice is
kept once, bad UTF-8 carried through) and searches their bytes as written: no fetch name as a
quoted string, every `"type": "..."` written plain and one of `PLAIN_TYPES`. So it lets through
what the strict pass sends down the full parse and its judgement:
- a judged key spelt with an escape (`"\\u0073ource": {"type": "url", ...}`), at any depth;
- a key given twice (`{"\\u0074ype": "server_tool_use", "type": "text"}`: a parser that keeps
  the first reads a server tool's block);
- bytes that are not UTF-8, and a lone surrogate escape (parsers replace or refuse them).
Only the spelling screen is naive: the bounds stand (values and scanned nesting refused first,
`strict_json.refuse_many_values`; content nested past `MAX_DEPTH` goes the strict way).
Whatever it passes is forwarded as the client's bytes, a warning logged each time; whatever it
does not, goes the strict way. `lnk sandbox check`'s fast-form probes (`plan_fast_form`) must
report `leaked` with it on: the honesty test that they can see this class.
"""

from __future__ import annotations

import json
import logging
import re

from lnk_proxy.hosted_bodies import CONTENT_KEYS, FETCH_NAMES, PLAIN_TYPES
from lnk_proxy.json_shape import depth_within, shape
from lnk_proxy.strict_json import MAX_DEPTH, refuse_many_values

__all__ = ["naive_spans"]

log = logging.getLogger(__name__)
_FETCH_AS_WRITTEN = re.compile(b'"(?:' + b"|".join(n.encode() for n in FETCH_NAMES) + b')"')
_TYPE_AS_WRITTEN = re.compile(rb'"type"\s*:\s*("[^"\\]*"|[^\s"])')
_PLAIN = frozenset(f'"{t}"'.encode() for t in PLAIN_TYPES)
_SPACE = " \t\r\n"


def naive_spans(body: bytes | bytearray) -> tuple[tuple[int, int, int], ...] | None:
    """(index in CONTENT_KEYS, start, end) of each top-level content member when the naive
    screen passes them all (at least one); None when it does not, or the body is no object."""
    untrusted = bytes(body)
    refuse_many_values(untrusted)  # BodyRefused, as on the strict way: the bounds are not naive
    if not depth_within(shape(untrusted), MAX_DEPTH):
        return None
    text = untrusted.decode("utf-8", "surrogateescape")  # bad UTF-8 carried, never refused
    spans = _members(text)
    if not spans:
        return None
    as_bytes = []
    for index, start, end in spans:
        first = len(text[:start].encode("utf-8", "surrogateescape"))
        last = first + len(text[start:end].encode("utf-8", "surrogateescape"))
        if not _plain_as_written(bytes(body[first:last])):
            return None
        as_bytes.append((index, first, last))
    log.warning(
        "unsafe_naive_content_screen: a hosted request's conversation forwarded as the client's "
        "bytes after the naive screen"
    )
    return tuple(as_bytes)


def _members(text: str) -> list[tuple[int, int, int]]:
    """The top-level content members' (index, start, end) in `text` (characters), by the
    standard library's decoder; [] when the text is no object it reads."""
    decoder = json.JSONDecoder()
    at = _skip(text, 0)
    if not text.startswith("{", at):
        return []
    found: list[tuple[int, int, int]] = []
    at = _skip(text, at + 1)
    try:
        while not text.startswith("}", at):
            key, at = decoder.raw_decode(text, at)
            at = _skip(text, at)
            if not text.startswith(":", at):
                return []
            start = _skip(text, at + 1)
            _, at = decoder.raw_decode(text, start)
            if key in CONTENT_KEYS and all(k != CONTENT_KEYS.index(key) for k, _, _ in found):
                found.append((CONTENT_KEYS.index(key), start, at))
            at = _skip(text, at)
            if text.startswith(",", at):
                at = _skip(text, at + 1)
    except (ValueError, RecursionError):  # the decoder's own depth limit: the strict way
        return []
    return found


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _SPACE:
        at += 1
    return at


def _plain_as_written(member: bytes) -> bool:
    if _FETCH_AS_WRITTEN.search(member):
        return False
    return all(m.group(1) in _PLAIN for m in _TYPE_AS_WRITTEN.finditer(member))
