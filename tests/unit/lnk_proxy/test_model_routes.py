"""lnk_proxy.model_routes: each local runtime's inference routes reach it and nothing else does
(its admin API, a route not listed, another spelling of one); the head that goes upstream is
rebuilt from what was judged, the client's credentials dropped and the rule's key set."""

from __future__ import annotations

import pytest

from lnk_proxy.http_request import RequestRefused, parse_request_head
from lnk_proxy.model_routes import (
    ADMIN_EXAMPLES,
    ROUTES,
    judge_model_route,
    model_upstream_head,
    origin_form_as_proxy_head,
)
from lnk_shared.spec import Origin
from lnk_shared.spec_models import LOCAL_KINDS, ModelRule, parse_model_table


def _rule(kind: str, **extra: object) -> ModelRule:
    return parse_model_table({"kind": kind, "models": ["m"], **extra}, Origin("t", "models"))


OLLAMA = _rule("ollama")


@pytest.mark.parametrize(
    ("kind", "method", "path"),
    [
        ("ollama", "GET", "/"),
        ("ollama", "HEAD", "/"),
        ("ollama", "GET", "/api/version"),
        ("ollama", "GET", "/api/tags"),
        ("ollama", "GET", "/api/ps"),
        ("ollama", "POST", "/api/show"),
        ("ollama", "POST", "/api/generate"),
        ("ollama", "POST", "/api/chat"),
        ("ollama", "POST", "/api/embed"),
        ("ollama", "POST", "/api/embeddings"),
        ("ollama", "POST", "/v1/chat/completions"),
        ("ollama", "GET", "/v1/models"),
        ("ollama", "GET", "/v1/models/m"),
        ("ollama", "POST", "/v1/messages"),
        ("llamacpp", "POST", "/completion"),
        ("llamacpp", "GET", "/props"),
        ("llamacpp", "POST", "/tokenize"),
        ("llamacpp", "POST", "/v1/chat/completions"),
        ("vllm", "POST", "/v1/chat/completions"),
        ("vllm", "POST", "/v2/rerank"),
        ("vllm", "GET", "/health"),
        ("openai-compatible", "POST", "/v1/embeddings"),
        ("openai-compatible", "GET", "/v1/models"),
    ],
)
def test_an_inference_route_is_allowed(kind: str, method: str, path: str) -> None:
    route = judge_model_route(_rule(kind), method, path)
    assert (route.method, route.path) == (method, path)


@pytest.mark.parametrize(
    ("kind", "method", "path"),
    [(kind, method, path) for kind in LOCAL_KINDS for method, path in ADMIN_EXAMPLES[kind]]
    + [
        ("ollama", "GET", "/api/chat"),  # the right path, another method
        ("ollama", "PUT", "/api/generate"),
        ("ollama", "POST", "/API/PULL"),
        ("ollama", "POST", "/api/pull/x"),
        ("ollama", "POST", "/v1/files"),
        ("llamacpp", "POST", "/models/load"),
        ("openai-compatible", "POST", "/v1/responses"),  # stored responses: not in its table
        ("openai-compatible", "POST", "/api/chat"),  # another kind's route
        ("vllm", "POST", "/api/pull"),
    ],
)
def test_an_admin_or_unlisted_route_is_refused(kind: str, method: str, path: str) -> None:
    with pytest.raises(RequestRefused) as raised:
        judge_model_route(_rule(kind), method, path)
    assert raised.value.rule == "model-admin"


@pytest.mark.parametrize(
    "target",
    [
        "/api/%70ull",  # a percent-escape decoding to pull
        "/api/./pull",
        "/api/chat/../pull",
        "//api/pull",
        "/api//chat",
        "/api/chat/",
        "/api/chat;x",
        "/api/chat?x=1",
        "/api/chat?",
        "/api/ch\tat",
        "api/chat",
    ],
)
def test_another_spelling_of_a_path_is_refused(target: str) -> None:
    with pytest.raises(RequestRefused) as raised:
        judge_model_route(OLLAMA, "POST", target)
    assert raised.value.rule == "model-path"


