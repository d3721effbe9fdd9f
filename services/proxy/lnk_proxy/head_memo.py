"""One sandbox's parsed heads, remembered by their exact bytes: a keep-alive client sends the
same request head again and again, and an origin the same answer head, so each is parsed
once instead of once per request (the two parses were a quarter of a small request's CPU on
the callback path, `fast_exchange`).

Exact, not an approximation: `parse_request_head` (with `format_upstream_head` and
`shown_target` of its result) and `parse_response_head` (with `ResponseHead.for_client`) are
pure functions of the bytes (and the request's method, and keep-alive), and their results are
frozen, so a remembered result is the one a new call would give. Only heads that parsed are
kept: a refused head is parsed (and refused) every time. What is judged about a request (its
host, the flags, the route) is never remembered here: `policy_memo` and the decision do that,
on every request.

One memo per listener: what one sandbox sent never shows in another's timing.

Limits: heads up to `MAX_KEPT_HEAD` bytes only, at most `MAX_ENTRIES` of each kind (about
`MAX_ENTRIES * MAX_KEPT_HEAD` bytes a sandbox may pin); when full, all of a kind are
forgotten at once.
"""

from __future__ import annotations

from typing import NamedTuple

from lnk_proxy.forward import ResponseHead, parse_response_head
from lnk_proxy.http_request import (
    ProxyRequest,
    format_upstream_head,
    parse_request_head,
    shown_target,
)

__all__ = ["MAX_ENTRIES", "MAX_KEPT_HEAD", "HeadMemo", "ParsedRequest", "ParsedResponse"]

MAX_ENTRIES = 64  # distinct heads one sandbox repeats at once (a few clients, a few origins)
MAX_KEPT_HEAD = 4096  # a client's usual head is a few hundred bytes; larger ones are parsed


class ParsedRequest(NamedTuple):
    request: ProxyRequest
    upstream_head: bytes  # `format_upstream_head(request)` (b"" for a CONNECT)
    target: str  # `shown_target(request)`: as the wire's log shows it


class ParsedResponse(NamedTuple):
    response: ResponseHead
    client_head: bytes  # `response.for_client(keep_alive)`


class HeadMemo:
    def __init__(self) -> None:
        self._requests: dict[bytes, ParsedRequest] = {}
        self._responses: dict[tuple[bytes, str, bool], ParsedResponse] = {}

    def request(self, untrusted: bytes) -> ParsedRequest:
        """`parse_request_head(untrusted)` and what follows from it; RequestRefused as it."""
        parsed = self._requests.get(untrusted)
        if parsed is not None:
            return parsed
        request = parse_request_head(untrusted)
        upstream = format_upstream_head(request) if request.kind == "http" else b""
        parsed = ParsedRequest(request, upstream, shown_target(request))
        if len(untrusted) <= MAX_KEPT_HEAD:
            if len(self._requests) >= MAX_ENTRIES:
                self._requests.clear()
            self._requests[untrusted] = parsed
        return parsed

    def response(self, untrusted: bytes, method: str, keep_alive: bool) -> ParsedResponse:
        """`parse_response_head(untrusted, method)` and its head for the client with
        `keep_alive`; BadResponse as it."""
        key = (untrusted, method, keep_alive)
        parsed = self._responses.get(key)
        if parsed is not None:
            return parsed
        response = parse_response_head(untrusted, method)
        parsed = ParsedResponse(response, response.for_client(keep_alive))
        if len(untrusted) <= MAX_KEPT_HEAD:
            if len(self._responses) >= MAX_ENTRIES:
                self._responses.clear()
            self._responses[key] = parsed
        return parsed
