"""Which plain http request may go again on a new connection when a reused one failed before
any answer (`plain_exchange`): no body, and a method RFC 9110 9.2.2 lets clients repeat. The
retry itself is tested with an origin in test_upstream_reuse."""

from __future__ import annotations

import pytest

from lnk_proxy.http_request import parse_request_head
from lnk_proxy.plain_exchange import _retryable


@pytest.mark.parametrize(
    ("head", "retryable"),
    [
        (b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", True),
        (b"DELETE http://a.example/x HTTP/1.1\r\nHost: a.example\r\n\r\n", True),
        (b"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", False),
        (b"PATCH http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", False),
        (b"PUT http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 2\r\n\r\n", False),
        (
            b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            False,
        ),
    ],
)
def test_only_a_repeatable_request_without_a_body_is_sent_twice(
    head: bytes, retryable: bool
) -> None:
    assert _retryable(parse_request_head(head)) is retryable
