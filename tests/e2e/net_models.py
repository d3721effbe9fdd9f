"""The test internet's hosted model APIs: an Anthropic-like and an OpenAI-like API, answered by
`net_server.py` for every `/v1/...` request (loaded by path: the server runs with `python -I`).

Records every request that reaches it as a JSON line in `<log>.models` (method, path, the
credential and beta headers, the parsed body): the upstream's own record of what arrived, so a
test can show that a refused request never got here and what an allowed one carried.

Answers (the shapes the `anthropic` and `openai` SDKs parse):
- Anthropic `POST /v1/messages` (SSE when `"stream": true`), `/v1/messages/count_tokens`,
  `GET /v1/models` (by Host `api.anthropic.com`);
- OpenAI `POST /v1/chat/completions` (SSE with `"stream": true`), `/v1/responses` (SSE too;
  each response kept, so `GET /v1/responses/{id}` answers it), `/v1/embeddings`, `GET /v1/models`;
- any other `/v1/...`: 200 `{"reached": PATH}` (a leak is seen, never answered 404).
The reply's text is `key=<the key it got> tools=<tool types> model=<model>`, so a test sees
which key arrived (scrubbed on the way back) and which tools were left.

A streamed answer sends its first event, then waits until the file `<dir>/release-<TEXT>`
exists when the last user text is `hold:<TEXT>` (a test shows the first byte was not held back),
and sends the rest. When the last user text is `stamp`, the first event carries `"sent_ns"`,
this machine's CLOCK_MONOTONIC as it is written (`stamped`: bench/proxy_hosted_path.py times
the first byte's way from the upstream to the client by it).

Security limitations: none needed; it only ever listens inside a namespace the tests made.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from typing import Any

RELEASE_POLL_S = 0.01  # a streamed answer waiting on its test's release file
RELEASE_WAIT_S = 60.0  # then it goes on anyway (the test has failed by then)
_RESPONSES: dict[str, dict[str, Any]] = {}


def _key(headers: dict[str, str]) -> str:
    if "x-api-key" in headers:
        return headers["x-api-key"]
    return headers.get("authorization", "").removeprefix("Bearer ")


def _last_text(body: dict[str, Any]) -> str:
    for where in ("messages", "input"):
        value = body.get(where)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value:
            content = value[-1].get("content") if isinstance(value[-1], dict) else None
            if isinstance(content, str):
                return content
            if isinstance(content, list) and content and isinstance(content[-1], dict):
                return str(content[-1].get("text", ""))
    return ""


def record(log_path: str, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
    try:
        parsed: Any = json.loads(body) if body else None
    except ValueError:
        parsed = body.decode("latin-1")
    line = {
        "method": method,
        "path": path,
        "host": headers.get("host"),
        "x-api-key": headers.get("x-api-key"),
        "authorization": headers.get("authorization"),
        "anthropic-beta": headers.get("anthropic-beta"),
        "body": parsed,
    }
    with open(log_path + ".models", "a", encoding="utf-8") as log:
        log.write(json.dumps(line) + "\n")


def _text(body: dict[str, Any], headers: dict[str, str]) -> str:
    tools = [t.get("type", "custom") for t in body.get("tools", []) if isinstance(t, dict)]
    return f"key={_key(headers)} tools={','.join(tools)} model={body.get('model')}"


def _sse(name: str | None, data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {text}\n\n".encode()


def _anthropic_message(body: dict[str, Any], text: str) -> dict[str, Any]:
    return {
        "id": "msg_" + secrets.token_hex(8),
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


def _anthropic_events(body: dict[str, Any], text: str) -> list[bytes]:
    start = _anthropic_message(body, "")
    start["content"], start["stop_reason"] = [], None
    block = {"type": "text", "text": ""}
    return [
        _sse("message_start", {"type": "message_start", "message": start}),
        _sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
        _sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            },
        ),
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 1},
            },
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]


def _chat(body: dict[str, Any], text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-" + secrets.token_hex(6),
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model"),
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _chat_events(body: dict[str, Any], text: str) -> list[bytes]:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0}
    base["model"] = body.get("model")
    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    then = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    last = {"index": 0, "delta": {}, "finish_reason": "stop"}
    return [_sse(None, {**base, "choices": [c]}) for c in (first, then, last)] + [
        _sse(None, "[DONE]")
    ]


def _response(body: dict[str, Any], text: str) -> dict[str, Any]:
    ident = "resp_" + secrets.token_hex(12)
    answer = {
        "id": ident,
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": body.get("model"),
        "output": [
            {
                "type": "message",
                "id": "msg_" + secrets.token_hex(6),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "previous_response_id": body.get("previous_response_id"),
    }
    _RESPONSES[ident] = answer
    return answer


def _response_events(answer: dict[str, Any]) -> list[bytes]:
    started = {**answer, "status": "in_progress", "output": []}
    text = answer["output"][0]["content"][0]["text"]
    return [
        _sse(
            "response.created",
            {"type": "response.created", "sequence_number": 0, "response": started},
        ),
        _sse(
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "sequence_number": 1,
                "item_id": answer["output"][0]["id"],
                "output_index": 0,
                "content_index": 0,
                "delta": text,
                "logprobs": [],
            },
        ),
        _sse(
            "response.completed",
            {"type": "response.completed", "sequence_number": 2, "response": answer},
        ),
    ]


def answer(
    method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, Any] | None, list[bytes] | None]:
    """(status, a JSON answer or None, SSE events or None) for one `/v1/...` request."""
    try:
        parsed: dict[str, Any] = json.loads(body) if body else {}
    except ValueError:
        return 400, {"error": "not json"}, None
    stream = parsed.get("stream") is True
    text = _text(parsed, headers)
    route = path.partition("?")[0]
    anthropic = headers.get("host", "").startswith("api.anthropic.com")
    if method == "POST" and route == "/v1/messages":
        if stream:
            return 200, None, _anthropic_events(parsed, text)
        return 200, _anthropic_message(parsed, text), None
    if method == "POST" and route == "/v1/messages/count_tokens":
        return 200, {"input_tokens": 7}, None
    if method == "GET" and route == "/v1/models":
        if anthropic:
            model = {"type": "model", "id": "claude-x", "display_name": "X"}
            model["created_at"] = "2025-01-01T00:00:00Z"
            return 200, {"data": [model], "has_more": False, "first_id": "claude-x"}, None
        return 200, {"object": "list", "data": [{"id": "gpt-x", "object": "model"}]}, None
    if method == "POST" and route == "/v1/chat/completions":
        if stream:
            return 200, None, _chat_events(parsed, text)
        return 200, _chat(parsed, text), None
    if method == "POST" and route == "/v1/responses":
        made = _response(parsed, text)
        return (200, None, _response_events(made)) if stream else (200, made, None)
    if method == "GET" and route.startswith("/v1/responses/"):
        stored = _RESPONSES.get(route.rsplit("/", 1)[1])
        return (200, stored, None) if stored else (404, {"error": "no such response"}, None)
    if method == "POST" and route == "/v1/embeddings":
        item = {"object": "embedding", "index": 0, "embedding": [0.5, 0.25]}
        usage = {"prompt_tokens": 1, "total_tokens": 1}
        return (
            200,
            {"object": "list", "data": [item], "model": parsed.get("model"), "usage": usage},
            None,
        )
    return 200, {"reached": path}, None


def stamped(body: bytes, event: bytes) -> bytes:
    """The first event, with the time it is written when the request asks (see above)."""
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        return event
    if not isinstance(parsed, dict) or _last_text(parsed) != "stamp":
        return event
    return event.replace(b"data: {", b'data: {"sent_ns": %d, ' % time.monotonic_ns(), 1)


async def held(directory: str, body: bytes) -> None:
    """Wait for the test's release file when the request asks to be held (see above)."""
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        return
    text = _last_text(parsed) if isinstance(parsed, dict) else ""
    if not text.startswith("hold:"):
        return
    release = os.path.join(directory, "release-" + text[5:].strip())
    waited = 0.0
    while not os.path.exists(release) and waited < RELEASE_WAIT_S:
        await asyncio.sleep(RELEASE_POLL_S)
        waited += RELEASE_POLL_S
