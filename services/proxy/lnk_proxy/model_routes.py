"""The proxy's route decisions for a local model rule (`[[models]]` of kind ollama, llamacpp,
vllm, openai-compatible): which method and path may reach the runtime, the head that goes
there, and a request head from the sandbox's loopback port read as the proxy's.

Pure: no I/O. The route tables come from the runtimes' own sources (SERVICES.md):
- Ollama (`server/routes.go`): the model listing, `show`, `ps`, `generate`, `chat`, `embed(dings)`
  and the OpenAI- and Anthropic-compatible `/v1/...` inference; never `pull`, `push`, `create`,
  `copy`, `delete`, `blobs`, the account (`me`, `signout`, `user/keys`) nor the
  `experimental/web_search` and `web_fetch` it would run for the sandbox.
- llama.cpp's server (`tools/server/server.cpp`): completion, chat, infill, embeddings, rerank,
  tokenize, its listing and `GET /props`; never `POST /props`, `/slots` (other clients' prompts,
  saved to disk), `/lora-adapters`, `/metrics`, model load and unload, `/cors-proxy`, `/tools`.
- vLLM (`docs/usage/security.md`): `/v1` inference, tokenize, score, rerank, pooling, classify,
  its listing and health; never its operational routes (`/pause`, `/sleep`, `/wake_up`,
  `/collective_rpc`, `/update_weights`, LoRA loading, profiling, cache resets, `/metrics`).
- openai-compatible: the OpenAI inference routes only (chat, completions, embeddings, models).
A route not in its kind's table is refused the same way (`model-admin`): the table is an
allowlist, so a route a runtime adds later is closed until it is read and listed here.

A path is judged as written: no percent-escape, dot segment, empty segment, `;`, trailing `/`
(but `/` itself) and no query (no listed route takes one), so nothing decodes elsewhere. The
head sent upstream is rebuilt from what was judged: the method, the judged path, `Host` the
runtime's (Ollama's own host check wants `127.0.0.1:PORT` on this machine), the client's
headers minus hop-by-hop, framing, `Content-Encoding`, method- and path-override headers
(`X-HTTP-Method-Override`, `X-Original-URL`, ...) and every credential header (dropped: a local
runtime takes the rule's key or none), `Content-Length` of the re-serialised body, the rule's key as
`Authorization: Bearer` when it names one, `Connection: close`.

Security limitations: this does NOT look at bodies (`model_bodies` does) nor answers (a
listing, `/api/tags`, `/v1/models`, is cut to the rule's models by `model_listings`), nor limit
what an allowed route costs the runtime (a long generation, a model kept loaded).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from lnk_proxy.http_request import Headers, RequestRefused
from lnk_proxy.services import CREDENTIAL_HEADERS
from lnk_shared.spec_models import ModelRule

__all__ = [
    "ADMIN_EXAMPLES",
    "ModelRoute",
    "judge_model_route",
    "model_upstream_head",
    "origin_form_as_proxy_head",
]

# What a route's body holds: "json" (judged and re-serialised by model_bodies) or "none";
# "unjudged" only for a route let through by the unsafe test switch (forwarded as it came).
Body = Literal["json", "none", "unjudged"]
# Where the model a request asks for is named: its JSON body ("body", required; "optional":
# llama.cpp's native routes, which a single-model server answers without one), its path
# ("path": /v1/models/{model}) or nowhere (a listing, a health check).
ModelIn = Literal["body", "optional", "path", "none"]


@dataclass(frozen=True)
class ModelRoute:
    """A judged route: what goes upstream, and what its body must be."""

    method: str
    path: str
    body: Body
    model_in: ModelIn
    shape: str  # the body's shape for model_bodies: "ollama", "openai", "anthropic", "none"


_GET = ("GET", "HEAD")
# (methods, path, body, model_in, shape); `{model}` stands for one path segment
_Row = tuple[tuple[str, ...], str, Body, ModelIn, str]
_OPENAI_INFERENCE: tuple[_Row, ...] = (
    (("POST",), "/v1/chat/completions", "json", "body", "openai"),
    (("POST",), "/v1/completions", "json", "body", "openai"),
    (("POST",), "/v1/embeddings", "json", "body", "openai"),
    (_GET, "/v1/models", "none", "none", "none"),
    (_GET, "/v1/models/{model}", "none", "path", "none"),
)
ROUTES: dict[str, tuple[_Row, ...]] = {
    "ollama": (
        (_GET, "/", "none", "none", "none"),
        (_GET, "/api/version", "none", "none", "none"),
        (_GET, "/api/tags", "none", "none", "none"),
        (_GET, "/api/ps", "none", "none", "none"),
        (("POST",), "/api/show", "json", "body", "ollama"),
        (("POST",), "/api/generate", "json", "body", "ollama"),
        (("POST",), "/api/chat", "json", "body", "ollama"),
        (("POST",), "/api/embed", "json", "body", "ollama"),
        (("POST",), "/api/embeddings", "json", "body", "ollama"),
        *_OPENAI_INFERENCE,
        (("POST",), "/v1/responses", "json", "body", "openai"),
        (("POST",), "/v1/messages", "json", "body", "anthropic"),
    ),
    "llamacpp": (
        (_GET, "/health", "none", "none", "none"),
        (_GET, "/v1/health", "none", "none", "none"),
        (_GET, "/models", "none", "none", "none"),
        (_GET, "/props", "none", "none", "none"),
        (("POST",), "/completion", "json", "optional", "openai"),
        (("POST",), "/completions", "json", "optional", "openai"),
        (("POST",), "/infill", "json", "optional", "openai"),
        (("POST",), "/chat/completions", "json", "optional", "openai"),
        (("POST",), "/embedding", "json", "optional", "openai"),
        (("POST",), "/embeddings", "json", "optional", "openai"),
        (("POST",), "/rerank", "json", "optional", "openai"),
        (("POST",), "/reranking", "json", "optional", "openai"),
        (("POST",), "/v1/rerank", "json", "optional", "openai"),
        (("POST",), "/tokenize", "json", "optional", "openai"),
        (("POST",), "/detokenize", "json", "optional", "openai"),
        (("POST",), "/apply-template", "json", "optional", "openai"),
        (("POST",), "/v1/messages", "json", "optional", "anthropic"),
        (("POST",), "/v1/chat/completions", "json", "optional", "openai"),
        (("POST",), "/v1/completions", "json", "optional", "openai"),
        (("POST",), "/v1/embeddings", "json", "optional", "openai"),
        (_GET, "/v1/models", "none", "none", "none"),
    ),
    "vllm": (
        (_GET, "/health", "none", "none", "none"),
        (_GET, "/version", "none", "none", "none"),
        *_OPENAI_INFERENCE,
        (("POST",), "/v1/responses", "json", "body", "openai"),
        (("POST",), "/tokenize", "json", "body", "openai"),
        (("POST",), "/detokenize", "json", "body", "openai"),
        (("POST",), "/pooling", "json", "body", "openai"),
        (("POST",), "/classify", "json", "body", "openai"),
        (("POST",), "/score", "json", "body", "openai"),
        (("POST",), "/v1/score", "json", "body", "openai"),
        (("POST",), "/rerank", "json", "body", "openai"),
        (("POST",), "/v1/rerank", "json", "body", "openai"),
        (("POST",), "/v2/rerank", "json", "body", "openai"),
    ),
    "openai-compatible": _OPENAI_INFERENCE,
}
# Routes each table refuses on purpose, for the tests and `lnk sandbox check` (anything not
# listed above is refused the same way; these are the ones that matter most).
ADMIN_EXAMPLES: dict[str, tuple[tuple[str, str], ...]] = {
    "ollama": (
        ("POST", "/api/pull"),
        ("POST", "/api/push"),
        ("POST", "/api/create"),
        ("POST", "/api/copy"),
        ("DELETE", "/api/delete"),
        ("HEAD", "/api/blobs/sha256:0"),
        ("POST", "/api/blobs/sha256:0"),
        ("POST", "/api/me"),
        ("POST", "/api/signout"),
        ("GET", "/api/user/keys"),
        ("POST", "/api/experimental/web_search"),
        ("POST", "/api/experimental/web_fetch"),
        ("GET", "/debug/pprof"),
    ),
    "llamacpp": (
        ("POST", "/props"),
        ("GET", "/slots"),
        ("POST", "/slots/0"),
        ("GET", "/lora-adapters"),
        ("POST", "/lora-adapters"),
        ("GET", "/metrics"),
        ("POST", "/models/load"),
        ("POST", "/models/unload"),
        ("GET", "/cors-proxy"),
        ("POST", "/tools"),
    ),
    "vllm": (
        ("POST", "/pause"),
        ("POST", "/sleep"),
        ("POST", "/wake_up"),
        ("POST", "/collective_rpc"),
        ("POST", "/update_weights"),
        ("POST", "/v1/load_lora_adapter"),
        ("POST", "/v1/unload_lora_adapter"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/start_profile"),
        ("GET", "/metrics"),
    ),
    "openai-compatible": (
        ("GET", "/v1/files"),
        ("POST", "/v1/fine_tuning/jobs"),
        ("POST", "/v1/batches"),
        ("POST", "/v1/audio/speech"),
    ),
}
_PLAIN_SEGMENT = re.compile(r"[A-Za-z0-9_~!$&'()*+,=:@.-]+")
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "host"}
    | {"content-length", "proxy-connection", "expect"}
    # the body sent is the proxy's own serialisation, never an encoding of the client's
    | {"content-encoding"}
    # headers some servers read as another method or path than the one judged
    | {"x-http-method-override", "x-http-method", "x-method-override"}
    | {"x-original-url", "x-rewrite-url", "x-forwarded-prefix"}
)


def judge_model_route(
    rule: ModelRule, method: str, target: str, *, check_route: bool = True
) -> ModelRoute:
    """The route for `method target` (origin-form) under `rule`, or RequestRefused naming why.
    `check_route=False` (the proxy's `unsafe_skip_model_route_check`, tests only) lets a
    route outside the table through, so `lnk sandbox check` can show that class leak."""
    table = ROUTES.get(rule.kind)
    if table is None:
        raise RequestRefused("model-kind", f"the {rule.kind} rule is not served by this proxy")
    path, question, _ = target.partition("?")
    if question:
        raise RequestRefused("model-path", "a query: no model route takes one")
    if path != "/":
        if "%" in path or not path.startswith("/") or path.endswith("/"):
            raise RequestRefused("model-path", "a percent-escape, or no or a trailing '/'")
        segments = path[1:].split("/")
        if any(s in ("", ".", "..") or not _PLAIN_SEGMENT.fullmatch(s) for s in segments):
            raise RequestRefused("model-path", "an empty or dot segment, or an odd character")
    for methods, pattern, body, model_in, shape in table:
        if method in methods and _matches(pattern, path):
            return ModelRoute(method, path, body, model_in, shape)
    if not check_route:  # unsafe, tests only: forwarded with its body unjudged
        return ModelRoute(method, path, "unjudged", "none", "none")
    raise RequestRefused(
        "model-admin",
        f"{method} {path} is not one of {rule.kind}'s inference routes (its admin API, or a "
        "route not listed)",
    )


def _matches(pattern: str, path: str) -> bool:
    if "{model}" not in pattern:
        return pattern == path
    before = pattern.split("{model}", maxsplit=1)[0]
    return path.startswith(before) and "/" not in path[len(before) :] and len(path) > len(before)


def model_upstream_head(
    rule: ModelRule,
    route: ModelRoute,
    headers: Headers,
    *,
    version: str,
    body_length: int | None,
    secret: bytes | None,
) -> bytes:
    """The head for the runtime: rebuilt from what was judged (see the module's docstring)."""
    host = f"[{rule.host}]" if ":" in rule.host else rule.host
    lines = [f"{route.method} {route.path} {version}", f"Host: {host}:{rule.upstream_port}"]
    for name, value in headers:
        lower = name.lower()
        if lower in CREDENTIAL_HEADERS or lower in _HOP_BY_HOP or lower.startswith("proxy-"):
            continue
        lines.append(f"{name}: {value}")
    if body_length is not None:
        lines.append(f"Content-Length: {body_length}")
    if secret is not None:
        lines.append(f"Authorization: Bearer {secret.decode('ascii')}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def origin_form_as_proxy_head(untrusted_head: bytes, port: int) -> bytes:
    """A head the sandbox sent to a model's loopback port (`GET /api/tags HTTP/1.1`, any Host)
    as the proxy's parser reads one: the target made `http://127.0.0.1:PORT/...` and every
    `Host` line replaced by that authority (the runtime's own is set upstream). RequestRefused
    for a target that is not origin-form."""
    first, sep, rest = untrusted_head.partition(b"\r\n")
    parts = first.split(b" ")
    if not sep or len(parts) != 3 or not parts[1].startswith(b"/"):
        raise RequestRefused("model-path", "not an origin-form request (METHOD /path HTTP/1.x)")
    authority = b"127.0.0.1:%d" % port
    lines = [line for line in rest.split(b"\r\n") if not line.lower().startswith(b"host:")]
    request_line = b"%s http://%s%s %s" % (parts[0], authority, parts[1], parts[2])
    return b"\r\n".join([request_line, b"Host: " + authority, *lines])
