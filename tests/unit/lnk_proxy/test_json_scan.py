"""The C pass over a model request's body (lnk_proxy/native/json_scan.c, `lnk_proxy._json_scan`)
against the readers it stands before: strict_json with the pass and strict_json without it (the
reader as before, json_shape's passes and the stdlib reader) give the same verdict, value and
bytes out for every body of test_json_shape's fuzz corpus and of the attacks here, and both the
reference reader copied in test_json_shape (`old_loads`, the oracle no change to strict_json
moves). The pass checks the grammar, not the numbers' size (msgspec's parse and the reader as
before do): where it accepts and the body is read, the fast reader read it; where it finds a key
twice, the oracle refuses. The attacks: keys given twice at every depth and under
every spelling (`"a"` and `"\\u0061"`), lone surrogates, nesting at the bound and one past it,
the value count at the bound and one past it, truncation at every byte, NUL bytes, every
invalid UTF-8 form, objects past the pass's key table."""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import pytest

from lnk_proxy import _json_scan, hosted_bodies, strict_json
from lnk_proxy.strict_json import MAX_DEPTH, MAX_VALUES, BodyRefused

from .test_json_shape import (
    SEEDS,
    _same_spelling,
    _verdict,
    generated,
    old_dumps,
    old_loads,
)

OK = _json_scan.OK


def scan(body: bytes) -> tuple[int, bool]:
    return _json_scan.scan(body, MAX_DEPTH, MAX_VALUES)


def _without_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(strict_json, "_json_scan", None)


def _read_without_pass(body: bytes) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as patch:
        _without_pass(patch)
        return strict_json.loads(body)


def assert_same_verdicts(body: bytes) -> tuple[Any, ...]:
    """The reader with the pass, without it, and the oracle: one verdict (the module's doc)."""
    with_pass = _verdict(strict_json.loads, strict_json.dumps, body)
    assert with_pass == _verdict(_read_without_pass, strict_json.dumps, body), body
    oracle = _verdict(old_loads, old_dumps, body)
    if with_pass[0] == oracle[0] == "ok":
        assert with_pass[1] == oracle[1], body
        assert _same_spelling(with_pass[2]) == _same_spelling(oracle[2]), body
    else:
        assert with_pass == oracle, body
    code, _ = scan(body)
    if code == OK and with_pass[0] == "ok":  # the pass let the fast reader take it
        assert strict_json.read(body).canonical is not None, body
    if code == _json_scan.KEY_TWICE:  # refused (for the key, or for what comes before it)
        assert oracle[0] == "refused", body
    return with_pass


def test_strict_json_reads_with_the_pass() -> None:
    assert strict_json._json_scan is _json_scan
    assert strict_json.read(b'{"a":1}').fetch_seen is False


@pytest.mark.parametrize("seed", SEEDS)
def test_the_fuzz_corpus_gets_one_verdict_with_the_pass_without_it_and_from_the_oracle(
    seed: int,
) -> None:
    accepted = 0
    for body in generated(seed):
        assert_same_verdicts(body)
        accepted += scan(body)[0] == OK
    assert accepted > 50  # the pass's own acceptance was exercised, not only its refusals


def _mutated(rng: random.Random, body: bytes) -> bytes:
    out = bytearray(body)
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(len(out))
        out[at] = rng.randrange(256) if rng.random() < 0.3 else rng.choice(b'{}[]:,"\\ 0eu\x00')
    return bytes(out)


@pytest.mark.parametrize("seed", SEEDS)
def test_byte_mutations_of_a_real_shaped_body_get_one_verdict(seed: int) -> None:
    rng = random.Random(seed)
    base = json.dumps(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": 'h\u00e9 "q" \\ \U0001f600'}],
                },
                {"role": "assistant", "content": [{"type": "tool_use", "input": {"a": [1, 2.5]}}]},
            ],
            "tools": [{"name": "t", "input_schema": {"type": "object", "properties": {}}}],
        },
        ensure_ascii=seed % 2 == 0,
    ).encode()
    for _ in range(500):
        assert_same_verdicts(_mutated(rng, base))


