"""lnk_proxy.hosted_relay against a real TLS server on loopback (a CA made here): the judged body
and the owner's key go upstream, a streamed answer's first event reaches the sandbox while the
provider still holds the rest (the first byte is not held back), the key is scrubbed from what
comes back, and the response id it carried is learnt for this sandbox only."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import ipaddress
import json
import socket
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from lnk_proxy.conn import Conn, dial
from lnk_proxy.hosted_models import IssuedIds, judge_hosted
from lnk_proxy.hosted_relay import TCP_WMEM, exchange, read_body, upstream_buffers
from lnk_proxy.http_request import parse_request_head
from lnk_proxy.service_relay import tls_context
from lnk_proxy.strict_json import MAX_BODY_BYTES, BodyRefused
from lnk_proxy.tunnel_buffers import HOSTED_RECEIVE, tcp_send_max
from lnk_shared.errors import StateError

HOST = "api.openai.com"
SECRET = b"sk-proj-" + b"Q" * 40
PLACEHOLDER = "lnk-secret-openai"
LOOPBACK = ipaddress.IPv4Address("127.0.0.1")
TIMEOUT_S = 10.0


def _certs(folder: Path) -> tuple[Path, Path, Path]:
    """(CA file, leaf cert, leaf key) for HOST."""
    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "model relay test CA")])

    def build(subject: x509.Name, public: object) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(name)
            .public_key(public)  # type: ignore[arg-type]
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
        )

    ca = build(name, ca_key.public_key()).add_extension(
        x509.BasicConstraints(ca=True, path_length=None), critical=True
    )
    leaf = build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]), key.public_key())
    leaf = leaf.add_extension(x509.SubjectAlternativeName([x509.DNSName(HOST)]), critical=False)
    paths = folder / "ca.pem", folder / "leaf.pem", folder / "key.pem"
    paths[0].write_bytes(ca.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(
        leaf.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
    )
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


async def _stream_through(folder: Path) -> dict[str, object]:
    ca, leaf, key = _certs(folder)
    seen: dict[str, object] = {}
    first_arrived = asyncio.Event()

    async def provider(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        seen["head"], seen["body"] = head, await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
        writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
        first = b'data: {"type":"response.created","response":{"id":"resp_given"}}\n\n'
        writer.write(b"%x\r\n%s\r\n" % (len(first), first))
        await writer.drain()
        # The rest only once the sandbox has the first event: were it held, this would hang.
        await asyncio.wait_for(first_arrived.wait(), TIMEOUT_S)
        rest = b'data: {"echo":"' + SECRET + b'"}\n\n'
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest))
        await writer.drain()
        writer.close()

    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(str(leaf), str(key))
    server = await asyncio.start_server(provider, "127.0.0.1", 0, ssl=server_tls)
    port = server.sockets[0].getsockname()[1]
    body = json.dumps(
        {"model": "gpt-x", "input": "hi", "stream": True, "tools": [{"type": "web_search"}]}
    ).encode()
    head = (
        f"POST http://{HOST}/v1/responses HTTP/1.1\r\nHost: {HOST}\r\n"
        f"Authorization: Bearer {PLACEHOLDER}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    client = Conn(ours)
    request = parse_request_head(head)
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(theirs, body)
    untrusted = await read_body(request, client)
    issued = IssuedIds()
    forward = judge_hosted(
        "openai",
        PLACEHOLDER,
        {"gpt-x"}.__contains__,
        method="POST",
        target="/v1/responses",
        headers=request.headers,
        untrusted_body=untrusted,
        issued=issued,
    )
    relaying = asyncio.create_task(
        exchange(
            forward,
            HOST,
            SECRET,
            placeholder=PLACEHOLDER,
            request=request,
            client=client,
            address=LOOPBACK,
            issued=issued,
            context=tls_context(ca),
            connect_timeout_s=TIMEOUT_S,
            io_timeout_s=TIMEOUT_S,
            buffers=upstream_buffers(),
            port=port,
        )
    )
    answer = b""
    try:
        while b"resp_given" not in answer:
            answer += await asyncio.wait_for(loop.sock_recv(theirs, 65536), TIMEOUT_S)
        first_arrived.set()
        await asyncio.wait_for(relaying, TIMEOUT_S)
        while chunk := await asyncio.wait_for(loop.sock_recv(theirs, 65536), TIMEOUT_S):
            answer += chunk
    finally:
        relaying.cancel()
        client.close()
        theirs.close()
        server.close()
        await server.wait_closed()
    seen["answer"], seen["issued"] = answer, issued
    return seen


def test_a_streamed_answer_goes_through_event_by_event_with_the_key_scrubbed(
    tmp_path: Path,
) -> None:
    seen = asyncio.run(_stream_through(tmp_path))
    head, answer = seen["head"], seen["answer"]
    assert isinstance(head, bytes) and isinstance(answer, bytes)
    assert head.startswith(b"POST /v1/responses HTTP/1.1\r\nHost: api.openai.com\r\n")
    assert b"Authorization: Bearer " + SECRET + b"\r\n" in head
    assert PLACEHOLDER.encode() not in head
    assert json.loads(seen["body"]) == {"model": "gpt-x", "input": "hi", "stream": True}  # type: ignore[arg-type]
    assert SECRET not in answer
    assert b'data: {"echo":"' + PLACEHOLDER.encode() + b'"}' in answer
    assert "resp_given" in seen["issued"]  # type: ignore[operator]


def test_a_body_past_the_bound_is_refused_before_it_is_read() -> None:
    head = (
        f"POST http://{HOST}/v1/responses HTTP/1.1\r\nHost: {HOST}\r\n"
        f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n"
    ).encode()
    ours, theirs = socket.socketpair()

    async def read() -> bytes:
        return await read_body(parse_request_head(head), Conn(ours))

    with ours, theirs, pytest.raises(BodyRefused):
        asyncio.run(read())


async def _read_sent(head: bytes, pieces: list[bytes]) -> tuple[bytes, bytes]:
    """(read_body's answer, what is left in the client's buffer) when the client sends
    `pieces` one by one, then closes its side."""
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    with ours, theirs:
        client = Conn(ours)

        async def send() -> None:
            for piece in pieces:
                await loop.sock_sendall(theirs, piece)
            theirs.shutdown(socket.SHUT_WR)

        sender = asyncio.create_task(send())
        try:
            async with asyncio.timeout(TIMEOUT_S):
                body = await read_body(parse_request_head(head), client)
        finally:
            await sender
        return body, bytes(client.buffer)


def test_a_large_body_in_many_reads_is_read_whole_and_no_further() -> None:
    body = b'{"model":"gpt-x","input":"' + b"y" * (1024 * 1024) + b'"}'
    head = f"POST http://{HOST}/v1/responses HTTP/1.1\r\nHost: {HOST}\r\n"
    head += f"Content-Length: {len(body)}\r\n\r\n"
    pieces = [body[i : i + 50_000] for i in range(0, len(body), 50_000)]
    assert asyncio.run(_read_sent(head.encode(), [*pieces, b"POST /next"])) == (
        body,
        b"POST /next",
    )


def test_a_large_body_partly_read_with_its_head_is_read_whole_in_one_piece() -> None:
    body = b'{"model":"gpt-x","input":"' + b"z" * (300 * 1024 + 7) + b'"}'
    head = f"POST http://{HOST}/v1/responses HTTP/1.1\r\nHost: {HOST}\r\n"
    head += f"Content-Length: {len(body)}\r\n\r\n"

    async def read() -> tuple[bytes | bytearray, bytes]:
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        with ours, theirs:
            client = Conn(ours)
            client.buffer += body[:1000]  # what came with the head
            sender = asyncio.create_task(
                asyncio.get_running_loop().sock_sendall(theirs, body[1000:] + b"x")
            )
            async with asyncio.timeout(TIMEOUT_S):
                got = await read_body(parse_request_head(head.encode()), client)
            await sender
            return got, bytes(client.buffer)

    got, left = asyncio.run(read())
    assert (bytes(got), left) == (body, b"x")


def test_a_large_body_that_ends_early_is_an_error() -> None:
    head = f"POST http://{HOST}/v1/responses HTTP/1.1\r\nHost: {HOST}\r\n"
    head += f"Content-Length: {1024 * 1024}\r\n\r\n"
    with pytest.raises(EOFError):
        asyncio.run(_read_sent(head.encode(), [b"{" * 200_000]))


def test_a_chunked_body_is_read_whole() -> None:
    head = f"POST http://{HOST}/v1/responses HTTP/1.1\r\nHost: {HOST}\r\n"
    head += "Transfer-Encoding: chunked\r\n\r\n"
    chunks = [b'4\r\n{"a"\r\n', b"3\r\n:1}\r\n", b"0\r\n\r\n"]
    assert asyncio.run(_read_sent(head.encode(), chunks)) == (b'{"a":1}', b"")


def test_a_body_that_ends_early_is_an_error() -> None:
    head = f"POST http://{HOST}/v1/responses HTTP/1.1\r\nHost: {HOST}\r\n"
    head += "Content-Length: 100\r\n\r\n"
    with pytest.raises(EOFError):
        asyncio.run(_read_sent(head.encode(), [b"{" * 60]))


def test_the_upstream_buffers_count_this_kernels_send_maximum(tmp_path: Path) -> None:
    assert upstream_buffers().tcp_send_autotuned == tcp_send_max(TCP_WMEM.read_text())
    raised = tmp_path / "tcp_wmem"
    raised.write_text("4096\t16384\t67108864\n")
    assert upstream_buffers(raised).tcp_send_autotuned == 64 * 1024 * 1024


@pytest.mark.parametrize("text", [None, "4096 16384\n"], ids=["unreadable", "not-three-sizes"])
def test_a_tcp_wmem_the_proxy_cannot_read_stops_it_at_start(
    tmp_path: Path, text: str | None
) -> None:
    path = tmp_path / "tcp_wmem"
    if text is not None:
        path.write_text(text)
    with pytest.raises(StateError, match="tcp_wmem"):
        upstream_buffers(path)


SIOCOUTQ = 0x5411  # linux/sockios.h: bytes in a TCP socket's send queue not yet acknowledged


def test_a_provider_that_never_reads_fills_no_more_send_buffer_than_is_reserved() -> None:
    """The attack on the count: the upstream socket's send buffer is left to autotuning, so a
    provider that reads nothing lets it grow; what the kernel then holds for it must stay
    within what `hosted_buffers` counts (its receive buffer fixed, as asked)."""
    buffers = upstream_buffers()

    async def run() -> tuple[int, int, int]:
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        try:
            sock = await dial(LOOPBACK, port, TIMEOUT_S, buffers)
            provider, _ = listener.accept()  # never reads
        finally:
            listener.close()
        try:
            sent = 0
            chunk = b"x" * 65536
            with contextlib.suppress(BlockingIOError):
                for _ in range(4096):  # 256 MiB at most: far past any send buffer
                    sent += sock.send(chunk)
                    if sent % (4 * 1024 * 1024) == 0:
                        await asyncio.sleep(0.01)  # acks come: autotuning grows the buffer
            await asyncio.sleep(0.05)
            unacked = int.from_bytes(
                fcntl.ioctl(sock.fileno(), SIOCOUTQ, b"\0" * 4), "little", signed=True
            )
            send = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            receive = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            return send, unacked, receive
        finally:
            sock.close()
            provider.close()

    send, unacked, receive = asyncio.run(run())
    with open("/proc/sys/net/core/rmem_max") as f:
        rmem_max = int(f.read())
    assert receive == 2 * min(HOSTED_RECEIVE, rmem_max)  # fixed before connect
    assert send <= buffers.tcp_send_autotuned, (send, buffers)
    assert unacked <= buffers.tcp_send_autotuned, (unacked, buffers)
