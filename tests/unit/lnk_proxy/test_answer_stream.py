"""lnk_proxy.answer_stream: the chunked decoder as tables (every split of the bytes decodes the
same; bad framing refuses), and stream_answer over real socket pairs: a head and the first event
that arrive together go out in one send while the upstream still holds the rest, the secret is
scrubbed, and nothing past the framing's end reaches the client."""

from __future__ import annotations

import asyncio
import socket

import pytest

from lnk_proxy.answer_stream import ChunkedBody, stream_answer
from lnk_proxy.conn import Conn
from lnk_proxy.forward import MAX_CHUNK_LINE, BadResponse
from lnk_proxy.http_request import parse_request_head

SECRET = b"sk-proj-" + b"S" * 24
PLACEHOLDER = b"lnk-secret-test"
TIMEOUT_S = 10.0
CHUNKED = b"5\r\nhello\r\n1;ext=1\r\n \r\n6\r\nworld!\r\n0\r\ntrailer: x\r\n\r\n"


def _decode_in_pieces(data: bytes, cuts: list[int]) -> tuple[bytes, bool]:
    body, out, at = ChunkedBody(), b"", 0
    for cut in [*cuts, len(data)]:
        out += body.feed(data[at:cut])
        at = cut
    return out, body.done


@pytest.mark.parametrize("cut", range(len(CHUNKED) + 1))
def test_every_split_of_a_chunked_body_decodes_the_same(cut: int) -> None:
    assert _decode_in_pieces(CHUNKED, [cut]) == (b"hello world!", True)


def test_a_chunked_body_fed_byte_by_byte_decodes_the_same() -> None:
    assert _decode_in_pieces(CHUNKED, list(range(1, len(CHUNKED)))) == (b"hello world!", True)


def test_bytes_after_the_last_chunk_are_not_data() -> None:
    body = ChunkedBody()
    assert body.feed(b"2\r\nok\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n\r\nsmuggled") == b"ok"
    assert body.done and body.feed(b"more") == b""


def test_an_unfinished_chunk_is_not_done() -> None:
    body = ChunkedBody()
    assert body.feed(b"a\r\n01234") == b"01234"
    assert not body.done


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"2\r\nokX\r\n", "not followed by CRLF"),
        (b"zz\r\n", "chunk-size"),
        (b"-1\r\n", "chunk-size"),
        (b"1" * MAX_CHUNK_LINE, "past"),
    ],
)
def test_bad_framing_is_a_bad_response(data: bytes, why: str) -> None:
    with pytest.raises(BadResponse, match=why):
        ChunkedBody().feed(data)


async def _relay(
    upstream: bytes, *, method: str = "POST", hold_after: bytes = b""
) -> tuple[bytes, bytes]:
    """(the client's first read, all it got) when the service sends `upstream`, then, once the
    client has read its first piece, `hold_after`."""
    service, ours = socket.socketpair()
    theirs, client_end = socket.socketpair()
    first_read = asyncio.Event()
    reader, writer = await asyncio.open_connection(sock=ours)
    loop = asyncio.get_running_loop()
    service.setblocking(False)
    client_end.setblocking(False)
    request = parse_request_head(
        f"{method} http://api.example.com/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n".encode()
    )

    async def service_side() -> None:
        await loop.sock_sendall(service, upstream)
        await first_read.wait()
        await loop.sock_sendall(service, hold_after)
        service.close()

    async def client_side() -> tuple[bytes, bytes]:
        first = await loop.sock_recv(client_end, 65536)
        first_read.set()
        rest = first
        while data := await loop.sock_recv(client_end, 65536):
            rest += data
        return first, rest

    try:
        async with asyncio.timeout(TIMEOUT_S):
            client_task = asyncio.create_task(client_side())
            service_task = asyncio.create_task(service_side())
            await stream_answer(request, reader, Conn(theirs), (SECRET, PLACEHOLDER), TIMEOUT_S)
            await service_task
            return await client_task
    finally:
        writer.close()
        theirs.close()
        client_end.close()
        service.close()


def test_the_head_and_the_first_event_go_out_together_while_the_rest_is_held() -> None:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    first_event = b'data: {"n": 1}\n\n'
    rest = b'data: {"n": 2}\n\n'
    first, whole = asyncio.run(
        _relay(
            head + b"%x\r\n%s\r\n" % (len(first_event), first_event),
            hold_after=b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest),
        )
    )
    assert first.startswith(b"HTTP/1.1 200 OK\r\n")
    assert first.endswith(b"Connection: close\r\n\r\n" + first_event)  # one send, nothing held
    assert whole == first + rest
    assert b"Transfer-Encoding" not in whole


def test_the_secret_is_scrubbed_from_the_head_and_across_reads_of_the_body() -> None:
    head = b"HTTP/1.1 200 OK\r\nX-Echo: " + SECRET + b"\r\nContent-Length: %d\r\n\r\n"
    body = b"key=" + SECRET + b"."
    split = 10  # the secret cut across the two reads
    _, whole = asyncio.run(
        _relay(head % len(body) + body[:split], hold_after=body[split:] + b"extra")
    )
    assert SECRET not in whole
    assert whole.endswith(b"\r\n\r\nkey=" + PLACEHOLDER + b".")  # nothing past the length


def test_an_answer_without_a_body_relays_nothing_after_its_head() -> None:
    _, whole = asyncio.run(
        _relay(b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n\r\nsmuggled", method="GET")
    )
    assert whole == b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"


def test_an_interim_head_goes_first_then_the_answer() -> None:
    _, whole = asyncio.run(
        _relay(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\nclosed-delimited")
    )
    assert whole == (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nConnection: close\r\n\r\nclosed-delimited"
    )


def test_an_answer_that_ends_inside_a_chunk_is_a_bad_response() -> None:
    with pytest.raises(BadResponse, match="ended early"):
        asyncio.run(_relay(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nshort"))