def test_truncation_at_every_byte_is_never_accepted() -> None:
    body = '{"a":[1,-2.5e+3,true,false,null,{"b":"\\u00e9\\ud83d\\ude00 \\" \\\\"}],"c":{}}'
    encoded = body.encode()
    assert scan(encoded)[0] == OK
    for end in range(len(encoded)):
        assert scan(encoded[:end])[0] != OK, encoded[:end]
        assert assert_same_verdicts(encoded[:end])[0] == "refused"


def _nested_at(depth: int, inner: str) -> str:
    """`inner` inside objects and lists, `depth` containers deep counting the outermost."""
    text = inner
    for level in range(depth - 1, 0, -1):
        text = f'{{"k{level}":{text}}}' if level % 2 else f"[{text}]"
    return text


@pytest.mark.parametrize("depth", range(1, MAX_DEPTH + 1))
@pytest.mark.parametrize(
    "pair",
    [
        '"a":1,"a":2',
        '"a":1,"\\u0061":2',
        '"\\u00e9":1,"\u00e9":2',
        '"\\ud83d\\ude00":1,"\U0001f600":2',
        '"":1,"":1',
        '"a\\"":1,"a\\u0022":2',
    ],
)
def test_a_key_twice_is_found_at_every_depth_under_every_spelling(depth: int, pair: str) -> None:
    body = ('{"pad":0,' + _nested_at(depth, "{" + pair + "}")[1:]).encode()
    if depth == 1:
        body = ("{" + pair + "}").encode()
    assert scan(body)[0] == _json_scan.KEY_TWICE, body
    with pytest.raises(BodyRefused, match="twice"):
        strict_json.loads(body)
    assert assert_same_verdicts(body)[0] == "refused"


def test_keys_that_differ_only_after_decoding_are_not_taken_for_one() -> None:
    for pair in ('"a":1,"b":2', '"\\u0061":1,"\\u0062":2', '"a\\n":1,"a\\r":2', '"\\/":1,"/x":2'):
        body = ("{" + pair + "}").encode()
        assert scan(body)[0] == OK, body
        assert_same_verdicts(body)


def test_many_keys_with_one_hash_bucket_each_are_told_apart() -> None:
    # An object one key short of the most the pass's table takes, then the same object with
    # one of its keys given again as the last: found, whichever slot its hash probes first.
    keys = [f"k{i}" for i in range(_json_scan.MAX_KEYS - 1)]
    body = ("{" + ",".join(f'"{k}":{i}' for i, k in enumerate(keys)) + "}").encode()
    assert scan(body)[0] == OK
    for again in keys:
        twice = body[:-1] + f',"{again}":0}}'.encode()
        assert scan(twice)[0] == _json_scan.KEY_TWICE, again
    assert assert_same_verdicts(twice)[0] == "refused"


def test_an_object_past_the_pass_key_table_is_read_as_before() -> None:
    many = _json_scan.MAX_KEYS + 1
    body = ("{" + ",".join(f'"k{i}":{i}' for i in range(many)) + "}").encode()
    assert scan(body)[0] == _json_scan.TOO_MANY_KEYS
    assert assert_same_verdicts(body)[0] == "ok"
    twice = body[:-1] + b',"k3":0}'
    assert assert_same_verdicts(twice)[0] == "refused"


def test_sibling_objects_each_have_their_own_keys() -> None:
    # One level's table is reused object after object: a key of the one before is no repeat.
    body = b'{"a":[{"x":1,"y":2},{"x":1,"y":2},{"y":3}],"b":{"x":{"x":{"x":1}}}}'
    assert scan(body)[0] == OK
    assert_same_verdicts(body)


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1])
@pytest.mark.parametrize("inner", ["1", "{}", "[]"])
def test_nesting_at_the_bound_is_read_and_one_past_is_not(depth: int, inner: str) -> None:
    containers = depth - 1 + (inner != "1")
    body = _nested_at(depth, inner).encode()
    assert body.startswith(b"{")
    code = scan(body)[0]
    assert code == (OK if containers <= MAX_DEPTH else _json_scan.TOO_DEEP), (containers, body)
    verdict = assert_same_verdicts(body)
    assert (verdict[0] == "ok") == (containers <= MAX_DEPTH)


