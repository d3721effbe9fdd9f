"""lnk_proxy.strict_json: a model request's body read strictly and written back by the proxy.
Each row is a body another parser could read differently from Python's, or a bound passed."""

from __future__ import annotations

import json

import pytest

from lnk_proxy import strict_json
from lnk_proxy.strict_json import MAX_BODY_BYTES, MAX_DEPTH, MAX_VALUES, BodyRefused, dumps, loads


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"a": NaN}', "NaN"),
        (b'{"a": Infinity}', "Infinity"),
        (b'{"a": -Infinity}', "-Infinity"),
        (b'{"a": 1e400}', "too large"),
        (b'{"model": "a", "model": "b"}', "twice"),
        (b'{"x": {"k": 1, "k": 2}}', "twice"),
        (b'[{"model": "a"}]', "top level"),
        (b'"text"', "top level"),
        (b"\xef\xbb\xbf{}", "not JSON"),  # a BOM: some parsers skip it, Python refuses
        (b'{"a": "\xff"}', "UTF-8"),
        (b'{"a": 1} {"b": 2}', "not JSON"),  # two documents
        (b'{"a": 1,}', "not JSON"),  # a trailing comma
        (b"{'a': 1}", "not JSON"),
        (b'{"a": 0x10}', "not JSON"),
        (b'{"a": "' + b"9" * 5000 + b'"}', ""),  # a long string is fine (see the next row)
        (b'{"a": ' + b"9" * 5000 + b"}", "not JSON"),  # past Python's integer digit limit
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_body_another_parser_could_read_differently_is_refused(body: bytes, said: str) -> None:
    if not said:
        assert loads(body) == {"a": "9" * 5000}
        return
    with pytest.raises(BodyRefused) as caught:
        loads(body)
    assert said in caught.value.reason
    assert caught.value.rule == "model-body"


def test_nesting_past_the_bound_is_refused_and_at_the_bound_is_read() -> None:
    at_bound = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    assert loads(f'{{"a": {at_bound}}}'.encode())["a"] is not None
    past = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    with pytest.raises(BodyRefused, match="nested"):
        loads(f'{{"a": {past}}}'.encode())
    with pytest.raises(BodyRefused, match="nested"):  # deep enough for a RecursionError
        loads(b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def test_a_body_past_its_size_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(BodyRefused, match="past"):
        loads(b" " * (MAX_BODY_BYTES + 1))


def test_a_lone_surrogate_is_refused_on_the_way_out() -> None:
    value = loads(b'{"a": "\\ud800"}')
    with pytest.raises(BodyRefused, match="surrogate"):
        dumps(value)


def test_what_goes_out_is_the_proxys_own_compact_serialisation() -> None:
    sent = b'{ "model" : "m",\n "t": "\\u00e9\\n", "n": 1.50, "l": [true, null] }'
    out = dumps(loads(sent))
    assert out == '{"model":"m","t":"é\\n","n":1.5,"l":[true,null]}'.encode()
    assert json.loads(out) == json.loads(sent)


ONE_PAST = b'{"a":[' + b",".join([b"0"] * (MAX_VALUES - 1)) + b"]}"  # 2**20 + 1 values
A_MILLION_DEEP = b'{"a":' + b"[" * 10**6 + b"]" * 10**6 + b"}"


class _NoParse:
    def decode(self, untrusted: bytes) -> object:
        raise AssertionError("a parser was given a body the scan refuses")


@pytest.mark.parametrize("body", [ONE_PAST, A_MILLION_DEEP], ids=["values", "depth"])
def test_a_body_of_millions_of_values_or_brackets_is_refused_before_any_parse(
    body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(strict_json, "_DECODER", _NoParse())
    monkeypatch.setattr(strict_json, "_reference_loads", _NoParse().decode)
    with pytest.raises(BodyRefused) as caught:
        loads(body)
    assert caught.value.rule == "model-body"
    assert "refused before it was parsed" in caught.value.reason


def test_a_body_just_under_the_value_limit_is_read() -> None:
    under = b'{"a":[' + b",".join([b"0"] * (MAX_VALUES - 2)) + b"]}"
    assert len(loads(under)["a"]) == MAX_VALUES - 2
