"""The one-pass request head grammar against the line-by-line reading it replaced on the hot
path.

`http_request._HEAD` (with `_FIELD`) claims to accept exactly the heads the line-by-line
reading accepts, and to give the same names and values. Every head below is a valid one with
one byte inserted, replaced or removed at every position (a few thousand heads): each is
judged both ways and the answers must agree; and the public parse of each either parses or
refuses with a named rule, never with the "cannot read" fallback that only a disagreement
would reach."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lnk_proxy import http_request
from lnk_proxy.http_request import RULES, RequestRefused, parse_request_head

REQUESTS = [
    b"GET http://www.example.com/a?b=c HTTP/1.1\r\nHost: www.example.com\r\n"
    b"User-Agent: curl/8.5.0\r\nAccept:  */* \t\r\nX-Empty:\r\nConnection: keep-alive\r\n\r\n",
    b"CONNECT example.com:443 HTTP/1.0\r\nHost: example.com:443\r\nX-T: a\tb\x80\xff\r\n\r\n",
    b"POST http://[::1]:8080/ HTTP/1.1\r\nHost: [::1]:8080\r\nContent-Length: 2\r\n\r\n",
]
ODD = [b"\x00", b"\t", b" ", b"\r", b"\n", b":", b"\x7f", b"\x80", b"@", b"[", b"#", b"a"]


def mutations(head: bytes) -> Iterator[bytes]:
    """`head` with one byte inserted, replaced or removed, at every position of its lines
    (the final blank line is kept, so each stays a head)."""
    body = head[:-4]
    for at in range(len(body) + 1):
        for odd in ODD:
            yield body[:at] + odd + body[at:] + b"\r\n\r\n"
            if at < len(body):
                yield body[:at] + odd + body[at + 1 :] + b"\r\n\r\n"
        if at < len(body):
            yield body[:at] + body[at + 1 :] + b"\r\n\r\n"


def _by_lines_request(head: bytes) -> list[tuple[str, str]] | None:
    """The line-by-line reading: the fields, or None when it refuses the head."""
    lines = head[:-4].split(b"\r\n")
    try:
        http_request._parse_request_line(lines[0])
        return [http_request._parse_header_line(line) for line in lines[1:]]
    except RequestRefused:
        return None


@pytest.mark.parametrize("valid", REQUESTS, ids=["get", "connect", "post"])
def test_the_request_grammar_accepts_what_the_line_reading_accepts(valid: bytes) -> None:
    checked = 0
    for head in mutations(valid):
        if b"\r\n\r\n" in head[:-4] or b"\r\n\r\n" not in head:
            continue  # not one head: refused before either reading (incomplete-head)
        by_lines = _by_lines_request(head)
        match = http_request._HEAD.fullmatch(head)
        assert (match is not None) == (by_lines is not None), head
        if match is not None:
            fields = http_request._FIELD.findall(head, match.start(4), match.end(4))
            decoded = [(n.decode("ascii"), v.decode("latin-1")) for n, v in fields]
            assert decoded == by_lines, head
        try:
            parse_request_head(head)
        except RequestRefused as exc:
            assert exc.rule in RULES and "cannot read" not in exc.reason, head
        checked += 1
    assert checked > 1000
