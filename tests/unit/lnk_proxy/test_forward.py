"""Plain http forwarding: an origin's response head is relayed as sent but for the connection's
own headers; any framing another reader could see differently ends the sandbox's connection
(no response forged for its next request); chunked bodies are re-framed. Real sockets
(socketpairs) for the byte-moving parts."""

from __future__ import annotations

import asyncio
import socket

import pytest

from lnk_proxy.conn import Conn
from lnk_proxy.forward import (
    MAX_RESPONSE_HEAD_BYTES,
    BadResponse,
    Forwarded,
    copy_chunked,
    find_response_head_end,
    forward_http,
    parse_chunk_size,
    parse_response_head,
)
from lnk_proxy.http_request import RequestRefused, parse_request_head


def head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@pytest.mark.parametrize(
    ("lines", "method", "framing", "length"),
    [
        (("HTTP/1.1 200 OK", "Content-Length: 5"), "GET", "length", 5),
        (("HTTP/1.1 200 OK", "Content-Length: 5, 5"), "GET", "length", 5),
        (("HTTP/1.1 200 OK", "Transfer-Encoding: chunked"), "GET", "chunked", None),
        (("HTTP/1.1 200 OK", "Transfer-Encoding: Chunked"), "GET", "chunked", None),
        (("HTTP/1.1 200 OK",), "GET", "close", None),
        (("HTTP/1.0 200 OK", "Content-Length: 5"), "GET", "length", 5),
        (("HTTP/1.1 200 OK", "Content-Length: 5"), "HEAD", "none", None),
        (("HTTP/1.1 204 No Content",), "GET", "none", None),
        (("HTTP/1.1 304 Not Modified", "Content-Length: 99"), "GET", "none", None),
        (("HTTP/1.1 100 Continue",), "POST", "none", None),
        (
            ("HTTP/1.1 302 Found", "Location: http://x.example/", "Content-Length: 0"),
            "GET",
            "length",
            0,
        ),
    ],
)
def test_response_framing(lines: tuple[str, ...], method: str, framing: str, length: int) -> None:
    response = parse_response_head(head(*lines), method)
    assert (response.framing, response.length) == (framing, length)


@pytest.mark.parametrize(
    "lines",
    [
        ("HTTP/1.1 200 OK", "Content-Length: 5", "Transfer-Encoding: chunked"),  # smuggling
        ("HTTP/1.1 200 OK", "Transfer-Encoding: gzip, chunked"),
        ("HTTP/1.1 200 OK", "Transfer-Encoding: chunked", "Transfer-Encoding: chunked"),
        ("HTTP/1.1 200 OK", "Content-Length: 5", "Content-Length: 6"),
        ("HTTP/1.1 200 OK", "Content-Length: 5, 6"),
    ],
)
def test_ambiguous_response_framing_closes_the_connection(lines: tuple[str, ...]) -> None:
    response = parse_response_head(head(*lines), "GET")
    assert response.framing == "close"
    client_head = response.for_client(keep_alive=False)
    assert b"Connection: close" in client_head
    assert b"content-length" not in client_head.lower()


@pytest.mark.parametrize(
    "lines",
    [
        ("HTTP/2 200",),
        ("HTTP/1.1 20 OK",),
        ("ICY 200 OK",),
        ("HTTP/1.1 101 Switching Protocols", "Upgrade: websocket"),
        ("HTTP/1.1 200 OK", "Bad Header: x"),
        ("HTTP/1.1 200 OK", " folded"),
        ("HTTP/1.1 200 OK", "X: a\x00b"),
        ("HTTP/1.1 200 OK", "Content-Length: -1"),
        ("HTTP/1.1 200 OK", "Content-Length: 99999999999999999999"),
    ],
)
def test_a_malformed_response_is_bad(lines: tuple[str, ...]) -> None:
    with pytest.raises(BadResponse):
        parse_response_head(head(*lines), "GET")


def test_connection_headers_are_replaced_and_the_rest_kept() -> None:
    response = parse_response_head(
        head(
            "HTTP/1.1 302 Found",
            "Location: http://elsewhere.example/",
            "Connection: close, X-Secret-Hop",
            "Keep-Alive: timeout=5",
            "X-Secret-Hop: 1",
            "Set-Cookie: a=b",
            "Content-Length: 0",
        ),
        "GET",
    )
    out = response.for_client(keep_alive=True)
    assert out == head(
        "HTTP/1.1 302 Found",
        "Location: http://elsewhere.example/",
        "Set-Cookie: a=b",
        "Content-Length: 0",
        "Connection: keep-alive",
    )


def test_a_response_head_is_bounded() -> None:
    assert find_response_head_end(b"HTTP/1.1 200 OK\r\n\r\nbody") == 19
    assert find_response_head_end(b"HTTP/1.1 200 OK\r\n") is None
    with pytest.raises(BadResponse):
        find_response_head_end(b"x" * MAX_RESPONSE_HEAD_BYTES)


@pytest.mark.parametrize(
    ("line", "size"),
    [(b"0\r\n", 0), (b"1a\r\n", 26), (b"FF;name=value\r\n", 255), (b"5 \r\n", 5)],
)
def test_chunk_sizes(line: bytes, size: int) -> None:
    assert parse_chunk_size(line) == size