def test_the_unsafe_switch_lets_an_admin_route_through() -> None:
    route = judge_model_route(OLLAMA, "POST", "/api/pull", check_route=False)
    assert (route.path, route.body) == ("/api/pull", "unjudged")
    with pytest.raises(RequestRefused):  # a path's spelling is still judged
        judge_model_route(OLLAMA, "POST", "/api/%70ull", check_route=False)


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_a_hosted_kind_is_not_served_here(kind: str) -> None:
    rule = parse_model_table({"kind": kind, "models": ["m"], "secret": "k"}, Origin("t", "models"))
    with pytest.raises(RequestRefused) as raised:
        judge_model_route(rule, "POST", "/v1/messages")
    assert raised.value.rule == "model-kind"


def test_every_table_lists_routes_in_their_judged_form() -> None:
    for table in ROUTES.values():
        for _, path, _, _, _ in table:
            assert path == "/" or (path.startswith("/") and not path.endswith("/"))


def test_the_upstream_head_is_rebuilt_and_the_credentials_are_the_rules() -> None:
    route = judge_model_route(OLLAMA, "POST", "/api/chat")
    headers = (
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer own-key"),
        ("X-Api-Key", "own"),
        ("Cookie", "a=b"),
        ("Proxy-Authorization", "Basic x"),
        ("Host", "evil.example"),
        ("Transfer-Encoding", "chunked"),
        ("Content-Length", "999"),
        ("Connection", "keep-alive"),
        ("User-Agent", "ollama-python"),
        ("Content-Encoding", "gzip"),
        ("X-HTTP-Method-Override", "DELETE"),
        ("X-Original-URL", "/api/delete"),
    )
    head = model_upstream_head(
        OLLAMA, route, headers, version="HTTP/1.1", body_length=12, secret=None
    ).decode()
    assert head.startswith("POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1:11434\r\n")
    assert "Content-Type: application/json" in head and "User-Agent: ollama-python" in head
    for gone in (
        "own",
        "a=b",
        "Basic",
        "evil",
        "chunked",
        "999",
        "keep-alive",
        "gzip",
        "DELETE",
        "delete",
    ):
        assert gone not in head
    assert "Content-Length: 12\r\n" in head and head.endswith("Connection: close\r\n\r\n")
    vllm = _rule("vllm", secret="k", upstream="http://[fd00::5]:9000")
    route = judge_model_route(vllm, "GET", "/v1/models")
    head = model_upstream_head(
        vllm, route, headers, version="HTTP/1.1", body_length=None, secret=b"the-key"
    ).decode()
    assert "Host: [fd00::5]:9000\r\n" in head and head.count("the-key") == 1
    assert "Authorization: Bearer the-key\r\n" in head and "Content-Length" not in head


@pytest.mark.parametrize(
    "head",
    [
        b"POST /api/chat HTTP/1.1\r\nHost: localhost:11434\r\nContent-Length: 2\r\n\r\n",
        b"POST /api/chat HTTP/1.1\r\nHost: a\r\nhost: b\r\nContent-Length: 2\r\n\r\n",
        b"POST /api/chat HTTP/1.1\r\nContent-Length: 2\r\n\r\n",
    ],
)
def test_an_origin_form_head_is_read_as_the_proxys_parser_reads_one(head: bytes) -> None:
    request = parse_request_head(origin_form_as_proxy_head(head, 11434))
    assert (request.kind, request.host, request.port, request.path) == (
        "http",
        "127.0.0.1",
        11434,
        "/api/chat",
    )
    assert request.framing.length == 2


@pytest.mark.parametrize(
    "head",
    [
        b"POST http://evil.example/api/chat HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n",
        b"POST * HTTP/1.1\r\n\r\n",
    ],
)
def test_a_head_in_another_form_on_a_model_port_is_refused(head: bytes) -> None:
    with pytest.raises(RequestRefused) as raised:
        origin_form_as_proxy_head(head, 11434)
    assert raised.value.rule == "model-path"