def test_a_million_brackets_stop_the_pass_at_the_bound() -> None:
    body = b'{"a":' + b"[" * 10**6 + b"]" * 10**6 + b"}"
    assert scan(body)[0] == _json_scan.TOO_DEEP
    with pytest.raises(BodyRefused, match="nested past 1000 levels"):
        strict_json.loads(body)


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_the_value_count_at_the_bound_and_one_past(extra: int) -> None:
    # `{"a":[0,...]}` counts `{`, `:`, `[` and a comma per value but the first.
    values = MAX_VALUES - 3 + 1 + extra
    body = b'{"a":[' + b",".join([b"0"] * values) + b"]}"
    assert scan(body)[0] == (OK if extra <= 0 else _json_scan.TOO_MANY)
    if extra <= 0:
        assert strict_json.read(body).canonical is not None
    else:
        with pytest.raises(BodyRefused, match=f"more than {MAX_VALUES} values"):
            strict_json.loads(body)


@pytest.mark.parametrize(
    "head",
    [
        b'{"a":[',
        b'{"s":"\\\\\\",[{","t":{"\\u0022":[1]},"a":[',  # escapes that hide a quote
        b'{"k":"' + b"," * 5000 + b'","a":[',  # commas in a string count nothing
    ],
)
@pytest.mark.parametrize("tail", [b"]}", b"]", b',"a":1}', b"\\x"])  # the rest need not be JSON
def test_a_body_past_the_value_count_is_refused_as_the_structure_scan_refuses_it(
    head: bytes, tail: bytes
) -> None:
    body = head + b",".join([b"0"] * MAX_VALUES) + tail
    assert scan(body)[0] == _json_scan.TOO_MANY
    verdicts = []
    for reader in (strict_json.loads, _read_without_pass):
        with pytest.raises(BodyRefused) as refused:
            reader(body)
        verdicts.append((refused.value.rule, refused.value.reason))
    assert verdicts[0] == verdicts[1] == ("model-body", strict_json_refusal())


def strict_json_refusal() -> str:
    return f"more than {MAX_VALUES} values: refused before it was parsed"


def test_a_small_max_values_is_counted_exactly() -> None:
    assert _json_scan.scan(b'{"a":[1,2]}', MAX_DEPTH, 4)[0] == OK  # { : [ ,
    assert _json_scan.scan(b'{"a":[1,2,3]}', MAX_DEPTH, 4)[0] == _json_scan.TOO_MANY
    assert _json_scan.scan(b'{"a":"[,,,:]"}', MAX_DEPTH, 2)[0] == OK  # strings count nothing


@pytest.mark.parametrize(
    "escape",
    [
        "\\ud800",
        "\\udfff",
        "\\ud800x",
        "\\ud800\\u0041",
        "\\udc00\\ud800",
        "\\ud800\\ud800",
        "\\ud83d",
    ],
)
@pytest.mark.parametrize("where", ["key", "value"])
def test_a_lone_surrogate_is_never_accepted_by_the_pass(escape: str, where: str) -> None:
    body = ('{"' + escape + '":1}' if where == "key" else '{"a":"' + escape + '"}').encode()
    assert scan(body)[0] == _json_scan.LONE_SURROGATE
    assert assert_same_verdicts(body)[0] != "ok"


def test_a_surrogate_pair_is_one_character() -> None:
    body = b'{"\\ud83d\\ude00":"\\uD83D\\uDE00"}'
    assert scan(body)[0] == OK
    assert strict_json.loads(body) == {"\U0001f600": "\U0001f600"}


