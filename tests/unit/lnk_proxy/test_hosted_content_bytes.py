"""A hosted rule's fast form (hosted_bodies' docstring): the content (`messages`, `system`,
`input`, `instructions`) forwarded as the client's validated bytes inside the proxy's own
envelope, only when the C pass proved that nothing the rule judges is in it. Each attack tries
to slip a judged name through that form: an escaped key or `type`, a key given twice whose first
is harmless, a server tool's block deep inside a tool_result, bytes that are not UTF-8, a lone
surrogate, a number one parser reads otherwise, a body one past each bound. Each is refused, or
sent down the full parse (what goes upstream is then the proxy's compact serialisation, no
byte of the client's spelling), and what goes upstream, read by an independent parser that
keeps every pair of every object, holds nothing judged. The granted path: a plain conversation
goes byte for byte, its envelope judged (a server tool removed) and re-serialised."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import msgspec
import pytest

from lnk_proxy import _json_scan, hosted_bodies, strict_json
from lnk_proxy.hosted_models import HostedForward, IssuedIds, judge_hosted
from lnk_proxy.http_request import RequestRefused
from lnk_proxy.strict_json import MAX_DEPTH, MAX_VALUES

from .test_json_shape import BODIES_PER_SEED, SEEDS, _typed, generated

PLACEHOLDER = "lnk-secret-claude"
JUDGED_KEYS = frozenset(hosted_bodies.FETCH_NAMES)
# What the full parse forwards has no space between tokens; each body below spells its content
# with json.dumps's default ", " and ": ", which only the fast form keeps.
SPACED = b'", "'


def forward(body: bytes | bytearray, kind: str = "anthropic") -> HostedForward:
    target = "/v1/messages" if kind == "anthropic" else "/v1/responses"
    return judge_hosted(
        kind,
        PLACEHOLDER,
        lambda model: model in ("claude-x", "gpt-x"),
        method="POST",
        target=target,
        headers=(("x-api-key", PLACEHOLDER),),
        untrusted_body=body,
        issued=IssuedIds(),
    )


def upstream_reads(sent: bytes) -> tuple[list[str], list[object]]:
    """(every key of every object, every `type` value) of what goes upstream, by the standard
    library's parser keeping every pair (a key given twice would show twice)."""
    keys: list[str] = []
    types: list[object] = []

    def pairs(found: list[tuple[str, Any]]) -> dict[str, Any]:
        keys.extend(k for k, _ in found)
        types.extend(v for k, v in found if k == "type")
        return dict(found)

    json.loads(sent, object_pairs_hook=pairs)
    assert len(set(keys)) <= len(keys)
    return keys, types


def assert_nothing_judged_arrives(sent: bytes) -> None:
    keys, types = upstream_reads(sent)
    assert not JUDGED_KEYS & set(keys), sent[:200]
    assert "item_reference" not in types
    assert sent.isascii() or sent.decode("utf-8")  # valid UTF-8 (decode raises otherwise)


def conversation(*blocks: object, spaced: bool = True) -> bytes:
    body = {
        "model": "claude-x",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": list(blocks)}],
    }
    return json.dumps(body).encode() if spaced else json.dumps(body, separators=(",", ":")).encode()


def with_messages(messages: bytes) -> bytes:
    return b'{"model": "claude-x", "max_tokens": 8, "messages": ' + messages + b"}"


TEXT = {"type": "text", "text": "the quick brown fox"}


def test_a_plain_conversation_goes_byte_for_byte_in_the_proxys_judged_envelope() -> None:
    """The granted path: the content as the client spelt it, the envelope judged and compact."""
    messages = [{"role": "user", "content": [TEXT, {"type": "text", "text": "é \\u263a"}]}]
    spelt = json.dumps(messages, ensure_ascii=False).encode()
    tools = [{"name": "lookup", "input_schema": {}}, {"type": "web_search_20250305", "name": "w"}]
    body = (
        b'{ "model" : "claude-x", "max_tokens": 8, "tools": '
        + json.dumps(tools).encode()
        + b', "messages": '
        + spelt
        + b"}"
    )
    sent = forward(body)
    assert sent.body == (
        b'{"model":"claude-x","max_tokens":8,"tools":[{"name":"lookup","input_schema":{}}],'
        b'"messages":' + spelt + b"}"
    )
    assert "removed tool 'web_search_20250305'" in sent.removed
    assert json.loads(sent.body)["messages"] == messages
    parsed = strict_json.read(body, content_as_bytes=True)
    assert parsed.as_bytes == ("messages",)
    assert type(parsed.value["messages"]) is msgspec.Raw


