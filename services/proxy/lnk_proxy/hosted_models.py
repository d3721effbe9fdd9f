"""The proxy's decisions for a hosted model rule (`[[models]]` kinds `anthropic` and `openai`):
which requests go to the provider, the one head and body that go there with the owner's key,
and which responses this sandbox was given (so only those can be fetched again).

Pure: no I/O, no secret store, no sockets. The caller (`hosted_relay`) reads the request's body
whole (at most `strict_json.MAX_BODY_BYTES`), calls `judge_hosted`, fetches the secret for the
rule from the controller's grant (fail closed when it is gone), sends `upstream_head` and
`forward.body` over verified TLS to the provider, and streams the answer back through a
`services.SecretScrubber` and, for OpenAI, `IssuedIds.feed`.

- Endpoints (`ENDPOINTS`): Anthropic `POST /v1/messages`, `/v1/messages/count_tokens`,
  `GET /v1/models`; OpenAI `POST /v1/chat/completions`, `/v1/responses`, `/v1/embeddings`,
  `GET /v1/models`, and `GET /v1/responses/{id}` only for an id this sandbox itself received.
  Everything else (files, batches, vector stores, assistants, containers, fine-tuning, admin,
  realtime, skills...) is refused `model-route`: with the owner's key it reads the owner's data.
  The path is judged as written (no percent-escape, dot segment, `//` or trailing `/`); a query
  only where the SDKs send one (`?beta=true` on Anthropic's beta calls; a GET's listing or
  stream options), in a plain character set.
- Headers: every credential header (`services.CREDENTIAL_HEADERS`) is dropped and the rule's
  key set (`x-api-key` for Anthropic, `Authorization: Bearer` for OpenAI); one that holds
  anything but this rule's placeholder refuses the request (`model-own-key`): an account the
  sandbox controls at the provider would be a way out. `anthropic-beta` values are kept only
  from `ANTHROPIC_BETAS` (the rest dropped and named in the removals); `Accept-Encoding` is
  `identity` (the scrubber and `IssuedIds` read the answer's bytes); a `Content-Encoding` of the
  request refuses (the body must be read to be judged).
- The body is judged by `hosted_bodies.judge_body` and sent as the proxy's own serialisation
  (`strict_json.dumps`), with its own Content-Length; the conversation in it (`messages`,
  `system`, `input`, `instructions`) as the client's own bytes where the C pass proved it holds
  nothing judged (`strict_json.read(content_as_bytes=True)`; hosted_bodies' docstring).

Security limitations: this does NOT look at the answer beyond the secret and response ids, bound
what an allowed model call costs the owner, nor stop a prompt from carrying what the sandbox can
read to the provider. `IssuedIds` trusts the provider's answer: an id is learnt from the JSON
text `"id":"resp_..."`, which a string inside that JSON cannot spell (its quotes are escaped).
"""

from __future__ import annotations

import hmac
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from lnk_proxy import strict_json
from lnk_proxy.hosted_bodies import judge_body
from lnk_proxy.http_request import Headers, RequestRefused
from lnk_proxy.services import CREDENTIAL_HEADERS
from lnk_proxy.unsafe_naive_screen import naive_spans

__all__ = [
    "ANTHROPIC_BETAS",
    "ENDPOINTS",
    "MAX_ISSUED_IDS",
    "HostedForward",
    "IssuedIds",
    "judge_headers",
    "judge_hosted",
    "judge_route",
    "upstream_head",
]

