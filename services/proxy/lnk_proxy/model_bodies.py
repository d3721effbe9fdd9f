"""The proxy's body decisions for a local model rule: the JSON a request carries, parsed
strictly, judged, and re-serialised, so the runtime reads exactly what was judged.

Pure: bytes in, bytes out (or RequestRefused naming the rule). "Inference only" needs more than
a route table (SERVICES.md), so a body is refused when
- it is not one strict JSON object: not UTF-8, `NaN`/`Infinity`, a duplicate key (which one a
  runtime keeps is its parser's choice: judged once, never twice), a lone surrogate, deeper than
  `MAX_JSON_DEPTH`, larger than `MAX_MODEL_BODY_BYTES`, more than `strict_json.MAX_VALUES`
  values (counted before any parse, as for the hosted rules: `refuse_many_values`)
  (`model-body`);
- the model it asks for is not in the rule's allowlist (an Ollama cloud model only when named
  exactly: `ModelRule.allows_model`), or a route that names one has none (`model-not-allowed`);
- a field anywhere in it named `url` or ending in `_url` holds anything but a `data:` URL, or a
  content block points at a file the runtime would open (`source.type` `url` or `file`,
  `file_id`): the runtime would fetch it for the sandbox, from wherever it reaches
  (`model-url`); vLLM and llama.cpp fetch `image_url`/`video_url`/`audio_url` themselves;
- it lists a tool that is not the client's own (`type` absent, `function` or `custom`): a
  server-side tool runs where the runtime is (`model-tool`);
- it carries a field a runtime would execute or load: a request-supplied prompt template
  (Ollama `template`, vLLM/llama.cpp `chat_template`), vLLM `logits_processors` (a class
  named by the request), `mcp_servers`, `web_search_options`, `container` (`model-field`).
The forwarded body is `json.dumps` of the parsed value (compact, UTF-8): no comment, escape or
whitespace trick of the client's bytes reaches the runtime.

Security limitations: this does NOT judge what a prompt says or what an allowed model answers
(a model may be talked into anything its runtime lets it do), nor stop a large request from
costing the runtime time and memory (`keep_alive`, `num_ctx`, long outputs), nor look at
answers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from lnk_proxy.http_request import RequestRefused
from lnk_proxy.model_routes import ModelRoute
from lnk_proxy.strict_json import refuse_many_values
from lnk_shared.spec_models import ModelRule

__all__ = ["MAX_JSON_DEPTH", "MAX_MODEL_BODY_BYTES", "judge_model_body", "parse_strict_json"]

# A chat with a few base64 images, far above any text prompt; held in the proxy's memory while
# judged, so bounded per request.
MAX_MODEL_BODY_BYTES = 32 * 1024 * 1024
MAX_JSON_DEPTH = 64  # requests nest a few levels (messages, content parts, tool schemas)
CLIENT_TOOL_TYPES = frozenset({"function", "custom"})
REFUSED_FIELDS = {
    "template": "a prompt template the runtime would run (Ollama's `template`)",
    "chat_template": "a chat template the runtime would run",
    "logits_processors": "a logits processor the runtime would load by name",
    "mcp_servers": "MCP servers the runtime would call",
    "web_search_options": "a web search the runtime would make",
    "container": "a container the runtime would run code in",
}


def parse_strict_json(untrusted: bytes, *, bounded: bool = True) -> Any:
    """The JSON value of `untrusted`, or RequestRefused("model-body") naming what is wrong.
    `bounded=False` (the proxy's `unsafe_unbounded_model_bodies`, tests only) skips the count
    of values and nesting before the parse, so `lnk sandbox check` can show that class leak."""
    if len(untrusted) > MAX_MODEL_BODY_BYTES:
        raise RequestRefused("model-body", f"a body over {MAX_MODEL_BODY_BYTES} bytes")
    if bounded:
        refuse_many_values(untrusted)
    try:
        text = untrusted.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestRefused("model-body", "a body that is not UTF-8") from None
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except RecursionError:
        raise RequestRefused("model-body", "JSON nested too deep") from None
    except ValueError as exc:  # a RequestRefused of the hooks passes through as it is
        raise RequestRefused("model-body", f"not JSON: {exc.args[0][:80]}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise RequestRefused("model-body", f"JSON nested deeper than {MAX_JSON_DEPTH}")
    return value


def judge_model_body(
    rule: ModelRule, route: ModelRoute, untrusted: bytes, *, bounded: bool = True
) -> bytes | None:
    """The body to forward for `route` (None: it has none), or RequestRefused naming why
    (`bounded`: see `parse_strict_json`)."""
    if route.body == "unjudged":  # a route the unsafe test switch let through: as it came
        return untrusted or None
    if route.body == "none":
        if untrusted:
            raise RequestRefused("model-body", f"a body on {route.method} {route.path}")
        if route.model_in == "path":
            _check_model(rule, route.path.rsplit("/", 1)[1])
        return None
    body = parse_strict_json(untrusted, bounded=bounded)
    if not isinstance(body, dict):
        raise RequestRefused("model-body", "the body is not a JSON object")
    names = [body[k] for k in ("model", "name") if k in body and route.shape == "ollama"]
    if route.shape != "ollama" and "model" in body:
        names = [body["model"]]
    if not names and route.model_in == "body":
        raise RequestRefused("model-not-allowed", "no model named: the rule allows named ones")
    for name in names:
        if not isinstance(name, str):
            raise RequestRefused("model-not-allowed", "the model is not a string")
        _check_model(rule, name)
    for field, why in REFUSED_FIELDS.items():
        if field in body:
            raise RequestRefused("model-field", f"{field}: {why}")
    _check_tools(body.get("tools"))
    for key, value in _walk(body):
        _check_fetch(key, value)
    try:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        raise RequestRefused("model-body", "a lone surrogate escape in a string") from None


def _check_model(rule: ModelRule, name: str) -> None:
    if not rule.allows_model(name):
        shown = name[:80].encode("ascii", "replace").decode("ascii")
        raise RequestRefused("model-not-allowed", f"{shown!r} is not in the rule's models")


def _check_tools(tools: object) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise RequestRefused("model-tool", "tools is not a list")
    for tool in tools:
        if not isinstance(tool, dict):
            raise RequestRefused("model-tool", "a tool that is not an object")
        kind = tool.get("type")
        if kind is not None and kind not in CLIENT_TOOL_TYPES:
            shown = str(kind)[:40]
            raise RequestRefused("model-tool", f"a server-side tool ({shown!r}): client tools only")


def _check_fetch(key: str, value: object) -> None:
    """A URL the runtime would fetch, or a file it would open, refuses the request."""
    lower = key.lower()
    is_url = lower == "url" or lower.endswith("_url")
    if is_url and isinstance(value, str) and not value.startswith("data:"):
        raise RequestRefused("model-url", f"{key}: a URL the runtime would fetch (data: only)")
    if lower in ("file_id", "file_path", "file_url"):
        raise RequestRefused("model-url", f"{key}: a file the runtime would open")
    if lower == "source" and isinstance(value, dict) and value.get("type") in ("url", "file"):
        raise RequestRefused("model-url", "a content source the runtime would fetch")


def _walk(value: object) -> Iterator[tuple[str, object]]:
    """Every (key, value) of every object in `value`, depth first."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                yield key, child
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)


def _depth(value: object) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_JSON_DEPTH:
                break
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise RequestRefused("model-body", f"the key {key[:40]!r} twice in one object")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise RequestRefused("model-body", f"{name} is not JSON")
