"""lnk_proxy.json_shape (the structure outside strings, its pairs and depth) and strict_json's fast
reader built on it, against the reader they replaced: for many
generated bodies (escapes that spell a quote or a backslash, keys given twice under other
spellings, nesting at the bound, numbers at every limit, one-byte mutations) the new reader and
the old one give the same verdict, the same value and the same bytes out, or both refuse with
the same reason. The old reader is copied here whole, so a change to strict_json cannot move
the oracle with it."""

from __future__ import annotations

import json
import math
import random
import re
from typing import Any

import msgspec
import pytest

from lnk_proxy import json_shape, strict_json
from lnk_proxy.hosted_bodies import FETCH_NAMES, judge_body, may_fetch
from lnk_proxy.json_shape import (
    depth_within,
    pairs_in,
    passes_within,
    shape,
    structure_within,
)
from lnk_proxy.strict_json import MAX_DEPTH, BodyRefused

BODIES_PER_SEED = 500  # with 4 seeds: 2,000 bodies, each read both ways
SEEDS = range(4)


# -- the reader as it was before the fast path (services/proxy/lnk_proxy/strict_json.py at 85583cf)


def _old_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                shown = repr(key[:40]) if key.isprintable() else "(a key with control characters)"
                raise BodyRefused(f"the key {shown} twice in one object")
            seen.add(key)
    return out


def _old_constant(name: str) -> Any:
    raise BodyRefused(f"{name} is not JSON")


def _old_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BodyRefused("a number too large for a double")
    return value


def _old_depth(value: object) -> None:
    level: list[Any] = [value]
    for _ in range(MAX_DEPTH):
        below: list[Any] = []
        for item in level:
            items = item.values() if type(item) is dict else item
            below += [v for v in items if type(v) in (dict, list)]
        if not below:
            return
        level = below
    raise BodyRefused(f"nested past {MAX_DEPTH} levels")


