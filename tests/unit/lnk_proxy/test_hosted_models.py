"""lnk_proxy.hosted_models: which requests to a hosted model rule go to the provider, with which
headers and key. Each attack is a row: a non-inference endpoint (the owner's files, batches,
admin), another spelling of an allowed path, a key of the sandbox's own, a beta that makes the
provider fetch or run code, a response id this sandbox was not given."""

from __future__ import annotations

import json

import pytest

from lnk_proxy.hosted_models import (
    MAX_ISSUED_IDS,
    IssuedIds,
    judge_headers,
    judge_hosted,
    judge_route,
    upstream_head,
)
from lnk_proxy.http_request import RequestRefused

P = "lnk-secret-claude"
SECRET = b"sk-ant-api03-" + b"A" * 40
ISSUED = IssuedIds()
ISSUED.reader()(b'{"id":"resp_mine","object":"response"}')


@pytest.mark.parametrize(
    ("kind", "method", "target", "endpoint"),
    [
        ("anthropic", "POST", "/v1/messages", "messages"),
        ("anthropic", "POST", "/v1/messages?beta=true", "messages"),
        ("anthropic", "POST", "/v1/messages/count_tokens", "count_tokens"),
        ("anthropic", "GET", "/v1/models", ""),
        ("anthropic", "GET", "/v1/models?limit=20&after_id=m", ""),
        ("openai", "POST", "/v1/chat/completions", "chat"),
        ("openai", "POST", "/v1/responses", "responses"),
        ("openai", "POST", "/v1/embeddings", "embeddings"),
        ("openai", "GET", "/v1/models", ""),
        ("openai", "GET", "/v1/responses/resp_mine", ""),
        ("openai", "GET", "/v1/responses/resp_mine?stream=true&include[]=x", ""),
    ],
)
def test_the_inference_endpoints_are_allowed(
    kind: str, method: str, target: str, endpoint: str
) -> None:
    assert judge_route(kind, method, target, ISSUED) == (endpoint, target)


@pytest.mark.parametrize(
    ("kind", "method", "target", "rule"),
    [
        ("anthropic", "POST", "/v1/messages/batches", "model-route"),
        ("anthropic", "GET", "/v1/files", "model-route"),
        ("anthropic", "GET", "/v1/skills", "model-route"),
        ("anthropic", "GET", "/v1/organizations/api_keys", "model-route"),
        ("anthropic", "GET", "/v1/messages", "model-route"),
        ("anthropic", "POST", "/v1/complete", "model-route"),
        ("anthropic", "POST", "/v1/chat/completions", "model-route"),  # the other kind's
        ("openai", "POST", "/v1/messages", "model-route"),
        ("openai", "GET", "/v1/files", "model-route"),
        ("openai", "GET", "/v1/files/file-1/content", "model-route"),
        ("openai", "POST", "/v1/batches", "model-route"),
        ("openai", "GET", "/v1/vector_stores", "model-route"),
        ("openai", "POST", "/v1/assistants", "model-route"),
        ("openai", "POST", "/v1/threads/runs", "model-route"),
        ("openai", "POST", "/v1/containers", "model-route"),
        ("openai", "POST", "/v1/fine_tuning/jobs", "model-route"),
        ("openai", "GET", "/v1/organization/users", "model-route"),
        ("openai", "POST", "/v1/realtime/sessions", "model-route"),
        ("openai", "POST", "/v1/conversations", "model-route"),
        ("openai", "DELETE", "/v1/responses/resp_mine", "model-route"),
        ("openai", "POST", "/v1/responses/resp_mine/cancel", "model-route"),
        ("openai", "GET", "/v1/responses/resp_mine/input_items", "model-route"),
        ("openai", "GET", "/v1/responses/resp_other", "model-foreign-id"),
        ("openai", "GET", "/v1/chat/completions", "model-route"),  # stored completions
        ("openai", "POST", "/v1/chat/completions/", "model-path"),
        ("openai", "POST", "/v1//chat/completions", "model-path"),
        ("openai", "POST", "/v1/chat/../files", "model-path"),
        ("openai", "POST", "/v1/chat/./completions", "model-path"),
        ("openai", "POST", "/v1/chat%2fcompletions", "model-path"),
        ("openai", "POST", "/v1/chat/completions;x", "model-path"),
        ("openai", "POST", "/v1/chat/completions?x=1", "model-path"),
        ("anthropic", "POST", "/v1/messages?beta=true&x=1", "model-path"),
        ("anthropic", "GET", "/v1/models?a=%2e", "model-path"),
        ("openai", "POST", "v1/chat/completions", "model-path"),
    ],
)
def test_every_other_endpoint_or_spelling_is_refused(
    kind: str, method: str, target: str, rule: str
) -> None:
    with pytest.raises(RequestRefused) as caught:
        judge_route(kind, method, target, ISSUED)
    assert caught.value.rule == rule


