"""lnk_proxy.model_bodies: a model request's JSON, parsed strictly, judged and re-serialised.
Each attack is a row: a model not allowed (a cloud one by a prefix, a second spelling in
`name`, a duplicate key), a URL the runtime would fetch, a server-side tool, a template."""

from __future__ import annotations

import json

import pytest

from lnk_proxy.http_request import RequestRefused
from lnk_proxy.model_bodies import MAX_JSON_DEPTH, judge_model_body, parse_strict_json
from lnk_proxy.model_routes import judge_model_route
from lnk_proxy.strict_json import MAX_VALUES
from lnk_shared.spec import Origin
from lnk_shared.spec_models import ModelRule, parse_model_table


def _rule(kind: str, models: list[str]) -> ModelRule:
    return parse_model_table({"kind": kind, "models": models}, Origin("t", "models"))


OLLAMA = _rule("ollama", ["llama3.2:3b", "qwen2.5*", "gpt-oss:120b-cloud"])
VLLM = _rule("vllm", ["Qwen/Qwen2.5-7B"])
LLAMACPP = _rule("llamacpp", ["local"])
PNG = "data:image/png;base64,iVBORw0KGgo="


def _judge(rule: ModelRule, path: str, body: object, method: str = "POST") -> bytes | None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return judge_model_body(rule, judge_model_route(rule, method, path), raw)


@pytest.mark.parametrize(
    ("rule", "path", "body"),
    [
        (OLLAMA, "/api/chat", {"model": "llama3.2:3b", "messages": [{"role": "user"}]}),
        (OLLAMA, "/api/generate", {"model": "qwen2.5-coder:7b", "prompt": "hi", "raw": True}),
        (OLLAMA, "/api/generate", {"model": "gpt-oss:120b-cloud", "prompt": "named exactly"}),
        (OLLAMA, "/api/show", {"model": "llama3.2:3b"}),
        (OLLAMA, "/api/show", {"name": "llama3.2:3b"}),
        (OLLAMA, "/api/embed", {"model": "llama3.2:3b", "input": ["a", "b"]}),
        (OLLAMA, "/api/chat", {"model": "llama3.2:3b", "tools": [{"type": "function"}]}),
        (OLLAMA, "/api/chat", {"model": "llama3.2:3b", "messages": [{"images": ["iVBO"]}]}),
        (
            VLLM,
            "/v1/chat/completions",
            {"model": "Qwen/Qwen2.5-7B", "messages": [{"content": [{"image_url": {"url": PNG}}]}]},
        ),
        (VLLM, "/v1/chat/completions", {"model": "Qwen/Qwen2.5-7B", "text": "see https://x"}),
        (LLAMACPP, "/completion", {"prompt": "no model: a single-model server"}),
        (LLAMACPP, "/v1/chat/completions", {"model": "local", "messages": []}),
    ],
)
def test_an_inference_body_is_forwarded_as_the_proxy_serialises_it(
    rule: ModelRule, path: str, body: dict[str, object]
) -> None:
    forwarded = _judge(rule, path, body)
    assert forwarded == json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def test_the_forwarded_body_is_the_proxys_not_the_clients_bytes() -> None:
    raw = b'{ "model" : "llama3.2:3b" , "prompt":"\\u00e9" }'
    assert _judge(OLLAMA, "/api/generate", raw) == '{"model":"llama3.2:3b","prompt":"é"}'.encode()