def test_every_content_key_and_kind_takes_the_fast_form() -> None:
    body = (
        b'{"model": "gpt-x", "instructions": "be brief", "input": [{"type": "message", "role":'
        b' "user", "content": [{"type": "input_text", "text": "hi"}]}]}'
    )
    parsed = strict_json.read(body, content_as_bytes=True)
    assert parsed.as_bytes == ("instructions", "input")
    assert forward(body, "openai").body.endswith(body[body.index(b'"input"') + 9 :])


@pytest.mark.parametrize(
    "block",
    [
        # a fetch-bearing key spelt with an escape: the upstream decodes it to `source`
        b'{"type": "image", "\\u0073ource": {"type": "url", "url": "https://x.example/a.png"}}',
        b'{"type": "image", "sourc\\u0065": {"type": "url", "url": "https://x.example/a.png"}}',
        b'{"type": "document", "file_\\u0069d": "file_1"}',
        b'{"type": "input_image", "image\\u005furl": "https://x.example/a.png"}',
        b'{"type": "input_file", "\\u0066ile_url": "https://x.example/a.pdf"}',
        # the judged `type` value, and the `type` key, spelt with an escape
        b'{"type": "item_r\\u0065ference", "id": "msg_1"}',
        b'{"\\u0074ype": "item_reference", "id": "msg_1"}',
        # inside a tool_result, two levels down
        b'{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image",'
        b' "\\u0073ource": {"type": "url", "url": "https://x.example/a.png"}}]}',
    ],
)
def test_an_escaped_spelling_of_a_judged_name_is_refused(block: bytes) -> None:
    with pytest.raises(RequestRefused) as refused:
        forward(with_messages(b'[{"role": "user", "content": [' + block + b"]}]"))
    assert refused.value.rule == "model-fetch"


@pytest.mark.parametrize(
    "block",
    [
        b'{"type": "text", "text": "a", "type": "server_tool_use"}',
        b'{"type": "text", "text": "a", "t\\u0079pe": "mcp_tool_use"}',
        b'{"type": "image", "source": {"type": "base64", "type": "url"}}',
        b'{"type": "text", "text": "a", "image_url": "data:,x", "image_url": "https://x.example/"}',
    ],
)
def test_a_key_given_twice_whose_first_is_harmless_is_refused(block: bytes) -> None:
    with pytest.raises(RequestRefused) as refused:
        forward(with_messages(b'[{"role": "user", "content": [' + block + b"]}]"))
    assert refused.value.rule == "model-body"
    assert "twice" in refused.value.reason


