"""A model provider's API, just enough of it for a real harness to answer one prompt: run by the
harness tests inside a test-internet namespace (`ip netns exec NS python -I model_api_server.py
ADDRESS PORT LOG [CERT KEY]`), never imported by a test.

HTTP/1.1 with keep-alive, over TLS with CERT and KEY when given (the provider's names, signed by
the test CA), as the hosted-model rule's proxy reaches a provider. Every request is recorded as
a JSON line in LOG (method, path and query, the credential and `anthropic-beta` headers as they
arrived, the model asked for, whether it streamed, the tools' types): the upstream's own record
of what reached it. Answers, always with the text `ANSWER`:
- Anthropic's Messages API: `POST /v1/messages` (SSE when `"stream": true`, as Claude Code asks;
  a prompt with a line `PROBE: COMMAND` is answered with a call of the `Bash` tool
  running COMMAND, and the text of the tool results that come back is recorded: what an
  injected prompt would have the agent send out),
  `POST /v1/messages/count_tokens`;
- OpenAI's Responses API: `POST /v1/responses` (SSE, as Codex CLI asks), and
  `POST /v1/chat/completions` (plain JSON);
- `GET /v1/models`: an empty list; anything else: 404.

Like Anthropic's API, a Messages body that uses a field of a beta its `anthropic-beta` header
does not name is answered 400 `... Extra inputs are not permitted` (`BETA_FIELDS`): a proxy
that drops a beta the harness's body needs fails here as it would against the real API.

Prints `ready` once bound; dies with the process that started it (`PR_SET_PDEATHSIG`).
Security limitations: none needed; it only ever listens inside a namespace the tests made.
"""

from __future__ import annotations

import ctypes
import json
import signal
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANSWER = "lnk-harness-answer-7f3c"
PROBE = "PROBE: "  # a prompt's line so marked: the "model" asks the harness to run the rest
PR_SET_PDEATHSIG = 1
BODY_LIMIT = 16 * 1024 * 1024  # a harness's first prompt, system prompt and tools included
# A Messages field -> the beta it needs (what Anthropic's API refuses without it).
BETA_FIELDS = {
    "context_management": "context-management-2025-06-27",
    "output_config": "effort-2025-11-24",
    "tools.defer_loading": "advanced-tool-use-2025-11-20",
    "tools.input_examples": "advanced-tool-use-2025-11-20",
}
CREDENTIALS = ("authorization", "x-api-key", "api-key", "openai-organization", "openai-project")


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _anthropic_events(model: str, command: str | None = None) -> list[bytes]:
    """The streamed answer: the text ANSWER, or (`command` given) a call of the harness's
    `Bash` tool running it."""
    message = {
        "id": "msg_lnk1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }
    if command is None:
        block: dict[str, Any] = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": ANSWER}
    else:
        block = {"type": "tool_use", "id": "toolu_lnk1", "name": "Bash", "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps({"command": command})}
    stop = "end_turn" if command is None else "tool_use"
    return [
        _sse("message_start", {"type": "message_start", "message": message}),
        _sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
        _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 3},
            },
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]


def _conversation(body: dict[str, Any]) -> tuple[str, list[str]]:
    """(the text of the conversation's messages, the text of its tool results)."""
    texts, results = [], []
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for item in blocks if isinstance(blocks, list) else ():
            if not isinstance(item, dict):
                continue
            if item.get("type") == "text":
                texts.append(str(item.get("text", "")))
            elif item.get("type") == "tool_result":
                inner = item.get("content")
                parts = inner if isinstance(inner, list) else [{"text": inner}]
                results += [str(p.get("text", "")) for p in parts if isinstance(p, dict)]
    return "\n".join(texts), results


def _anthropic_message(model: str) -> dict[str, Any]:
    return {
        "id": "msg_lnk1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": ANSWER}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 3},
    }