@pytest.mark.parametrize(
    ("rule", "path", "body", "why"),
    [
        (OLLAMA, "/api/chat", {"model": "llama3.1:8b"}, "model-not-allowed"),
        (OLLAMA, "/api/chat", {"messages": []}, "model-not-allowed"),
        (OLLAMA, "/api/chat", {"model": 7}, "model-not-allowed"),
        (OLLAMA, "/api/generate", {"model": "qwen2.5:7b-cloud"}, "model-not-allowed"),
        (OLLAMA, "/api/generate", {"model": "qwen2.5:cloud"}, "model-not-allowed"),
        (OLLAMA, "/api/show", {"model": "llama3.2:3b", "name": "other:1b"}, "model-not-allowed"),
        (OLLAMA, "/api/show", {"name": "other:1b"}, "model-not-allowed"),
        (VLLM, "/v1/chat/completions", {"model": "qwen/qwen2.5-7b"}, "model-not-allowed"),
        (VLLM, "/v1/embeddings", {"input": "x"}, "model-not-allowed"),
        (LLAMACPP, "/completion", {"model": "other", "prompt": "x"}, "model-not-allowed"),
        (
            OLLAMA,
            "/api/generate",
            {"model": "llama3.2:3b", "template": "{{ .Prompt }}"},
            "model-field",
        ),
        (
            VLLM,
            "/v1/chat/completions",
            {"model": "Qwen/Qwen2.5-7B", "chat_template": "x"},
            "model-field",
        ),
        (
            VLLM,
            "/v1/completions",
            {"model": "Qwen/Qwen2.5-7B", "logits_processors": ["os.system"]},
            "model-field",
        ),
        (
            VLLM,
            "/v1/chat/completions",
            {"model": "Qwen/Qwen2.5-7B", "web_search_options": {}},
            "model-field",
        ),
        (
            VLLM,
            "/v1/chat/completions",
            {
                "model": "Qwen/Qwen2.5-7B",
                "messages": [{"content": [{"image_url": {"url": "http://10.0.0.1/a.png"}}]}],
            },
            "model-url",
        ),
        (
            VLLM,
            "/v1/chat/completions",
            {"model": "Qwen/Qwen2.5-7B", "messages": [{"content": [{"video_url": "https://x"}]}]},
            "model-url",
        ),
        (
            VLLM,
            "/v1/chat/completions",
            {"model": "Qwen/Qwen2.5-7B", "m": [{"audio_url": {"url": "file:///etc/shadow"}}]},
            "model-url",
        ),
        (
            VLLM,
            "/v1/chat/completions",
            {"model": "Qwen/Qwen2.5-7B", "m": [{"image_url": {"url": "DATA:x"}}]},
            "model-url",
        ),
        (VLLM, "/v1/chat/completions", {"model": "Qwen/Qwen2.5-7B", "file_id": "f"}, "model-url"),
        (
            OLLAMA,
            "/v1/messages",
            {"model": "llama3.2:3b", "messages": [{"content": [{"source": {"type": "url"}}]}]},
            "model-url",
        ),
        (
            OLLAMA,
            "/api/chat",
            {"model": "llama3.2:3b", "tools": [{"type": "web_search"}]},
            "model-tool",
        ),
        (
            OLLAMA,
            "/v1/messages",
            {"model": "llama3.2:3b", "tools": [{"type": "web_fetch_20250910"}]},
            "model-tool",
        ),
        (OLLAMA, "/api/chat", {"model": "llama3.2:3b", "tools": {"type": "x"}}, "model-tool"),
        (OLLAMA, "/api/chat", {"model": "llama3.2:3b", "tools": ["x"]}, "model-tool"),
        (OLLAMA, "/api/chat", ["model", "llama3.2:3b"], "model-body"),
    ],
)
def test_a_body_past_inference_is_refused(
    rule: ModelRule, path: str, body: object, why: str
) -> None:
    with pytest.raises(RequestRefused) as raised:
        _judge(rule, path, body)
    assert raised.value.rule == why


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "llama3.2:3b", "model": "llama3.1:8b"}',  # which one a runtime keeps: its call
        b'{"model": "llama3.2:3b", "options": {"a": 1, "a": 2}}',
        b'{"model": "llama3.2:3b", "temperature": NaN}',
        b'{"model": "llama3.2:3b", "temperature": Infinity}',
        b'{"model": "llama3.2:3b", "prompt": "\\ud800"}',  # a lone surrogate
        b'{"model": "llama3.2:3b"} trailing',
        b'{"model": "llama3.2:3b",}',
        b"\xff\xfe{}",
        b'\xef\xbb\xbf{"model": "llama3.2:3b"}',  # a byte-order mark
        b"",
        b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1),
        b"[" * 100_000,
    ],
)
def test_a_body_that_is_not_one_strict_json_object_is_refused(raw: bytes) -> None:
    with pytest.raises(RequestRefused) as raised:
        _judge(OLLAMA, "/api/generate", raw)
    assert raised.value.rule == "model-body"


def test_a_route_without_a_body_takes_none_and_a_path_model_is_judged() -> None:
    assert _judge(OLLAMA, "/api/tags", b"", "GET") is None
    assert _judge(OLLAMA, "/v1/models/llama3.2:3b", b"", "GET") is None
    with pytest.raises(RequestRefused) as raised:
        _judge(OLLAMA, "/v1/models/llama3.1:8b", b"", "GET")
    assert raised.value.rule == "model-not-allowed"
    with pytest.raises(RequestRefused) as raised:
        _judge(OLLAMA, "/api/tags", b"{}", "GET")
    assert raised.value.rule == "model-body"


def test_a_deep_but_bounded_body_parses() -> None:
    depth = MAX_JSON_DEPTH - 1
    assert parse_strict_json(b"[" * depth + b"]" * depth) is not None


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"llama3.2:3b","x":[' + b",".join([b"0"] * MAX_VALUES) + b"]}",
        b'{"model":"llama3.2:3b","x":' + b"[" * 10**6 + b"]" * 10**6 + b"}",
    ],
    ids=["values", "depth"],
)
def test_a_body_of_millions_of_values_or_brackets_is_refused_before_any_parse(
    raw: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_parse(*args: object, **kwargs: object) -> object:
        raise AssertionError("the parser was given a body the scan refuses")

    monkeypatch.setattr(json, "loads", no_parse)
    with pytest.raises(RequestRefused) as raised:
        _judge(OLLAMA, "/api/generate", raw)
    assert raised.value.rule == "model-body"
    assert "refused before it was parsed" in raised.value.reason


def test_a_body_just_under_the_value_limit_is_judged_and_forwarded() -> None:
    under = b'{"model":"llama3.2:3b","x":[' + b",".join([b"0"] * (MAX_VALUES - 5)) + b"]}"
    forwarded = _judge(OLLAMA, "/api/generate", under)
    assert forwarded == under