def old_loads(untrusted: bytes) -> dict[str, Any]:
    try:
        text = untrusted.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyRefused("a body that is not UTF-8") from None
    try:
        value = json.loads(
            text, object_pairs_hook=_old_pairs, parse_constant=_old_constant, parse_float=_old_float
        )
    except RecursionError:
        raise BodyRefused(f"nested past {MAX_DEPTH} levels") from None
    except ValueError as exc:
        if isinstance(exc, BodyRefused):
            raise
        raise BodyRefused(f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(value, dict):
        raise BodyRefused("the top level is not a JSON object")
    _old_depth(value)
    return value


def old_dumps(value: dict[str, Any]) -> bytes:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise BodyRefused("a lone surrogate escape in a string") from None


# -- generated bodies

_KEYS = ("a", "model", "type", "source", "k", ":", '"', "\\", "é", "")
_CHARS = 'ab:[]{},"\\/\n\t\x01\x1fé\u2028\U0001f600 0e+-'
_NUMBERS = (
    "0", "-0", "-0.0", "1", "1.50", "1e5", "1E-7", "1e+16", "0.1e1", "123456789.125",
    "9223372036854775807", "9223372036854775808", "-9223372036854775809",
    "18446744073709551615", "18446744073709551616", "1" * 40, "9" * 4300, "9" * 4301,
    "1" * 400 + ".5", "1.7976931348623157e308", "1.7976931348623159e308", "1e400", "-1e400",
    "1e-400", "2.4703282292062328e-324", "5e-324", "01", ".5", "1.", "1e", "-", "NaN",
    "Infinity", "-Infinity", "0x10",
)  # fmt: skip
_ESCAPES = (
    '\\"', "\\\\", "\\/", "\\n", "\\u0022", "\\u005c", "\\u003a", "\\u0061", "\\ud800",
    "\\udc00", "\\ud83d\\ude00", "\\u0000", "\\x41", "\\",
)  # fmt: skip
_SPACE = ("", "", "", " ", "\n", "\t", "\r", "\x0c", "\xa0")
_MUTATION = b'{}[]:,"\\ 0123456789eE+-.ntrufalsx\x00\xff\xef\xbb\xbf'


def _string(rng: random.Random, pool: str = _CHARS) -> str:
    out = []
    for _ in range(rng.randrange(6)):
        if rng.random() < 0.3:
            out.append(rng.choice(_ESCAPES))
        else:
            char = rng.choice(pool)
            out.append(json.dumps(char)[1:-1] if char in '"\\' or char < " " else char)
    return '"' + "".join(out) + '"'


def _key(rng: random.Random) -> str:
    key = rng.choice(_KEYS)
    if rng.random() < 0.3:  # another spelling of the same key
        return '"' + "".join(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else c for c in key) + '"'
    return json.dumps(key, ensure_ascii=rng.random() < 0.5)


def _value(rng: random.Random, depth: int) -> str:
    roll = rng.random()
    if depth > 0 and roll < 0.25:
        items = [_value(rng, depth - 1) for _ in range(rng.randrange(4))]
        return "[" + ",".join(items) + "]"
    if depth > 0 and roll < 0.5:
        return _object(rng, depth - 1)
    if roll < 0.7:
        return _string(rng)
    if roll < 0.9:
        return rng.choice(_NUMBERS)
    return rng.choice(("true", "false", "null"))


def _object(rng: random.Random, depth: int) -> str:
    keys = [_key(rng) for _ in range(rng.randrange(5))]
    sp = rng.choice(_SPACE)
    return "{" + ",".join(f"{sp}{k}{sp}:{sp}{_value(rng, depth)}" for k in keys) + sp + "}"


def _nested(rng: random.Random) -> str:
    """A body nesting around the bound, objects and lists mixed."""
    levels = rng.randrange(MAX_DEPTH - 3, MAX_DEPTH + 3)
    opens = [rng.choice(("[", '{"k":')) for _ in range(levels - 1)]
    closes = ["]" if o == "[" else "}" for o in reversed(opens)]
    return '{"a":' + "".join(opens) + "1" + "".join(closes) + "}"


def generated(seed: int) -> list[bytes]:
    rng = random.Random(seed)
    bodies = []
    for _ in range(BODIES_PER_SEED):
        text = _nested(rng) if rng.random() < 0.05 else _object(rng, rng.randrange(4))
        if rng.random() < 0.05:
            text = _value(rng, 2)  # another top level
        body = bytearray(text.encode("utf-8", "surrogatepass"))
        for _ in range(rng.choice((0, 0, 0, 1, 2))):
            at = rng.randrange(len(body) + 1)
            edit = rng.choice(("insert", "delete", "replace"))
            if edit == "insert":
                body[at:at] = bytes([rng.choice(_MUTATION)])
            elif body:
                at = min(at, len(body) - 1)
                body[at : at + 1] = b"" if edit == "delete" else bytes([rng.choice(_MUTATION)])
        bodies.append(bytes(body))
    return bodies


def _verdict(reader: Any, writer: Any, body: bytes) -> tuple[Any, ...]:
    try:
        value = reader(body)
    except BodyRefused as refused:
        return ("refused", refused.rule, refused.reason)
    try:
        return ("ok", _typed(value), writer(value))
    except BodyRefused as refused:
        return ("refused on the way out", refused.rule, refused.reason)


def _typed(value: object) -> object:
    """The value with every scalar's type beside it (1, 1.0 and True compare equal in Python)."""
    if isinstance(value, dict):
        return ("dict", [(k, _typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [_typed(v) for v in value])
    return (type(value).__name__, repr(value))


_EXPONENT = re.compile(rb"([0-9])e\+?(-?)0*([0-9])")


def _same_spelling(out: bytes) -> bytes:
    """A float's exponent as msgspec writes it (`1e16`, `1e-7`): Python wrote `1e+16`, `1e-07`."""
    return _EXPONENT.sub(rb"\1e\2\3", out)


@pytest.fixture(params=["walk", "shape"])
def pair_count(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each of the two ways strict_json counts the parse's members, forced for every body."""
    bytes_per_container = 0 if request.param == "walk" else 10**12
    monkeypatch.setattr(strict_json, "_WALK_BYTES_PER_CONTAINER", bytes_per_container)
    return str(request.param)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_fast_reader_gives_the_old_readers_verdict_value_and_bytes(
    seed: int, pair_count: str
) -> None:
    fast = 0
    for body in generated(seed):
        new = _verdict(strict_json.loads, strict_json.dumps, body)
        old = _verdict(old_loads, old_dumps, body)
        if new[0] == old[0] == "ok":
            assert new[1] == old[1], body
            assert _same_spelling(new[2]) == _same_spelling(old[2]), body
            assert _typed(json.loads(new[2])) == old[1], body
        else:
            assert new == old, body
        fast += strict_json.read(body).canonical is not None if new[0] == "ok" else 0
    assert fast > BODIES_PER_SEED // 10  # the fast path itself was exercised, not only the old


@pytest.mark.parametrize(
    "body",
    [
        b'{"a":1,"a":2}',
        b'{"a":1,"\\u0061":2}',  # the same key under another spelling
        b'{"x":{"k":"\\"","k":1}}',  # an escaped quote before the second key
        b'{"x":{"k\\\\":1,"k\\\\":2}}',  # an escaped backslash just before a key's end
        b'{"\\"":1,"\\u0022":2}',
        b'{"a":"\\\\\\":\\"","b":1,"b":2}',  # a string that looks like it ends twice
        b'{"a":[{"t":1,"t":1}]}',  # the same value twice: still refused
    ],
)
@pytest.mark.parametrize("padding", [0, 100_000])  # a long text: the parse is walked instead
def test_a_key_twice_is_refused_whatever_escapes_stand_around_it(body: bytes, padding: int) -> None:
    padded = b'{"pad":"' + b"x" * padding + b'","b":' + body + b"}"
    for refused in (body, padded):
        with pytest.raises(BodyRefused, match="twice"):
            strict_json.loads(refused)
    assert strict_json.read(b'{"pad":"' + b"x" * padding + b'"}').canonical is not None


@pytest.mark.parametrize(
    ("text", "structure"),
    [
        (b'{"a":1}', b"{:}"),
        (b'{"a:[{":"}]"}', b"{:}"),  # structure inside strings is not structure
        (b'{"a\\"":[1,{"b":2}]}', b"{:[{:}]}"),
        (b'{"a\\\\":"\\\\\\":"}', b"{:}"),  # a run of backslashes read in pairs
        (b'{"\\u0022":"\\u005c"}', b"{:}"),  # an escaped quote by number is no delimiter
        (b" [ {} , [ ] ] ", b"[{}[]]"),
        (b'"just : a string"', b""),
    ],
)
def test_the_shape_is_the_structure_outside_strings(text: bytes, structure: bytes) -> None:
    assert shape(text) == structure


def _slow_shape(text: str) -> bytes:
    """A lexer one character at a time: the shape's reference."""
    out, in_string, escaped = [], False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in ":[]{}":
            out.append(char)
    return "".join(out).encode()


@pytest.mark.parametrize("seed", SEEDS)
def test_the_shape_of_valid_json_matches_a_lexer_one_character_at_a_time(seed: int) -> None:
    checked = 0
    for body in generated(seed):
        try:
            json.loads(body)
        except ValueError:
            continue
        assert shape(body) == _slow_shape(body.decode("utf-8", "surrogatepass")), body
        checked += 1
    assert checked > BODIES_PER_SEED // 4


@pytest.mark.parametrize("seed", SEEDS)
def test_a_walk_counts_the_members_the_serialisations_shape_has(seed: int) -> None:
    for body in generated(seed):
        try:
            value = strict_json._DECODER.decode(body)
        except (ValueError, RecursionError):
            continue
        assert pairs_in(value) == shape(strict_json._ENCODER.encode(value)).count(b":"), body


@pytest.mark.parametrize(
    ("structure", "bound", "within"),
    [
        (b"", 1, True),
        (b"{}", 1, True),
        (b"{:[]}", 1, False),
        (b"{:[]}", 2, True),
        (b"{:[{}{}][[]]}", 3, True),
        (b"{:[{}{}][[[]]]}", 3, False),
        (b"[" * 64 + b"]" * 64, 64, True),
        (b"[" * 65 + b"]" * 65, 64, False),
        (b"{:[{:[]}]}", 4, True),  # kinds mixed
        (b"{:[{:[]}]}", 3, False),
    ],
)
def test_depth_is_read_from_the_shape(structure: bytes, bound: int, within: bool) -> None:
    assert depth_within(structure, bound) is within
    assert passes_within(structure, bound) is within


@pytest.mark.parametrize("seed", SEEDS)
def test_the_one_pass_nesting_count_answers_as_the_passes_do(seed: int) -> None:
    """The C module's `nesting_within` (one pass) against the bytes-methods passes, on shapes
    balanced and not, with stray bytes, at every bound around their depth."""
    rng = random.Random(seed)
    for _ in range(2000):
        structure = bytes(rng.choice(b"[]{}:[]{}[]{}:,a") for _ in range(rng.randrange(0, 24)))
        if rng.random() < 0.5:  # balanced ones too, or nearly all would be refused
            depth = rng.randrange(1, 12)
            structure = b"[" * depth + structure.translate(None, b"[]{},a") + b"]" * depth
        for bound in range(1, 14):
            assert depth_within(structure, bound) is passes_within(structure, bound), structure


def test_a_million_brackets_nested_just_under_the_bound_are_read_in_one_pass() -> None:
    """The attack: 2 MiB of brackets in runs nested 999 deep, just within the scan's bound of
    1000, made the passes delete one pair per run per pass, a thousand passes over megabytes
    (~2 s of the proxy's one loop for one request). The wheel's module counts it in one pass:
    it must be what answers (the unit tests build it, conftest.py)."""
    assert json_shape._nesting_within is not None, "lnk_proxy._json_scan has no nesting_within"
    runs = b"[" * 999 + b"]" * 999
    assert depth_within(runs * 1000, 999)
    assert not depth_within(runs * 999 + b"[" * 1000 + b"]" * 1000, 999)


def _hosted_body(rng: random.Random) -> dict[str, Any]:
    """A messages body with, now and then, a field the filter refuses, under some spelling."""
    blocks: list[dict[str, Any]] = []
    for _ in range(rng.randrange(4)):
        block: dict[str, Any] = {"type": rng.choice(("text", "image", "document", "tool_use"))}
        roll = rng.random()
        if roll < 0.15:
            block["source"] = {"type": rng.choice(("base64", "url", "file", "text"))}
        elif roll < 0.25:
            block[rng.choice(("file_id", "file_url"))] = rng.choice(("f1", None))
        elif roll < 0.35:
            block["image_url"] = rng.choice(("data:x", "http://x/", {"url": "data:y"}))
        elif roll < 0.4:
            block["type"] = "item_reference"
        elif roll < 0.5:
            block["text"] = rng.choice(FETCH_NAMES) + ' "source" ' + _string(rng)
        elif roll < 0.6:
            block["input"] = {"source": {"type": "url"}}  # a call's own arguments: not content
        blocks.append(block)
    return {"model": "m", "messages": [{"role": "user", "content": blocks}]}


def _judged(value: dict[str, Any], canonical: bytes | None) -> tuple[Any, ...]:
    try:
        return (
            "ok",
            *judge_body(
                "anthropic", "messages", value, {"m"}.__contains__, (), canonical=canonical
            ),
        )
    except BodyRefused as refused:
        return ("refused", refused.rule, refused.reason)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_body_not_walked_by_the_screen_is_one_the_walk_would_pass(seed: int) -> None:
    rng = random.Random(seed)
    screened = 0
    for _ in range(BODIES_PER_SEED):
        body = _hosted_body(rng)
        raw = json.dumps(body, ensure_ascii=rng.random() < 0.5).encode()
        parsed = strict_json.read(raw)
        verdicts = [_judged(parsed.value, canonical) for canonical in (parsed.canonical, None)]
        assert verdicts[0] == verdicts[1], raw
        screened += not may_fetch(parsed.canonical)
    assert screened > BODIES_PER_SEED // 10  # bodies the screen let skip the walk


@pytest.mark.parametrize("name", FETCH_NAMES)
def test_each_fetch_name_as_a_string_makes_the_walk_run(name: str) -> None:
    spelled = "".join(f"\\u{ord(c):04x}" for c in name).encode()
    parsed = strict_json.read(b'{"model":"m","messages":[{"' + spelled + b'":1}]}')
    assert parsed.canonical is not None
    assert may_fetch(parsed.canonical)
    assert not may_fetch(strict_json.read(b'{"model":"m","messages":[{"text":1}]}').canonical)


@pytest.mark.parametrize(
    "raw",
    [
        b'{ "model" : "m", "messages" : [ {"role": "user", "content": "hi \\u00e9"} ] }',
        b'{"model":"m","messages":[],"tools":[{"type":"web_search_20250305","name":"w"}]}',
        b'{"model":"m","messages":[],"mcp_servers":null}',  # dropped unnamed: the value changed
    ],
)
def test_what_goes_upstream_is_the_serialisation_of_what_was_judged(raw: bytes) -> None:
    """Byte for byte the old reader's serialisation with the fast form off; with it on (a
    content the C pass proved plain: hosted_bodies' docstring), the same bytes but the content
    members', which are the client's own, and the same value for any parser."""
    from lnk_proxy.hosted_models import IssuedIds, judge_hosted

    def forward() -> bytes:
        return judge_hosted(
            "anthropic",
            "ph",
            {"m"}.__contains__,
            method="POST",
            target="/v1/messages",
            headers=(),
            untrusted_body=raw,
            issued=IssuedIds(),
        ).body

    judged, _ = judge_body("anthropic", "messages", old_loads(raw), {"m"}.__contains__, ())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(strict_json, "_with_content_as_bytes", lambda *_: None)
        assert forward() == old_dumps(judged)
    fast = forward()
    assert json.loads(fast) == judged
    parsed = strict_json.read(raw, content_as_bytes=True)
    spelt = {key: parsed.value[key] for key in parsed.as_bytes}
    # each content member as the client wrote it, the rest the proxy's
    assert all(bytes(value) in raw for value in spelt.values())
    assert fast == msgspec.json.encode({**judged, **spelt})


# -- structure_within: the count before any parse

_MANY = 2**20


@pytest.mark.parametrize(
    ("body", "past"),
    [
        (b'{"a":[' + b",".join([b"0"] * (_MANY - 2)) + b"]}", None),  # {, :, [ and the commas
        (b'{"a":[' + b",".join([b"0"] * (_MANY - 1)) + b"]}", "more than 1048576 values"),
        (b"[" + b",".join([b"0"] * (_MANY + 1)) + b"]", "more than 1048576 values"),
        (b"[" * 10**6 + b"]" * 10**6, "nested past 64 levels"),
        (b"{" * 10**6, "nested past 64 levels"),  # never closed: unpaired, refused all the same
        (b"[" * 64 + b"]" * 64, None),
        (b"[" * 65 + b"]" * 65, "nested past 64 levels"),
        (b'{"k":' * 64 + b"1" + b"}" * 64, None),
        (b'["' + b"[" * 10**6 + b'"]', None),  # brackets inside a string are text
        (b'["' + b",:" * _MANY + b'"]', None),  # and so are commas and colons
        (b'["\\"' + b"," * _MANY + b'"]', None),  # an escaped quote does not end the string
        (b'["\\\\",' + b",".join([b"1"] * _MANY) + b"]", "more than 1048576 values"),
        (b"[" + b'"",' * _MANY + b'""]', "more than 1048576 values"),  # counted by its quotes
        (b'["' + b"\\u0022" + b"," * _MANY + b'"]', None),  # \u0022 is no delimiter
    ],
    ids=[
        "just-under-the-limit",
        "one-past",
        "a-flat-array-one-past",
        "a-million-deep",
        "a-million-open",
        "at-the-depth",
        "one-deeper",
        "objects-at-the-depth",
        "brackets-in-a-string",
        "commas-in-a-string",
        "an-escaped-quote",
        "an-escaped-backslash-then-values",
        "empty-strings",
        "a-unicode-quote",
    ],
)
def test_structure_within_counts_values_and_nesting_outside_strings(
    body: bytes, past: str | None
) -> None:
    assert structure_within(body, _MANY, MAX_DEPTH) == past


def test_structure_within_is_exact_on_every_generated_body_a_strict_parser_reads() -> None:
    """Its count is the values and members of the parse; its depth verdict the parse's."""
    for seed in SEEDS:
        for body in generated(seed):
            try:
                value = json.loads(body, object_pairs_hook=_Members)  # a key twice: both kept
            except ValueError:
                continue
            values = _values_and_members(value)
            deep = _depth(value)
            assert structure_within(body, values, deep) is None
            assert structure_within(body, values - 1, deep) == f"more than {values - 1} values"
            if deep:
                assert structure_within(body, values, deep - 1) == f"nested past {deep - 1} levels"


class _Members(list[tuple[str, Any]]):
    """An object's members as the text has them, a key given twice included."""


def _values_and_members(value: object) -> int:
    """What structure_within counts: per container, its opening bracket, then one byte for each
    member's `:` and each separating `,`."""
    if isinstance(value, _Members):
        inner = sum(_values_and_members(v) for _, v in value)
        return 1 + len(value) + max(len(value) - 1, 0) + inner
    if isinstance(value, list):
        return 1 + max(len(value) - 1, 0) + sum(_values_and_members(v) for v in value)
    return 0


def _depth(value: object) -> int:
    if isinstance(value, _Members):
        return 1 + max((_depth(v) for _, v in value), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0
