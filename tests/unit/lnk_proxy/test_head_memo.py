"""The parsed heads a sandbox repeats, remembered by their bytes: each remembered result is
the parser's own, a refused head is refused every time, and the memo stays bounded."""

from __future__ import annotations

import pytest

from lnk_proxy.forward import BadResponse, parse_response_head
from lnk_proxy.head_memo import MAX_ENTRIES, MAX_KEPT_HEAD, HeadMemo
from lnk_proxy.http_request import (
    RequestRefused,
    format_upstream_head,
    parse_request_head,
    shown_target,
)

GET = b"GET http://example.com/a?b HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: x\r\nX: y\r\n\r\n"


def test_a_request_is_what_the_parser_gives_and_is_parsed_once() -> None:
    memo = HeadMemo()
    first = memo.request(GET)
    request = parse_request_head(GET)
    assert first.request == request
    assert first.upstream_head == format_upstream_head(request)
    assert first.target == shown_target(request) == "http://example.com/a?b"
    assert memo.request(bytes(GET)) is first  # the same bytes: no second parse


def test_a_connect_is_kept_without_an_upstream_head() -> None:
    parsed = HeadMemo().request(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n")
    assert parsed.upstream_head == b"" and parsed.target == "example.com:443"


@pytest.mark.parametrize(
    "hostile",
    [
        b"GET http://example.com/ HTTP/1.1\r\nHost: other.com\r\n\r\n",  # host-mismatch
        b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nBad Name: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",  # origin-form
    ],
)
def test_a_refused_head_is_refused_every_time(hostile: bytes) -> None:
    memo = HeadMemo()
    for _ in range(3):
        with pytest.raises(RequestRefused):
            memo.request(hostile)


def test_a_response_is_what_the_parser_gives_with_the_proxys_connection_header() -> None:
    memo = HeadMemo()
    parsed = memo.response(ANSWER, "GET", True)
    assert parsed.response == parse_response_head(ANSWER, "GET")
    assert parsed.client_head == parse_response_head(ANSWER, "GET").for_client(True)
    assert memo.response(ANSWER, "GET", False).client_head.endswith(b"Connection: close\r\n\r\n")
    assert memo.response(ANSWER, "HEAD", True).response.framing == "none"  # by the method too


def test_a_bad_response_is_refused_every_time() -> None:
    memo = HeadMemo()
    for _ in range(2):
        with pytest.raises(BadResponse):
            memo.response(b"HTTP/1.1 101 Switching\r\n\r\n", "GET", True)


def test_the_memo_is_bounded() -> None:
    memo = HeadMemo()
    for number in range(3 * MAX_ENTRIES):
        memo.request(GET.replace(b"/a?b", b"/%d" % number))
    assert len(memo._requests) <= MAX_ENTRIES
    large = GET.replace(b"Accept: */*", b"Accept: " + b"x" * MAX_KEPT_HEAD)
    memo.request(large)
    assert large not in memo._requests  # parsed, never kept