@pytest.mark.parametrize(
    "raw",
    [b"\x00", b"a\x00b", b"\x1f", b"\n", b"\t", b"\x7f", b"\\u0000", b"\\u001f"],
)
def test_control_characters_raw_are_refused_and_escaped_are_read(raw: bytes) -> None:
    body = b'{"a":"' + raw + b'"}'
    escaped_or_del = raw.startswith(b"\\") or raw == b"\x7f"
    assert (scan(body)[0] == OK) == escaped_or_del
    assert (assert_same_verdicts(body)[0] == "ok") == escaped_or_del
    outside = b'{"a":1' + raw + b"}"
    assert scan(outside)[0] != OK or raw in (b"\n", b"\t")


@pytest.mark.parametrize(
    "raw",
    [
        b"\x80",
        b"\xbf",
        b"\xc0\x80",
        b"\xc1\xbf",
        b"\xc2",
        b"\xc2\x41",
        b"\xe0\x80\x80",
        b"\xe0\x9f\xbf",
        b"\xed\xa0\x80",
        b"\xed\xbf\xbf",
        b"\xef\xbf",
        b"\xf0\x80\x80\x80",
        b"\xf0\x8f\xbf\xbf",
        b"\xf4\x90\x80\x80",
        b"\xf5\x80\x80\x80",
        b"\xff",
        b"\xfe",
        b"\xef\xbb\xbf",  # a BOM inside a string is a character (U+FEFF)
        b"\xc2\x80",
        b"\xdf\xbf",
        b"\xe0\xa0\x80",
        b"\xed\x9f\xbf",
        b"\xee\x80\x80",
        b"\xf0\x90\x80\x80",
        b"\xf4\x8f\xbf\xbf",
    ],
)
def test_utf8_in_a_string_is_checked_as_python_decodes_it(raw: bytes) -> None:
    valid = True
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        valid = False
    for body in (b'{"a":"' + raw + b'"}', b'{"' + raw + b'":1}', b'{"a":"x' + raw + b'xxxxxxxxx"}'):
        assert (scan(body)[0] == OK) == valid, body
        assert_same_verdicts(body)


def test_random_bytes_in_a_string_are_checked_as_python_decodes_them() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        raw = bytes(
            rng.choice((rng.randrange(0x80, 0x100), rng.randrange(0x20, 0x80)))
            for _ in range(rng.randrange(1, 12))
        )
        raw = raw.replace(b"\\", b"").replace(b'"', b"")
        try:
            raw.decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            valid = False
        body = b'{"a":"' + raw + b'"}'
        assert (scan(body)[0] == OK) == valid, body


@pytest.mark.parametrize(
    "body",
    [
        b"\xef\xbb\xbf{}",
        b"{}\x00",
        b"\x00{}",
        b"{} {}",
        b"{},",
        b'{"a":1,}',
        b'{"a"}',
        b'{"a":}',
        b"{,}",
        b"[]",
        b"1",
        b'"a"',
        b"",
        b" ",
        b'{"a":01}',
        b'{"a":.5}',
        b'{"a":1.}',
        b'{"a":1e}',
        b'{"a":-}',
        b'{"a":+1}',
        b'{"a":NaN}',
        b'{"a":Infinity}',
        b'{"a":tru}',
        b'{"a":nul}',
        b'{"a":"\\x41"}',
        b'{"a":"\\u00g0"}',
        b'{"a":"\\u00"}',
        b'{"a":"\\"}',
        b"{'a':1}",
        b'{"a":1\x0c}',
        b'{"a":[1 2]}',
        b'{"a":[1,]}',
        b'{"a" 1}',
        b'{"a":1}}',
        b'{"a":[}',
        b'{"a":{]}',
    ],
)
def test_what_is_not_strict_json_is_not_accepted(body: bytes) -> None:
    assert scan(body)[0] != OK, body
    assert assert_same_verdicts(body)[0] != "ok"


