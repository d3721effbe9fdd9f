"""The shape of a JSON text: its structural bytes outside strings (`:` `[` `]` `{` `}`), in
order, found with bytes methods only (each a loop in C: no Python step per byte or per token).

`strict_json`'s reader as before its C pass (`_read_as_before`: for every body that pass,
lnk_proxy/native/json_scan.c, does not accept, and every body when it is not built) compares
the shape of the client's bytes with the shape of its own serialisation of what the C parser
made of them: a key given twice in one object leaves one pair in the parse
(the last wins), so the serialisation has one `:` fewer and the shapes differ. `depth` bounds
the nesting from the shape, so the fast path never walks the value in Python.

Why the scan is exact, for a text a strict parser accepted (the precondition: `shape` is never
given anything else):
- Outside strings, valid JSON has no backslash and no quote other than a string's delimiters;
  a UTF-8 continuation or lead byte is never below 0x80, so every `\\`, `"`, `:`, `[`, `]`,
  `{` and `}` byte is that ASCII character, wherever it stands.
- Inside a string, a backslash begins an escape of exactly one following character. In a
  maximal run of backslashes the first begins an escape (the byte before it is no backslash,
  so nothing escapes it), so the run is read as pairs from its left, and an odd run's last one
  escapes the byte after the run, which is not a backslash. `bytes.replace` matches left to
  right without overlap in the original bytes, so deleting every `\\\\` removes exactly the
  escaped backslashes; each backslash left escapes the byte that still follows it. Deleting
  every `\\"` then removes exactly the escaped quotes: no pair can form across a deletion,
  because a backslash left was never the end of a run. `\\u0022` is six bytes with no quote
  in them and so is no delimiter, as in the parser.
- What remains has only delimiter quotes, which alternate open and close: splitting on `"`
  puts the outside of strings at the even places.

`structure_within` is the one function here given a text no parser has read: the readers call
it first, so a body of millions of values or brackets is refused before a parser builds them
(msgspec and Python's json hold a few tens of bytes per value, and nesting costs a C stack
frame per level). It counts the bytes that begin a value or a member outside strings (`[` `{`
`,` `:`: an array of N values has one bracket and N - 1 commas), and measures nesting as
`depth_within` does. On a text a strict parser accepts the count is exact, by the argument
above; on any other text it may be anything, which costs nothing: the parser refuses that text
anyway. Its memory stays a few times the text's: the quotes are counted before the text is
split on them, and each string is a value or a key (each of which a `,` or `:` counts, bar one),
so a text with more quotes than the values allowed is refused before any split.

Security limitations: this does NOT validate JSON (on other input the shape means nothing),
and its cost is a few passes over the text, plus, where the C module is not built, up to
`max_depth` passes over the shape in `depth_within` (2 MiB of brackets nested 999 deep, in a
thousand runs of 999, took ~2 s of the proxy's one loop that way; with lnk_proxy._json_scan's
`nesting_within` it is one pass).
"""

from __future__ import annotations

from collections.abc import Callable

_nesting_within: Callable[[bytes, int], bool] | None
try:  # the one-pass nesting count (lnk_proxy/native/json_scan_module.c), built into the wheel
    from lnk_proxy._json_scan import nesting_within as _nesting_within
except ImportError:  # a checkout without it: the passes below, same answers (strict_json warns)
    _nesting_within = None

__all__ = [
    "count_nesting_per_level",
    "depth_within",
    "pairs_in",
    "passes_within",
    "shape",
    "structure_within",
]

_one_pass = _nesting_within  # what `count_nesting_per_level(False)` puts back
# Every byte but the structural ones and the quote: deleted before the split on quotes.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'":[]{}')
# The brackets of both kinds as one kind, colons gone: nesting is all `depth_within` reads.
_BRACKETS_ONLY = bytes.maketrans(b"{}", b"[]")
# What `structure_within` keeps of a text with its escapes gone: the quotes, what begins a value
# or a member, and the closing brackets (for the nesting).
_NOT_COUNTED = bytes(b for b in range(256) if b not in b'":[]{},')
# The split on quotes goes this many bytes at a time, so its pieces never hold the whole text.
_SPLIT_BYTES = 64 * 1024


def shape(valid_json: bytes) -> bytes:
    """The structural bytes of `valid_json` outside its strings, in order (see the docstring)."""
    text = valid_json
    if b"\\" in text:  # one memchr first: many bodies have no escape at all
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(text.translate(None, _NOT_STRUCTURE).split(b'"')[::2])


def pairs_in(value: object) -> int:
    """The members of every object in a parsed value (a walk in Python: one step per container,
    so cheaper than a shape only where containers are few per byte)."""
    pairs = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            pairs += len(item)
            stack += [v for v in item.values() if type(v) is dict or type(v) is list]
        elif type(item) is list:
            stack += [v for v in item if type(v) is dict or type(v) is list]
    return pairs


def count_nesting_per_level(on: bool) -> None:
    """The proxy's `unsafe_per_level_nesting` (tests of `lnk sandbox check` only): with `on`,
    `depth_within` takes up to `max_depth` passes even where the C module is built (the cost
    class `nesting_within` closed); off, the one pass again. For the whole process."""
    global _nesting_within  # noqa: PLW0603 - a test box's switch, set once at the proxy's start
    _nesting_within = None if on else _one_pass


def depth_within(structure: bytes, max_depth: int) -> bool:
    """Whether the containers of a shape nest at most `max_depth` deep (the outermost is 1).
    Each pass deletes every innermost empty pair (`[]` in the original bytes of the pass,
    without overlap), so exactly one level goes per pass: empty after `max_depth` passes iff
    no container lies deeper. With the C module, one pass that answers the same."""
    if _nesting_within is not None:
        return _nesting_within(structure, max_depth)
    return passes_within(structure, max_depth)


def passes_within(structure: bytes, max_depth: int) -> bool:
    """`depth_within` by bytes methods alone (see it): up to `max_depth` passes."""
    nesting = structure.translate(_BRACKETS_ONLY, b":")
    for _ in range(max_depth):
        if not nesting:
            return True
        shorter = nesting.replace(b"[]", b"")
        if len(shorter) == len(nesting):  # no pair left to delete: never empty (brackets unpaired)
            return False
        nesting = shorter
    return not nesting


def structure_within(untrusted: bytes, max_values: int, max_depth: int) -> str | None:
    """None when `untrusted` holds at most `max_values` values and members outside strings and
    nests at most `max_depth` deep; else what it is past, for the caller's refusal. Never
    parses: bytes methods only, memory a few times the text's (see the module's docstring)."""
    text = untrusted
    if b"\\" in text:  # one memchr first: many bodies have no escape at all
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    # One translate (a table lookup per byte, far cheaper than a count per kind) keeps what
    # matters; everything after it reads that, a fraction of the text for a real body.
    kept = text.translate(None, _NOT_COUNTED)
    if kept.count(b'"') > 2 * (max_values + 1):  # a string is a value or a key: the docstring
        return f"more than {max_values} values"
    outside, inside = [], False
    for start in range(0, len(kept), _SPLIT_BYTES):
        pieces = kept[start : start + _SPLIT_BYTES].split(b'"')
        outside.append(b"".join(pieces[1 if inside else 0 :: 2]))
        inside ^= len(pieces) % 2 == 0  # an odd count of quotes in the piece: the side changes
    structure = b"".join(outside)
    if len(structure.translate(None, b"]}")) > max_values:
        return f"more than {max_values} values"
    if not depth_within(structure.translate(None, b","), max_depth):
        return f"nested past {max_depth} levels"
    return None
