"""The test-only naive screen (`unsafe_naive_content_screen`): what the C pass refuses or sends
down the full parse, it forwards as the client's bytes, with a warning; what it does not pass,
goes the strict way. `lnk sandbox check`'s fast-form probes lean on exactly these spellings."""

from __future__ import annotations

import pytest

from lnk_proxy.hosted_models import IssuedIds, judge_hosted
from lnk_proxy.http_request import RequestRefused
from lnk_proxy.unsafe_naive_screen import naive_spans

PLACEHOLDER = "lnk-secret-claude"
# Each spelling the strict pass stops (the rule of its refusal), which the naive one lets by.
ATTACKS = {
    b'{"type": "text", "text": "a", "\\u0073ource": {"url": "https://x.example/a.png"}}': (
        "model-fetch"
    ),
    b'{"type": "text", "text": "a", "file_\\u0069d": "file_1"}': "model-fetch",
    b'{"\\u0074ype": "server_tool_use", "type": "text", "text": "a"}': "model-body",
    b'{"type": "text", "text": "\xff\xfe"}': "model-body",
    b'{"type": "text", "text": "\\ud800"}': "model-body",
    b'{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "x"},'
    b' {"type": "text", "text": "y", "\\u0073ource": {"url": "https://x.example/"}}]}': (
        "model-fetch"
    ),
}


def body(block: bytes) -> bytes:
    return (
        b'{"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": ['
        + block
        + b"]}]}"
    )


def judge(untrusted: bytes, *, naive: bool) -> bytes:
    return judge_hosted(
        "anthropic",
        PLACEHOLDER,
        lambda model: model == "claude-x",
        method="POST",
        target="/v1/messages",
        headers=(("x-api-key", PLACEHOLDER),),
        untrusted_body=untrusted,
        issued=IssuedIds(),
        naive_screen=naive,
    ).body


@pytest.mark.parametrize("block", list(ATTACKS))
def test_what_the_strict_pass_stops_the_naive_screen_forwards_as_written(
    block: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(RequestRefused) as refused:
        judge(body(block), naive=False)
    assert refused.value.rule == ATTACKS[block]
    sent = judge(body(block), naive=True)
    assert block in sent  # the client's bytes, escapes and all, reach the provider
    assert "unsafe_naive_content_screen" in caplog.text


@pytest.mark.parametrize(
    "block",
    [
        b'{"type": "image", "source": {"type": "url", "url": "https://x.example/a.png"}}',
        b'{"type": "item_reference", "id": "msg_1"}',
    ],
)
def test_a_judged_name_as_written_still_goes_the_strict_way(block: bytes) -> None:
    assert naive_spans(body(block)) is None
    with pytest.raises(RequestRefused) as refused:
        judge(body(block), naive=True)
    assert refused.value.rule == "model-fetch"


def test_a_plain_conversation_is_the_same_either_way() -> None:
    plain = body(b'{"type": "text", "text": "hi"}')
    assert judge(plain, naive=True) == judge(plain, naive=False)


@pytest.mark.parametrize("untrusted", [b"[]", b"{", b'{"model": "x"}', b"\xff"])
def test_no_object_or_no_content_gives_no_spans(untrusted: bytes) -> None:
    assert naive_spans(untrusted) is None


def test_the_bounds_stand_with_the_naive_screen() -> None:
    """Only the spelling screen is naive: a body past the values bound is refused before any
    parse, content nested past MAX_DEPTH goes the strict way (refused), and nesting past the
    standard library decoder's own limit is no crash."""
    from lnk_proxy.strict_json import MAX_DEPTH, MAX_VALUES, BodyRefused

    wide = body(b'{"type": "text", "text": "a", "n": [' + b"0," * MAX_VALUES + b"0]}")
    with pytest.raises(BodyRefused) as refused:
        naive_spans(wide)
    assert "before it was parsed" in refused.value.reason
    deep = body(b'{"type": "text", "text": "a", "n": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}")
    assert naive_spans(deep) is None
    with pytest.raises(RequestRefused):
        judge(deep, naive=True)