@pytest.mark.parametrize(
    "deep",
    [
        {"type": "web_search_tool_result", "tool_use_id": "s", "content": []},
        {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
        {"type": "mcp_tool_use", "id": "m", "name": "x", "server_name": "s", "input": {}},
        {"type": "container_upload", "id": "c"},
        {"type": "whatever_ships_next"},
        {"type": 7},
        {"type": ["text"]},
    ],
)
def test_a_server_tools_block_deep_in_a_tool_result_takes_the_full_parse(deep: object) -> None:
    """Not a refusal (the full parse forwards history as it did), but never the client's bytes:
    the upstream reads the proxy's serialisation of what was judged."""
    result = {"type": "tool_result", "tool_use_id": "t", "content": [TEXT, deep]}
    body = conversation(TEXT, result)
    sent = forward(body)
    assert SPACED not in sent.body
    assert sent.body == strict_json.dumps(json.loads(body))
    assert strict_json.read(body, content_as_bytes=True).as_bytes == ()
    assert_nothing_judged_arrives(sent.body)


@pytest.mark.parametrize(
    "spelling",
    [
        b'"\xff"',  # no UTF-8 at all
        b'"\xc0\xaf"',  # an overlong '/'
        b'"\xed\xa0\x80"',  # a surrogate encoded
        b'"\\ud800"',  # a lone surrogate escape
        b'"\\udc00 x"',
        b'"\\ud800\\u0041"',
    ],
)
def test_a_string_one_parser_reads_otherwise_is_refused(spelling: bytes) -> None:
    block = b'{"type": "text", "text": ' + spelling + b"}"
    with pytest.raises(RequestRefused) as refused:
        forward(with_messages(b'[{"role": "user", "content": [' + block + b"]}]"))
    assert refused.value.rule == "model-body"


@pytest.mark.parametrize("number", [b"1e400", b"-1E400", b"1" * 5000])
def test_a_number_past_a_double_in_the_content_is_refused_as_by_the_full_parse(
    number: bytes,
) -> None:
    with pytest.raises(RequestRefused) as refused:
        forward(with_messages(b'[{"role": "user", "content": [' + number + b"]}]"))
    assert refused.value.rule == "model-body"


@pytest.mark.parametrize("number", [b"1.5e3", b"12345678901234567890", b"0.1000000000000000055511"])
def test_a_number_a_parser_could_round_takes_the_full_parse(number: bytes) -> None:
    body = with_messages(b'[{"role": "user", "content": "hi", "n": ' + number + b"}]")
    assert strict_json.read(body, content_as_bytes=True).as_bytes == ()
    assert forward(body).body == strict_json.dumps(json.loads(body))


def _nested(levels: int) -> bytes:
    """A messages value whose containers reach `levels` deep in the body (the top is 1)."""
    inner = levels - 2  # the top object and the messages array
    return with_messages(b"[" + b"[" * inner + b"]" * inner + b"]")


def test_nesting_one_past_the_bound_in_the_content_is_refused() -> None:
    assert strict_json.read(_nested(MAX_DEPTH), content_as_bytes=True).as_bytes == ("messages",)
    with pytest.raises(RequestRefused) as refused:
        forward(_nested(MAX_DEPTH + 1))
    assert refused.value.rule == "model-body"


def test_an_object_past_the_pass_key_table_takes_the_full_parse() -> None:
    """Past MAX_KEYS the pass judges nothing: the full parse does, and finds the fetch."""
    keys = ", ".join(f'"k{i}": 1' for i in range(_json_scan.MAX_KEYS))
    plain = with_messages(b'[{"role": "user", "content": "hi", ' + keys.encode() + b"}]")
    sent = forward(plain)
    assert SPACED not in sent.body and b'"k0":1' in sent.body
    fetch = b'[{"role": "user", "content": [{"type": "input_file", ' + keys.encode()
    with pytest.raises(RequestRefused) as refused:
        forward(with_messages(fetch + b', "file_url": "https://x.example/a.pdf"}]}]'))
    assert refused.value.rule == "model-fetch"


def test_values_one_past_the_bound_in_the_content_are_refused() -> None:
    # the body's { : : : , , and the messages array's [ are 7 of them; each number after the
    # first adds its comma
    at_bound = with_messages(b"[" + b"0," * (MAX_VALUES - 7) + b"0]")
    assert _json_scan.scan(at_bound, MAX_DEPTH, MAX_VALUES)[0] == _json_scan.OK
    with pytest.raises(RequestRefused) as refused:
        forward(with_messages(b"[" + b"0," * (MAX_VALUES - 6) + b"0]"))
    assert refused.value.rule == "model-body"


def test_a_body_past_the_byte_bound_is_refused() -> None:
    empty = with_messages(b'[{"role": "user", "content": ""}]')
    pad = b"x" * (strict_json.MAX_BODY_BYTES - len(empty) + 1)
    body = with_messages(b'[{"role": "user", "content": "' + pad + b'"}]')
    assert len(body) > strict_json.MAX_BODY_BYTES
    with pytest.raises(RequestRefused) as refused:
        forward(body)
    assert refused.value.rule == "model-body"


def test_a_content_key_spelt_with_an_escape_is_parsed_and_judged_whole() -> None:
    """The pass takes a top-level key as content only as written: `messag\\u0065s` is parsed."""
    url = b'[{"role": "user", "content": [{"type": "image", "source": {"type": "url"}}]}]'
    with pytest.raises(RequestRefused) as refused:
        forward(b'{"model": "claude-x", "messag\\u0065s": ' + url + b"}")
    assert refused.value.rule == "model-fetch"
    plain = b'{"model": "claude-x", "messag\\u0065s": [{"role": "user", "content": "hi"}]}'
    assert strict_json.read(plain, content_as_bytes=True).as_bytes == ()


def test_a_fetch_name_outside_the_content_does_not_unscreen_it() -> None:
    """A tool's schema may name `source`: the content stays proven plain on its own, and a
    fetch in the content is still refused beside such a tool."""
    tools = b'[{"name": "f", "input_schema": {"properties": {"source": {"type": "string"}}}}]'
    body = b'{"model": "claude-x", "tools": ' + tools + b', "messages": [{"role": "user"}]}'
    parsed = strict_json.read(body, content_as_bytes=True)
    assert parsed.fetch_seen is True and parsed.as_bytes == ("messages",)
    assert forward(body).body.endswith(b'"messages":[{"role": "user"}]}')
    fetch = b'[{"role": "user", "content": [{"type": "image", "source": {"type": "url"}}]}]'
    with pytest.raises(RequestRefused):
        forward(b'{"model": "claude-x", "tools": ' + tools + b', "messages": ' + fetch + b"}")


def test_the_pass_lists_are_hosted_bodies_lists() -> None:
    assert _json_scan.CONTENT_KEYS == hosted_bodies.CONTENT_KEYS
    assert _json_scan.PLAIN_TYPES == hosted_bodies.PLAIN_TYPES
    assert not set(hosted_bodies.PLAIN_TYPES) & set(hosted_bodies.FETCH_NAMES)


CORPUS = [
    conversation(TEXT),
    conversation(TEXT, spaced=False),
    conversation({"type": "tool_use", "id": "t", "name": "f", "input": {"type": "url"}}),
    conversation({"type": "tool_use", "id": "t", "name": "f", "input": {"source": "x"}}),
    conversation({"type": "image", "source": {"type": "base64", "data": "AA=="}}),
    conversation({"type": "text", "text": "source", "cache_control": {"type": "ephemeral"}}),
    conversation({"type": "text", "text": "x", "citations": [{"type": "char_location"}]}),
    with_messages(
        b'[{"role": "user", "content": "\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00"}]'
    ),
    with_messages(b"[1, -0, 0.5, -12.25, true, false, null, {}, []]"),
    b'{"model": "claude-x", "system": [{"type": "text", "text": "s"}], "messages": []}',
    b'{"model": "claude-x", "messages": [], "extra": {"source": {"type": "url"}}}',
]


@pytest.mark.parametrize("body", CORPUS)
def test_the_fast_form_sends_what_the_full_parse_judged(body: bytes) -> None:
    """Same verdict and same value upstream as the full parse (only the spelling may differ)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(strict_json, "_with_content_as_bytes", lambda *_: None)
        try:
            full: object = json.loads(forward(body).body)
        except RequestRefused as refused:
            full = refused.rule
    try:
        fast: object = json.loads(forward(body).body)
    except RequestRefused as refused:
        fast = refused.rule
    assert fast == full


@pytest.mark.parametrize("seed", SEEDS)
def test_over_the_fuzz_corpus_the_fast_form_gives_the_full_parses_verdict(seed: int) -> None:
    """test_json_shape's generated bodies (escapes, keys twice, nesting and numbers at every
    limit, one-byte mutations), each as a message: one verdict, one value upstream."""
    fast_taken = 0
    for generated_body in generated(seed):
        body = b'{"model": "claude-x", "messages": [' + generated_body + b"]}"
        with contextlib.suppress(RequestRefused):
            fast_taken += bool(strict_json.read(body, content_as_bytes=True).as_bytes)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(strict_json, "_with_content_as_bytes", lambda *_: None)
            full = _outcome(body)
        assert _outcome(body) == full, body
    assert fast_taken > BODIES_PER_SEED // 10


def _outcome(body: bytes) -> tuple[object, ...]:
    try:
        sent = forward(body).body
    except RequestRefused as refused:
        return ("refused", refused.rule, refused.reason)
    return ("ok", _typed(json.loads(sent)))


@pytest.mark.parametrize("seed", SEEDS[:1])
def test_a_body_read_into_a_bytearray_is_judged_as_its_bytes(seed: int) -> None:
    """hosted_relay reads a large body in place into a bytearray: every verdict, and every
    byte sent upstream, is the one its bytes get (the corpus above and generated bodies)."""
    bodies = [*CORPUS]
    bodies += [b'{"model": "claude-x", "messages": [' + g + b"]}" for g in generated(seed)]
    for body in bodies:
        try:
            sent: object = forward(body).body
        except RequestRefused as refused:
            sent = (refused.rule, refused.reason)
        try:
            in_place: object = forward(bytearray(body)).body
        except RequestRefused as refused:
            in_place = (refused.rule, refused.reason)
        assert in_place == sent, body