@pytest.mark.parametrize(
    "number",
    ["0", "-0", "-0.0", "1.5e-7", "1E+2", "123456789012345678901234567890", "1e400", "9" * 4301],
)
def test_numbers_the_grammar_allows_reach_the_parsers_whose_limits_decide(number: str) -> None:
    body = ('{"a":' + number + "}").encode()
    assert scan(body)[0] == OK
    assert_same_verdicts(body)


def test_the_pass_screens_the_fetch_names_hosted_bodies_refuses() -> None:
    assert _json_scan.FETCH_NAMES == hosted_bodies.FETCH_NAMES
    for name in hosted_bodies.FETCH_NAMES:
        spellings = [
            name,
            "".join(f"\\u{ord(c):04x}" for c in name),
            name[0] + "\\u" + f"{ord(name[1]):04x}" + name[2:],
        ]
        for spelled in spellings:
            for body in ('{"' + spelled + '":1}', '{"a":["' + spelled + '"]}'):
                assert scan(body.encode()) == (OK, True), body
        for near in (name + "x", "x" + name, name[:-1], name.upper(), name + "\\u0000"):
            assert scan(('{"' + near + '":1}').encode()) == (OK, False), near


def _strings_of(value: object) -> set[str]:
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found.update(item)
            stack += item.values()
        elif isinstance(item, list):
            stack += item
        elif isinstance(item, str):
            found.add(item)
    return found


@pytest.mark.parametrize("seed", SEEDS)
def test_the_screen_is_exact_over_the_corpus(seed: int) -> None:
    rng = random.Random(seed)
    seen = 0
    for generated_body in generated(seed):
        body = generated_body
        if rng.random() < 0.3:  # a fetch name in, under some spelling
            name = rng.choice(hosted_bodies.FETCH_NAMES)
            body = body[:-1] + b',"zz":"' + name.replace("_", "\\u005f").encode() + b'"}'
        code, fetch_seen = scan(body)
        if code == OK and assert_same_verdicts(body)[0] == "ok":
            names = _strings_of(strict_json.loads(body)) & set(hosted_bodies.FETCH_NAMES)
            assert fetch_seen == bool(names), body
            seen += fetch_seen
    assert seen > 20


def test_without_the_pass_the_proxy_warns_once_and_reads_as_before(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(strict_json, "_json_scan", None)
    strict_json._warn_without_scan.cache_clear()  # as in a fresh proxy
    with caplog.at_level(logging.WARNING, logger="lnk_proxy.strict_json"):
        for _ in range(3):
            parsed = strict_json.read(b'{"a":1}')
            assert parsed.value == {"a": 1} and parsed.fetch_seen is None
            with pytest.raises(BodyRefused, match="twice"):
                strict_json.read(b'{"a":1,"a":2}')
    warnings = [r for r in caplog.records if "_json_scan" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_the_pass_refuses_a_depth_its_stack_cannot_hold() -> None:
    with pytest.raises(ValueError, match="max_depth"):
        _json_scan.scan(b"{}", _json_scan.MAX_LEVELS + 1, 10)
    assert _json_scan.scan(b'{"a":[]}', 1, 10)[0] == _json_scan.TOO_DEEP


@pytest.mark.parametrize(
    "special", [b'\\"', b"\\\\", b"\\u0041", b"\x01", b"\x7f", "é€😀".encode(), b"\xff", b'"']
)
def test_a_special_byte_at_every_place_of_a_long_string(special: bytes) -> None:
    """The strings' 16-byte steps (SSE2) and 8-byte steps stop at each byte that is not plain,
    wherever it falls in or across a step, with the verdicts of the readers without them."""
    for at in range(48):
        for tail in (0, 1, 15, 16, 17):
            body = b'{"k":"' + b"a" * at + special + b"b" * tail + b'"}'
            assert_same_verdicts(body)
            assert (scan(body)[0] == OK) is (special not in (b"\x01", b"\xff", b'"')), body