# (kind, method, path) -> the endpoint's name, as hosted_bodies knows it ("" for no body).
ENDPOINTS = {
    ("anthropic", "POST", "/v1/messages"): "messages",
    ("anthropic", "POST", "/v1/messages/count_tokens"): "count_tokens",
    ("anthropic", "GET", "/v1/models"): "",
    ("openai", "POST", "/v1/chat/completions"): "chat",
    ("openai", "POST", "/v1/responses"): "responses",
    ("openai", "POST", "/v1/embeddings"): "embeddings",
    ("openai", "GET", "/v1/models"): "",
}
# `anthropic-beta` values that change how a model answers, never what the provider fetches or
# runs for it (mcp-client-*, code-execution-*, web-fetch-*, web-search-*, files-api-*, skills-*
# and every unknown one are dropped).
ANTHROPIC_BETAS = frozenset(
    {
        "prompt-caching-2024-07-31",
        "extended-cache-ttl-2025-04-11",
        "token-efficient-tools-2025-02-19",
        "fine-grained-tool-streaming-2025-05-14",
        "interleaved-thinking-2025-05-14",
        "output-128k-2025-02-19",
        "max-tokens-3-5-sonnet-2024-07-15",
        "context-1m-2025-08-07",
        "context-management-2025-06-27",
        "structured-outputs-2025-11-13",
        "effort-2025-11-24",
        "token-counting-2024-11-01",
        "pdfs-2024-09-25",
        "computer-use-2024-10-22",
        "computer-use-2025-01-24",
        "computer-use-2025-11-24",
        "model-context-window-exceeded-2025-08-26",
    }
)
# Responses ids one sandbox may fetch again: a long session's worth; the oldest are forgotten.
MAX_ISSUED_IDS = 4096
MAX_ID_CHARS = 128  # OpenAI's ids are ~50 characters
_RESPONSE_ID = re.compile(rf"resp_[A-Za-z0-9_-]{{1,{MAX_ID_CHARS}}}")
_ISSUED_TEXT = re.compile(rf'"id":\s*"(resp_[A-Za-z0-9_-]{{1,{MAX_ID_CHARS}}})"'.encode())
_ISSUED_TAIL = 16 + MAX_ID_CHARS  # bytes of a chunk kept to find an id cut across chunks
_PLAIN_SEGMENT = re.compile(r"[A-Za-z0-9_.~-]+")
_QUERY = re.compile(r"[A-Za-z0-9_.~=&\[\]-]{0,512}")
_DROPPED_HEADERS = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "host"}
    | {"content-length", "proxy-connection", "accept-encoding", "anthropic-beta"}
)


@dataclass(frozen=True)
class HostedForward:
    """A judged request: what goes to the provider (the key added by `upstream_head`)."""

    kind: str
    method: str
    path: str  # the judged path and query
    headers: Headers  # the client's, judged (no credential, framing or hop-by-hop)
    body: bytes  # the proxy's serialisation ("" for a GET)
    removed: tuple[str, ...]  # what was removed or dropped, for the wire's log


class IssuedIds:
    """The OpenAI response ids this sandbox was given, learnt from its answers' bytes (each
    answer read on its own by a `reader()`, so two answers at once never mix their bytes)."""

    def __init__(self) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, candidate: object) -> bool:
        return isinstance(candidate, str) and candidate in self._ids

    def learn(self, ident: str) -> None:
        self._ids[ident] = None
        self._ids.move_to_end(ident)
        while len(self._ids) > MAX_ISSUED_IDS:
            self._ids.popitem(last=False)

    def reader(self) -> Callable[[bytes], None]:
        """A feed for one answer's pieces, in order (an id cut across two is found)."""
        tail = b""

        def feed(chunk: bytes) -> None:
            nonlocal tail
            data = tail + chunk
            for found in _ISSUED_TEXT.finditer(data):
                self.learn(found.group(1).decode("ascii"))
            tail = data[-_ISSUED_TAIL:]

        return feed


def judge_route(kind: str, method: str, target: str, issued: IssuedIds) -> tuple[str, str]:
    """(the endpoint's name, the judged path and query); RequestRefused naming why not."""
    path, mark, query = target.partition("?")
    if "%" in path or not path.startswith("/") or path.endswith("/"):
        raise RequestRefused("model-path", "a percent-escape, or no or a trailing '/'")
    segments = path[1:].split("/")
    if any(s in ("", ".", "..") or not _PLAIN_SEGMENT.fullmatch(s) for s in segments):
        raise RequestRefused("model-path", "an empty or dot segment, or a character no path takes")
    if mark and not _QUERY.fullmatch(query):
        raise RequestRefused("model-path", "a query with a character no endpoint takes")
    endpoint = ENDPOINTS.get((kind, method, path))
    if endpoint is None and _is_response_fetch(kind, method, segments):
        if segments[2] not in issued:
            raise RequestRefused("model-foreign-id", "a response this sandbox was not given")
        endpoint = ""
    if endpoint is None:
        raise RequestRefused("model-route", f"{method} {path} is not an inference endpoint")
    if mark and method == "POST" and not (kind == "anthropic" and query == "beta=true"):
        raise RequestRefused("model-path", "a query on a POST endpoint")
    return endpoint, target if mark else path