@pytest.mark.parametrize(
    "header",
    [
        ("x-api-key", "sk-ant-api03-the-sandbox-own"),
        ("Authorization", "Bearer sk-the-sandbox-own"),
        ("Authorization", f"Basic {P}"),
        ("api-key", P),
        ("Cookie", "session=1"),
        ("Proxy-Authorization", "Basic eDp5"),
        ("OpenAI-Organization", "org-other"),
        ("OpenAI-Project", "proj-other"),
        ("anthropic-admin-api-key", "sk-ant-admin-1"),
    ],
)
def test_a_credential_header_of_its_own_is_refused(header: tuple[str, str]) -> None:
    with pytest.raises(RequestRefused) as caught:
        judge_headers("anthropic", P, (header,))
    assert caught.value.rule == "model-own-key"


def test_the_placeholder_is_dropped_and_the_rules_key_set_in_its_one_header() -> None:
    for kind, header, expected in (
        ("anthropic", ("X-Api-Key", P), b"x-api-key: " + SECRET),
        ("openai", ("Authorization", f"Bearer {P}"), b"Authorization: Bearer " + SECRET),
    ):
        body = json.dumps({"model": "m", "messages": []}).encode()
        target = "/v1/messages" if kind == "anthropic" else "/v1/chat/completions"
        headers = (header, ("Accept-Encoding", "gzip"), ("X-Stainless-Lang", "python"))
        forward = judge_hosted(
            kind,
            P,
            {"m"}.__contains__,
            method="POST",
            target=target,
            headers=headers,
            untrusted_body=body,
            issued=ISSUED,
        )
        head = upstream_head(forward, f"api.{kind}.com", SECRET)
        lines = head.split(b"\r\n")
        assert lines[0] == f"POST {target} HTTP/1.1".encode()
        assert lines[1] == f"Host: api.{kind}.com".encode()
        assert head.count(SECRET) == 1 and expected in lines
        assert P.encode() not in head
        assert b"Accept-Encoding: identity" in lines and b"gzip" not in head
        assert f"Content-Length: {len(forward.body)}".encode() in lines
        assert b"X-Stainless-Lang: python" in lines


def test_anthropic_betas_are_kept_from_the_allowlist_only() -> None:
    value = "prompt-caching-2024-07-31, mcp-client-2025-11-20,code-execution-2025-08-25,new-x"
    kept, dropped = judge_headers("anthropic", P, (("anthropic-beta", value),))
    assert kept == (("anthropic-beta", "prompt-caching-2024-07-31"),)
    assert len(dropped) == 3 and all(d.startswith("dropped anthropic-beta") for d in dropped)
    kept, _ = judge_headers("anthropic", P, (("anthropic-beta", "files-api-2025-04-14"),))
    assert kept == ()


def test_an_encoded_body_is_refused() -> None:
    with pytest.raises(RequestRefused) as caught:
        judge_headers("openai", P, (("Content-Encoding", "gzip"),))
    assert caught.value.rule == "model-body"


def test_the_body_sent_is_the_proxys_own_with_server_tools_removed() -> None:
    sent = (
        b'{"model":"m", "input":"hi", "tools":[{"type":"function","name":"f"},'
        b'{"type":"web_search"}], "stream": true}'
    )
    forward = judge_hosted(
        "openai",
        P,
        {"m"}.__contains__,
        method="POST",
        target="/v1/responses",
        headers=(),
        untrusted_body=sent,
        issued=ISSUED,
    )
    assert json.loads(forward.body) == {
        "model": "m",
        "input": "hi",
        "tools": [{"type": "function", "name": "f"}],
        "stream": True,
    }
    assert forward.removed == ("removed tool 'web_search'",)


def test_a_get_with_a_body_is_refused() -> None:
    with pytest.raises(RequestRefused):
        judge_hosted(
            "openai",
            P,
            bool,
            method="GET",
            target="/v1/models",
            headers=(),
            untrusted_body=b"{}",
            issued=ISSUED,
        )


def test_response_ids_are_learnt_across_chunks_and_bounded() -> None:
    issued = IssuedIds()
    event = b'data: {"type":"response.created","response":{"id":"resp_abc123","x":1}}\n\n'
    feed = issued.reader()
    for i in range(0, len(event), 7):
        feed(event[i : i + 7])
    assert "resp_abc123" in issued
    # Inside a string the quotes are escaped: the model's text cannot teach an id.
    issued.reader()(b'{"text":"\\"id\\":\\"resp_forged\\""}')
    assert "resp_forged" not in issued
    # Two answers at once: the end of one and the start of the other make no id.
    first, second = issued.reader(), issued.reader()
    first(b'{"id":"resp_')
    second(b'spliced"}')
    assert "resp_spliced" not in issued
    for n in range(MAX_ISSUED_IDS + 1):
        issued.reader()(b'{"id":"resp_%d"}' % n)
    assert "resp_0" not in issued and f"resp_{MAX_ISSUED_IDS}" in issued
