"""lnk_proxy.model_listings: a local runtime's model listing cut to the rule's allowlist. Each
row is a runtime's answer and what the sandbox may see of it: a model the rule does not list
(by name, by a second spelling in `model`, by a cloud name under a prefix) is gone, as is every
key the proxy does not know; an answer it cannot read is refused, never passed on."""

from __future__ import annotations

import json

import pytest

from lnk_proxy.model_listings import (
    LISTINGS,
    MAX_LISTING_BYTES,
    ListingUnreadable,
    cut_listing,
    filter_listing,
    is_listing,
)
from lnk_proxy.model_routes import judge_model_route
from lnk_shared.spec import Origin
from lnk_shared.spec_models import ModelRule, parse_model_table


def _rule(kind: str, models: list[str]) -> ModelRule:
    return parse_model_table({"kind": kind, "models": models}, Origin("t", "models"))


OLLAMA = _rule("ollama", ["llama3.2:3b", "qwen2.5*"])
VLLM = _rule("vllm", ["Qwen/Qwen2.5-7B"])
LLAMACPP = _rule("llamacpp", ["local"])


def _m(name: str, model: str | None = None, **more: object) -> dict[str, object]:
    return {"name": name, "model": model or name, **more}


@pytest.mark.parametrize(
    ("rule", "path", "answer", "seen"),
    [
        (
            OLLAMA,
            "/api/tags",
            {"models": [_m("llama3.2:3b", size=1), _m("llama3.1:8b"), _m("qwen2.5:7b")]},
            {"models": [_m("llama3.2:3b", size=1), _m("qwen2.5:7b")]},
        ),
        (OLLAMA, "/api/ps", {"models": [_m("llama3.1:8b")]}, {"models": []}),
        (OLLAMA, "/api/tags", {"models": None}, {"models": []}),  # Ollama's way to say none
        (  # a second spelling of the name: every one given must be allowed
            OLLAMA,
            "/api/tags",
            {"models": [_m("llama3.2:3b", "llama3.1:8b"), {"name": "llama3.2:3b"}]},
            {"models": [{"name": "llama3.2:3b"}]},
        ),
        (  # a cloud model is never allowed by a prefix
            OLLAMA,
            "/api/tags",
            {"models": [_m("qwen2.5:480b-cloud"), _m("qwen2.5:1b")]},
            {"models": [_m("qwen2.5:1b")]},
        ),
        (  # entries that name no model, or not as a string: gone
            OLLAMA,
            "/api/tags",
            {"models": [{"size": 1}, {"name": 3}, "llama3.2:3b", None, _m("llama3.2:3b")]},
            {"models": [_m("llama3.2:3b")]},
        ),
        (  # a key the proxy does not know could list models too: gone
            OLLAMA,
            "/api/tags",
            {"models": [], "all_models": ["llama3.1:8b"]},
            {"models": []},
        ),
        (
            OLLAMA,
            "/v1/models",
            {"object": "list", "data": [{"id": "llama3.2:3b"}, {"id": "llama3.1:8b"}]},
            {"object": "list", "data": [{"id": "llama3.2:3b"}]},
        ),
        (
            VLLM,
            "/v1/models",
            {"object": "list", "data": [{"id": "Qwen/Qwen2.5-7B", "root": "x"}, {"id": "lora-1"}]},
            {"object": "list", "data": [{"id": "Qwen/Qwen2.5-7B", "root": "x"}]},
        ),
        (  # llama.cpp's /models carries both lists
            LLAMACPP,
            "/models",
            {"models": [_m("local"), _m("other")], "object": "list", "data": [{"id": "other"}]},
            {"models": [_m("local")], "object": "list", "data": []},
        ),
    ],
)
def test_a_listing_keeps_only_the_rules_models(
    rule: ModelRule, path: str, answer: dict[str, object], seen: dict[str, object]
) -> None:
    assert cut_listing(rule, path, answer) == seen
    forwarded = filter_listing(rule, path, json.dumps(answer).encode())
    assert json.loads(forwarded) == seen


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/api/tags", b"not json"),
        ("/api/tags", b'["llama3.1:8b"]'),  # not an object
        ("/api/tags", b'{"error": "llama3.1:8b failed"}'),  # no list: nothing to cut
        ("/api/tags", b'{"models": {"llama3.1:8b": {}}}'),  # not a list
        ("/v1/models", b'{"object": ["llama3.1:8b"], "data": []}'),
        ("/api/tags", b"\x1f\x8b\x08\x00"),  # gzip: not plain JSON
        ("/api/tags", b"[" * 100_000),
        ("/api/tags", b'{"models": []}' + b" " * MAX_LISTING_BYTES),
    ],
)
def test_an_answer_that_cannot_be_read_is_refused_never_passed_on(path: str, raw: bytes) -> None:
    with pytest.raises(ListingUnreadable):
        filter_listing(OLLAMA, path, raw)


def test_the_listings_are_the_get_routes_of_each_kind_that_list_models() -> None:
    assert is_listing(OLLAMA, judge_model_route(OLLAMA, "GET", "/api/tags"))
    assert not is_listing(OLLAMA, judge_model_route(OLLAMA, "HEAD", "/api/tags"))  # no body
    assert not is_listing(OLLAMA, judge_model_route(OLLAMA, "GET", "/api/version"))
    assert not is_listing(OLLAMA, judge_model_route(OLLAMA, "GET", "/v1/models/llama3.2:3b"))
    assert is_listing(LLAMACPP, judge_model_route(LLAMACPP, "GET", "/models"))
    for kind, path in LISTINGS:  # each is a route its kind's table allows
        rule = _rule(kind, ["m"])
        assert judge_model_route(rule, "GET", path).path == path