def _is_response_fetch(kind: str, method: str, segments: list[str]) -> bool:
    """`GET /v1/responses/{id}` of OpenAI's (whether the id was issued is judged apart)."""
    return (
        kind == "openai"
        and method == "GET"
        and len(segments) == 3
        and segments[:2] == ["v1", "responses"]
        and _RESPONSE_ID.fullmatch(segments[2]) is not None
    )


def judge_headers(kind: str, placeholder: str, headers: Headers) -> tuple[Headers, tuple[str, ...]]:
    """(the client's headers to keep, the beta values dropped); RequestRefused for a credential
    of its own or an encoded body."""
    kept: list[tuple[str, str]] = []
    dropped: list[str] = []
    accepted = {placeholder, f"Bearer {placeholder}"}
    for name, value in headers:
        lower = name.lower()
        if lower in CREDENTIAL_HEADERS:
            if lower in ("x-api-key", "authorization") and any(
                hmac.compare_digest(value.strip().encode("latin-1"), a.encode()) for a in accepted
            ):
                continue  # the placeholder: replaced by the rule's key
            raise RequestRefused("model-own-key", f"a {lower} header of its own")
        if lower == "content-encoding" and value.strip().lower() != "identity":
            raise RequestRefused("model-body", "an encoded body: send it as plain JSON")
        if lower == "anthropic-beta" and kind == "anthropic":
            betas = [b.strip() for b in value.split(",") if b.strip()]
            good = [b for b in betas if b in ANTHROPIC_BETAS]
            dropped += [f"dropped anthropic-beta {b[:64]!r}" for b in betas if b not in good]
            if good:
                kept.append(("anthropic-beta", ",".join(good)))
            continue
        if lower in _DROPPED_HEADERS or lower.startswith("proxy-") or lower == "content-type":
            continue
        kept.append((name, value))
    return tuple(kept), tuple(dropped)


def judge_hosted(
    kind: str,
    placeholder: str,
    allows_model: Callable[[str], bool],
    *,
    method: str,
    target: str,
    headers: Headers,
    untrusted_body: bytes | bytearray,
    issued: IssuedIds,
    keep_tools: bool = False,
    bounded: bool = True,
    naive_screen: bool = False,
) -> HostedForward:
    """The whole judgement of one request to a hosted model rule (see the module's docstring).
    `bounded=False` (the proxy's `unsafe_unbounded_model_bodies`, tests only) parses a body of
    any count of values or depth of nesting, `naive_screen` (`unsafe_naive_content_screen`,
    tests only) forwards the content as the client's bytes after `unsafe_naive_screen`'s screen
    instead of the C pass's, so `lnk sandbox check` can show each class leak."""
    endpoint, path = judge_route(kind, method, target, issued)
    kept, dropped = judge_headers(kind, placeholder, headers)
    if not endpoint:
        if untrusted_body:
            raise RequestRefused("model-body", f"a body on {method} {path}")
        return HostedForward(kind, method, path, kept, b"", dropped)
    spans = naive_spans(untrusted_body) if naive_screen else None
    naive = strict_json.content_as_written(untrusted_body, spans) if spans else None
    parsed = naive or strict_json.read(untrusted_body, bounded=bounded, content_as_bytes=True)
    judged, removed = judge_body(
        kind,
        endpoint,
        parsed.value,
        allows_model,
        issued,
        keep_tools=keep_tools,
        canonical=parsed.canonical,
        fetch_seen=parsed.fetch_seen,
    )
    # Nothing changed (no key dropped, no tool removed: the judged copy equals the parse, and
    # the judge puts in no number or bool that could equal another type): the serialisation
    # strict_json made of the parse is this body's.
    canonical = parsed.canonical
    body = (
        canonical if canonical is not None and judged == parsed.value else strict_json.dumps(judged)
    )
    return HostedForward(kind, method, path, kept, body, dropped + removed)


def upstream_head(forward: HostedForward, host: str, secret: bytes) -> bytes:
    """The head for the provider: `Host` = the rule's host, the key in its one header."""
    value = secret.decode("ascii")
    lines = [f"{forward.method} {forward.path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {v}" for name, v in forward.headers]
    if forward.kind == "anthropic":
        lines.append(f"x-api-key: {value}")
    else:
        lines.append(f"Authorization: Bearer {value}")
    if forward.body or forward.method == "POST":
        lines += ["Content-Type: application/json", f"Content-Length: {len(forward.body)}"]
    lines += ["Accept-Encoding: identity", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