def _openai_response_events(model: str) -> list[bytes]:
    item = {
        "type": "message",
        "id": "msg_lnk1",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": ANSWER, "annotations": []}],
    }
    usage = {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 8,
    }
    done = {
        "id": "resp_lnk1",
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": model,
        "output": [item],
        "usage": usage,
    }
    started = {**done, "status": "in_progress", "output": []}
    return [
        _sse("response.created", {"type": "response.created", "response": started}),
        _sse(
            "response.output_item.added",
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "status": "in_progress", "content": []},
            },
        ),
        _sse(
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "item_id": "msg_lnk1",
                "output_index": 0,
                "content_index": 0,
                "delta": ANSWER,
            },
        ),
        _sse(
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": 0, "item": item},
        ),
        _sse("response.completed", {"type": "response.completed", "response": done}),
    ]


def _chat_completion(model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-lnk1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": ANSWER},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }


def _tool_type(tool: object) -> str:
    """A tool's `type` ("custom" for Anthropic's untyped client tool), as the record shows it."""
    shape = tool.get("type") if isinstance(tool, dict) else None
    return shape if isinstance(shape, str) else "custom"


def beta_problem(beta: str | None, body: dict[str, Any]) -> str | None:
    """The API's 400 text for the first field of `body` whose beta `beta` does not name."""
    named = {b.strip() for b in (beta or "").split(",")}
    used = [(k, k) for k in body if k in BETA_FIELDS]
    for index, tool in enumerate(body.get("tools") or ()):
        keys = [k for k in tool if f"tools.{k}" in BETA_FIELDS] if isinstance(tool, dict) else []
        used += [(f"tools.{k}", f"tools.{index}.custom.{k}") for k in keys]
    for field, shown in used:
        if BETA_FIELDS[field] not in named:
            return f"{shown}: Extra inputs are not permitted"
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log_path = ""

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the record in LOG is what the tests read."""

    def _record(
        self, body: dict[str, Any], refused: str | None = None, results: list[str] | None = None
    ) -> None:
        line = {
            "method": self.command,
            "path": self.path,
            "credentials": {k: self.headers[k] for k in CREDENTIALS if k in self.headers},
            "beta": self.headers.get("anthropic-beta"),
            "model": body.get("model"),
            "stream": bool(body.get("stream")),
            "tools": [_tool_type(t) for t in body.get("tools") or ()],
            "refused": refused,
            "tool_results": results or [],
        }
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps(line) + "\n")

    def _json(self, status: int, data: dict[str, Any]) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _stream(self, events: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for event in events:
            self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def do_GET(self) -> None:
        self._record({})
        if self.path.split("?")[0] == "/v1/models":
            self._json(200, {"object": "list", "data": []})
        else:
            self._json(404, {"error": {"type": "not_found", "message": self.path}})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length > BODY_LIMIT:
            self._json(413, {"error": {"type": "too_large"}})
            return
        raw = self.rfile.read(length)
        try:
            body: dict[str, Any] = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        model = str(body.get("model") or "test-model")
        path = self.path.split("?")[0]
        problem = beta_problem(self.headers["anthropic-beta"], body) if "messages" in path else None
        text, results = _conversation(body)
        self._record(body, problem, results)
        # A prompt with a line `PROBE: COMMAND` is answered with a call of Bash running it.
        probes = [line[len(PROBE) :] for line in text.splitlines() if line.startswith(PROBE)]
        command = probes[0] if probes and not results else None
        if path == "/v1/messages/count_tokens":
            self._json(200, {"input_tokens": 10})
        elif problem:
            self._json(
                400,
                {"type": "error", "error": {"type": "invalid_request_error", "message": problem}},
            )
        elif path == "/v1/messages":
            if body.get("stream"):
                self._stream(_anthropic_events(model, command))
            else:
                self._json(200, _anthropic_message(model))
        elif path == "/v1/responses":
            self._stream(_openai_response_events(model))
        elif path == "/v1/chat/completions":
            self._json(200, _chat_completion(model))
        else:
            self._json(404, {"error": {"type": "not_found", "message": path}})


def main() -> None:
    address, port, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    Handler.log_path = log
    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    if len(sys.argv) > 5:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(sys.argv[4], sys.argv[5])
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