@pytest.mark.parametrize(
    "line", [b"\r\n", b"-1\r\n", b"0x10\r\n", b"g\r\n", b"1\n", b"1" * 16 + b"\r\n", b" 5\r\n"]
)
def test_bad_chunk_sizes_are_refused(line: bytes) -> None:
    with pytest.raises(RequestRefused):
        parse_chunk_size(line)


async def _pipe_through(feed: bytes) -> bytes:
    """Feed bytes into copy_chunked through real sockets; what comes out the other side."""
    a_out, a_in = socket.socketpair()
    b_out, b_in = socket.socketpair()
    try:
        src, dst = Conn(a_in, timeout=5), Conn(b_out, timeout=5)
        a_out.sendall(feed)
        a_out.shutdown(socket.SHUT_WR)
        await copy_chunked(src, dst)
        b_out.close()
        b_in.settimeout(5)
        out = b""
        while chunk := b_in.recv(65536):
            out += chunk
        return out
    finally:
        for sock in (a_out, a_in, b_out, b_in):
            sock.close()


def test_a_chunked_body_is_re_framed_without_extensions_or_trailers() -> None:
    feed = b"5;ext=1\r\nhello\r\n000003\r\n!!!\r\n0\r\nX-Trailer: forged\r\n\r\n"
    assert asyncio.run(_pipe_through(feed)) == b"5\r\nhello\r\n3\r\n!!!\r\n0\r\n\r\n"


def test_a_chunk_without_its_crlf_is_refused() -> None:
    with pytest.raises(RequestRefused, match="CRLF"):
        asyncio.run(_pipe_through(b"5\r\nhelloXX0\r\n\r\n"))


async def _forward(request_bytes: bytes, response_bytes: bytes) -> tuple[Forwarded, bytes, bytes]:
    """forward_http between a fake client and a fake origin: (how it ended, origin got, client
    got)."""
    client_far, client_near = socket.socketpair()
    origin_near, origin_far = socket.socketpair()
    try:
        head_end = request_bytes.index(b"\r\n\r\n") + 4
        request = parse_request_head(request_bytes[:head_end])
        client_far.sendall(request_bytes[head_end:])
        origin_far.sendall(response_bytes)
        origin_far.shutdown(socket.SHUT_WR)
        client, origin = Conn(client_near, timeout=5), Conn(origin_near, timeout=5)
        forwarded = await forward_http(request, client, origin)
        client_near.close()
        origin_near.close()
        got = []
        for sock in (origin_far, client_far):
            sock.settimeout(5)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            got.append(data)
        return forwarded, got[0], got[1]
    finally:
        for sock in (client_far, client_near, origin_near, origin_far):
            sock.close()


def test_a_post_and_its_answer_go_through_and_the_connection_stays() -> None:
    request = (
        b"POST http://a.example/up HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\n"
        b"Proxy-Authorization: Basic eDp5\r\n\r\nhello"
    )
    response = b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"
    forwarded, origin_got, client_got = asyncio.run(_forward(request, response))
    assert forwarded == Forwarded(client_keeps=True, upstream_keeps=True)
    assert origin_got == (
        b"POST /up HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\n"
        b"Connection: keep-alive\r\n\r\nhello"
    )
    assert (
        client_got
        == b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok"
    )


def test_a_close_delimited_answer_ends_the_connection() -> None:
    request = b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n"
    response = b"HTTP/1.1 200 OK\r\n\r\nuntil the end"
    forwarded, _, client_got = asyncio.run(_forward(request, response))
    assert forwarded == Forwarded(client_keeps=False, upstream_keeps=False)
    assert client_got == b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end"


def test_a_forged_second_response_is_not_relayed_as_the_next_answer() -> None:
    request = b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n"
    response = (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
    )
    forwarded, _, client_got = asyncio.run(_forward(request, response))
    assert forwarded.client_keeps
    assert client_got.endswith(b"\r\n\r\nok")  # the extra bytes stayed on the origin's line
    assert not forwarded.upstream_keeps  # and that line is never pooled for a next request


def test_interim_answers_are_relayed_before_the_final_one() -> None:
    request = (
        b"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nExpect: 100-continue\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
    )
    response = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    forwarded, origin_got, client_got = asyncio.run(_forward(request, response))
    assert forwarded == Forwarded(client_keeps=True, upstream_keeps=True)
    assert origin_got.endswith(b"\r\n\r\n2\r\nhi\r\n0\r\n\r\n")
    assert client_got.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")


def test_an_origin_that_closes_without_answering_is_bad() -> None:
    request = b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n"
    with pytest.raises(BadResponse):
        asyncio.run(_forward(request, b""))


@pytest.mark.parametrize(
    "response",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: x-a, Close\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok",
    ],
)
def test_an_origin_that_does_not_keep_its_connection_is_never_pooled(response: bytes) -> None:
    request = b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n"
    forwarded, _, client_got = asyncio.run(_forward(request, response))
    assert forwarded == Forwarded(client_keeps=True, upstream_keeps=False)
    assert client_got.endswith(b"\r\n\r\nok")


def test_an_http10_request_asks_the_origin_to_close_and_is_never_pooled() -> None:
    request = b"GET http://a.example/ HTTP/1.0\r\n\r\n"
    response = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    forwarded, origin_got, _ = asyncio.run(_forward(request, response))
    assert origin_got == b"GET / HTTP/1.0\r\nHost: a.example\r\nConnection: close\r\n\r\n"
    assert forwarded == Forwarded(client_keeps=False, upstream_keeps=False)
