"""A request body from the sandbox as JSON, read strictly and written back by the proxy: what the
upstream parses is the proxy's own serialisation of exactly what was judged, never the client's
bytes, so no difference between two JSON parsers can carry a field past a check; but for
`content_as_bytes`' members, which go as the client's bytes only where the C pass proved them
strict and free of everything judged (hosted_bodies' docstring says why no parser's difference
can then carry one).

Refused (`BodyRefused`, rule `model-body`): a body past `MAX_BODY_BYTES`, a body of more than
`MAX_VALUES` values or nesting past `MAX_SCANNED_DEPTH` (both found before any parse, by
`refuse_many_values`: a parser would build every value before any rule saw one), bytes that are not
UTF-8 (a BOM included), a top level that is not an object, `NaN`/`Infinity` or a number too
large for a double (Python reads `1e400` as infinity, which no JSON can carry back), a key given
twice in one object (parsers disagree on which one wins), nesting past `MAX_DEPTH`, a lone
surrogate escape (`"\\ud800"`, which other parsers replace or refuse) and an integer past
Python's digit limit.

Two readers, one verdict. The fast one is msgspec's C parser, as strict as the rules above
except that it keeps the last of a key given twice and caps numbers a little lower; it only
ever *accepts*, and only a body that one C pass over the client's bytes (`_json_scan`,
lnk_proxy/native/json_scan.c) found to be one strict RFC 8259 text, a top-level object, no key
twice in any object (keys compared as the code points they decode to), no lone surrogate
escape, nesting at most `MAX_DEPTH` and at most `MAX_VALUES` values. Anything else, every
refusal included, is read as before the C pass (`_read_as_before`: `refuse_many_values`, then
msgspec's parse checked by `json_shape`'s passes, then the reference reader, the standard
library's parser with the hooks above, whose verdict and message are the answer): a body the
pass does not accept costs what it did before the pass, plus the pass (but a body past
`MAX_VALUES`, refused at once with `refuse_many_values`'s verdict: the pass counted it exactly
on a strict prefix of it, and that function's count over the whole text is at least as many).
`read` also hands back msgspec's serialisation of the accepted parse (`Parsed.canonical`),
where a string equal to a name is always spelled `"name"`, and the pass's screen for
hosted_bodies' fetch names (`Parsed.fetch_seen`), so no Python pass over the bytes is left on
the fast path. With `content_as_bytes` (a hosted rule's), a top-level content member the same
pass proved holds nothing hosted_bodies judges is not parsed at all: it stays the client's
validated bytes (`msgspec.Raw`, `Parsed.as_bytes` names them) in the value and in `canonical`
(hosted_bodies' docstring says what is proved and why that is safe).

Without the C pass (a build that could not compile it: `_json_scan` will not import) every body
is read as before it, with the same verdicts (tests/unit/lnk_proxy/test_json_scan.py compares
the two over the fuzz corpus), and the proxy logs a warning once: the cost of a large body goes
back up (bench/README.md), no check is lost, so the proxy keeps serving rather than refusing to
start over a speed-up.

Pure: bytes in, a value or bytes out. Security limitations: this does NOT judge what the value
means (`hosted_models` does), and bounds memory only by `MAX_BODY_BYTES` (the parse of an
allowed body holds a few times its size). The serialisation writes a float's exponent as
msgspec does (`1e16` where Python wrote `1e+16`): the same double either way.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import math
from types import ModuleType
from typing import Any, NamedTuple

import msgspec

from lnk_proxy.http_request import RequestRefused
from lnk_proxy.json_shape import depth_within, pairs_in, shape, structure_within

_json_scan: ModuleType | None
try:
    from lnk_proxy import _json_scan
except ImportError:  # not built (see the docstring): every body is read as before the pass
    _json_scan = None
# The top-level keys the pass may prove plain (hosted_bodies.CONTENT_KEYS, in the C's order).
_CONTENT_KEYS: tuple[str, ...] = () if _json_scan is None else _json_scan.CONTENT_KEYS

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_DEPTH",
    "MAX_SCANNED_DEPTH",
    "MAX_VALUES",
    "BodyRefused",
    "Parsed",
    "content_as_written",
    "dumps",
    "loads",
    "read",
    "refuse_many_values",
]

# Anthropic's Messages API takes requests up to 32 MB (its documented request size limit);
# OpenAI's are smaller. A body past this is refused before it is read whole.
MAX_BODY_BYTES = 32 * 1024 * 1024
# Messages, content blocks, tool results and JSON Schemas nest a dozen or two deep in real
# requests; far below Python's recursion limit, so no parse or walk can exhaust the stack.
MAX_DEPTH = 64
# A request of a long chat with tools holds some thousands of values; a million is past any
# real one, and its parse (tens of bytes per value in the proxy's memory, about a second of the
# proxy's CPU at 2**20 on this box's class of machine) is refused before it starts.
MAX_VALUES = 2**20
# Nesting the scan before the parse refuses: up to here a parser's own recursion is cheap and
# `MAX_DEPTH` refuses with the parse's reason, as before; past it (a million brackets fit in
# 2 MB) no parser is given the body.
MAX_SCANNED_DEPTH = 1000


# A walk's step per container costs about what this many bytes of a C pass over the text do
# (measured on this box's class of machine: ~60 ns a step, ~0.3 ns a byte per pass, two passes).
_WALK_BYTES_PER_CONTAINER = 100
_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()
# Whether to pause the cyclic GC around msgspec's parse of a body the C pass accepted (a body
# of many small blocks makes ~10,000 containers: the GC runs inside the parse). Off: measured
# (bench/proxy_hosted.py's `GC paused`, bench/README.md "After the C pass"), it halves the
# parse alone but the collection it puts off comes at the next allocation, so the whole
# filter's p50 moved by 0-3 % either way.
_PAUSE_GC_IN_PARSE = False
log = logging.getLogger(__name__)


class BodyRefused(RequestRefused):
    """A body the proxy will not forward (`rule` to the sandbox, `reason` to the wire's log)."""

    def __init__(self, reason: str, rule: str = "model-body") -> None:
        super().__init__(rule, reason)


class Parsed(NamedTuple):
    """An accepted body: its value, msgspec's serialisation of that value when the fast
    reader accepted it (None when the reference reader did), whether a string in it is one
    of hosted_bodies' FETCH_NAMES when the C pass screened it (None: not screened), and the
    top-level keys whose values are the client's validated bytes (`msgspec.Raw`, in `value`
    and as they came in `canonical`) because the pass proved them plain (`content_as_bytes`)."""

    value: dict[str, Any]
    canonical: bytes | None
    fetch_seen: bool | None = None
    as_bytes: tuple[str, ...] = ()


def read(
    body: bytes | bytearray, *, bounded: bool = True, content_as_bytes: bool = False
) -> Parsed:
    """The body as a JSON object, read strictly (see the module's docstring). `bounded=False`
    (the proxy's `unsafe_unbounded_model_bodies`, tests only) skips `refuse_many_values`.
    `content_as_bytes` (a hosted rule's: hosted_bodies' docstring says why it is safe) keeps
    each of hosted_bodies' CONTENT_KEYS at the top level as the client's bytes, not parsed,
    when the C pass proved that nothing the rule judges is in any of them; else, or without
    the pass, the body is parsed whole as without it. A bytearray (a large body read in place
    from the socket, `hosted_relay`) is judged where it lies on the content path; every other
    reader is given it as bytes (a copy, on paths that cost more than one anyway)."""
    if len(body) > MAX_BODY_BYTES:
        raise BodyRefused(f"{len(body)} B past the {MAX_BODY_BYTES} B a model request takes")
    if not bounded:  # the C pass refuses too many values itself: skipped with the count
        return _read_as_before(bytes(body), bounded=False)
    if _json_scan is None:
        _warn_without_scan()
        return _read_as_before(bytes(body))
    code, fetch_seen, spans = _json_scan.scan_content(body, MAX_DEPTH, MAX_VALUES)
    if code == _json_scan.TOO_MANY:  # counted on a strict prefix: structure_within's count
        # of the whole text is at least as many, and its verdict this one (not scanned again)
        raise BodyRefused(f"more than {MAX_VALUES} values: refused before it was parsed")
    if code == _json_scan.OK and content_as_bytes and spans:
        parsed = _with_content_as_bytes(body, spans, fetch_seen)
        if parsed is not None:
            return parsed
    untrusted = bytes(body)  # the same object when it is bytes
    if code == _json_scan.OK:
        value = _parse_scanned(untrusted)
        if type(value) is dict:
            return Parsed(value, _ENCODER.encode(value), fetch_seen)
    return _read_as_before(untrusted)


def content_as_written(
    untrusted: bytes | bytearray, spans: tuple[tuple[int, int, int], ...]
) -> Parsed | None:
    """UNSAFE: the body with its content members at `spans` kept as the client's bytes, the
    rest parsed, with no pass of the C module's over them: for `unsafe_naive_screen`'s spans
    alone (the proxy's `unsafe_naive_content_screen`, tests of `lnk sandbox check`)."""
    return _with_content_as_bytes(untrusted, spans, True)


def _with_content_as_bytes(
    untrusted: bytes | bytearray, spans: tuple[tuple[int, int, int], ...], fetch_seen: bool
) -> Parsed | None:
    """The body the C pass accepted, its content members (`spans`: (index in CONTENT_KEYS,
    start, end) of each value, in order) kept as the client's bytes and the rest parsed by
    msgspec (each content value stood in for by `0`, so the parse makes no object of it);
    None when msgspec refuses the rest (a number past its cap): the whole-body path decides."""
    pieces: list[bytes | bytearray] = []
    last = 0
    for _, start, end in spans:
        pieces += (untrusted[last:start], b"0")
        last = end
    pieces.append(untrusted[last:])
    try:
        value = _DECODER.decode(b"".join(pieces))
    except (msgspec.DecodeError, RecursionError):
        return None
    if type(value) is not dict:
        return None
    whole = memoryview(untrusted)
    keys = []
    for index, start, end in spans:
        key = _CONTENT_KEYS[index]
        if type(value.get(key)) is not int:  # never: the pass found the key at this place
            return None
        value[key] = msgspec.Raw(whole[start:end])
        keys.append(key)
    return Parsed(value, _ENCODER.encode(value), fetch_seen, tuple(keys))


def _parse_scanned(untrusted: bytes) -> object:
    """msgspec's parse of a body the C pass accepted, or None when msgspec refuses it (a
    number past its cap): the reader as before decides."""
    paused = _PAUSE_GC_IN_PARSE and gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _DECODER.decode(untrusted)
    except (msgspec.DecodeError, RecursionError):
        return None
    finally:
        if paused:
            gc.enable()


@functools.cache  # once per process
def _warn_without_scan() -> None:
    log.warning(
        "lnk_proxy._json_scan (the C pass over model request bodies) is not built into this"
        " installation: bodies are judged as before it, with the same verdicts, at several"
        " times the CPU for large ones; reinstall lnk box with python3-dev and gcc present"
    )


def _read_as_before(untrusted: bytes, *, bounded: bool = True) -> Parsed:
    """The reader as it was before the C pass: the structure scan (unless not `bounded`),
    msgspec's parse checked by json_shape's passes, else the reference reader (the module's
    docstring)."""
    if bounded:
        refuse_many_values(untrusted)
    try:
        value = _DECODER.decode(untrusted)
    except (msgspec.DecodeError, RecursionError):
        return Parsed(_reference_loads(untrusted), None)
    if type(value) is dict:
        structure = shape(untrusted)
        canonical = _ENCODER.encode(value)
        if depth_within(structure, MAX_DEPTH) and _no_pair_lost(structure, value, canonical):
            return Parsed(value, canonical)
    return Parsed(_reference_loads(untrusted), None)  # its own refusal, or its own value


def refuse_many_values(untrusted: bytes) -> None:
    """BodyRefused when a body holds more than MAX_VALUES values or nests past
    MAX_SCANNED_DEPTH, found by a scan of its bytes (`json_shape.structure_within`): never
    given to a parser. Also the local model rules' first step (`model_bodies`). A body of at
    most MAX_VALUES bytes is not scanned: it cannot hold more values, and the parsers refuse
    its nesting at their recursion limits in about a millisecond (the scan would cost about
    as much as msgspec's whole parse of a 1 MiB body)."""
    if len(untrusted) <= MAX_VALUES:  # fewer bytes than values allowed: no scan to pay for
        return  # (and nesting the parsers stop at their own recursion limits, cheaply)
    past = structure_within(untrusted, MAX_VALUES, MAX_SCANNED_DEPTH)
    if past is not None:
        raise BodyRefused(f"{past}: refused before it was parsed")


def _no_pair_lost(structure: bytes, value: dict[str, Any], canonical: bytes) -> bool:
    """Whether the parse kept every member the client's bytes have (their shape's colons): a
    key given twice keeps one. Counted by a walk where the body has few containers for its size
    (a long text), else by the shape of the serialisation (C passes, no step per container)."""
    if len(structure) * _WALK_BYTES_PER_CONTAINER < len(canonical):
        return pairs_in(value) == structure.count(b":")
    return shape(canonical) == structure


def loads(untrusted: bytes) -> dict[str, Any]:
    """The body as a JSON object, read strictly (see the module's docstring)."""
    return read(untrusted).value


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise BodyRefused(f"the key {_shown(key)} twice in one object")
            seen.add(key)
    return out


def _constant(name: str) -> Any:
    raise BodyRefused(f"{name} is not JSON")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BodyRefused("a number too large for a double")
    return value


def _reference_loads(untrusted: bytes) -> dict[str, Any]:
    """The reference reader: the standard library's parser with the module's rules as hooks."""
    try:
        text = untrusted.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyRefused("a body that is not UTF-8") from None
    try:
        value = json.loads(
            text, object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float
        )
    except RecursionError:
        raise BodyRefused(f"nested past {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, and an integer past the digit limit
        if isinstance(exc, BodyRefused):
            raise
        raise BodyRefused(f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(value, dict):
        raise BodyRefused("the top level is not a JSON object")
    _check_depth(value)
    return value


def dumps(value: dict[str, Any]) -> bytes:
    """The proxy's own serialisation of a value `read` made (or of parts of one): compact,
    UTF-8; a lone surrogate refuses. (msgspec writes a non-finite float as `null`: `read`
    never makes one.)"""
    try:
        return _ENCODER.encode(value)
    except UnicodeEncodeError:
        raise BodyRefused("a lone surrogate escape in a string") from None


def _check_depth(value: object) -> None:
    """BodyRefused when containers nest past MAX_DEPTH (iterative: no recursion here). The
    parse makes only dict and list containers, so their exact types are compared (fast)."""
    level: list[object] = [value]
    for _ in range(MAX_DEPTH):
        below: list[object] = []
        for item in level:
            if type(item) is dict:
                below += [v for v in item.values() if type(v) is dict or type(v) is list]
            else:
                below += [v for v in item if type(v) is dict or type(v) is list]  # type: ignore[attr-defined]
        if not below:
            return
        level = below
    raise BodyRefused(f"nested past {MAX_DEPTH} levels")


def _shown(key: str) -> str:
    return repr(key[:40]) if key.isprintable() else "(a key with control characters)"
