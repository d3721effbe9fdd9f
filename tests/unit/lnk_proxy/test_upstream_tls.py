"""lnk_proxy.upstream_tls against real TLS servers on loopback (a CA made here): a host whose
certificate names another host, or that never finishes the handshake, is never sent a byte of
the request; records that arrived together are read in one call; a body past a slice arrives
whole; an end without close_notify reads as the end; close sends close_notify and does not wait."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from lnk_proxy.service_relay import tls_context
from lnk_proxy.upstream_tls import WRITE_SLICE, UpstreamTls

HOST = "api.example.com"
TIMEOUT_S = 10.0
SHORT_S = 0.3  # a bound the test waits out on purpose (a silent host)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _certs(folder: Path, name: str) -> tuple[Path, ssl.SSLContext]:
    """(the CA's file, a server context whose certificate names `name`)."""
    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "upstream tls test CA")])

    def build(subject: x509.Name, public: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
        )

    ca = build(issuer, ca_key.public_key()).add_extension(
        x509.BasicConstraints(ca=True, path_length=None), critical=True
    )
    leaf = build(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), key.public_key()
    ).add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
    ca_file, leaf_file, key_file = folder / "ca.pem", folder / "leaf.pem", folder / "key.pem"
    ca_file.write_bytes(ca.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    leaf_file.write_bytes(
        leaf.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
    )
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(str(leaf_file), str(key_file))
    return ca_file, server


async def _dial(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def _with_server(
    folder: Path,
    handler: Handler,
    client: Callable[[int, Path], Awaitable[None]],
    *,
    name: str = HOST,
) -> None:
    ca, server_tls = _certs(folder, name)
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_tls)
    try:
        await client(server.sockets[0].getsockname()[1], ca)
    finally:
        server.close()


def test_a_host_whose_certificate_names_another_host_is_never_sent_a_byte(
    tmp_path: Path,
) -> None:
    got: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.append(await reader.read())  # the handshake fails: nothing, or an error

    async def client(port: int, ca: Path) -> None:
        with pytest.raises(ssl.SSLCertVerificationError):
            await UpstreamTls.open(await _dial(port), tls_context(ca), HOST, TIMEOUT_S)

    async def run() -> None:
        await _with_server(tmp_path, handler, client, name="evil.example.net")

    asyncio.run(run())
    assert got in ([], [b""])


def test_a_host_that_never_answers_the_handshake_times_out(tmp_path: Path) -> None:
    ca, _ = _certs(tmp_path, HOST)

    async def run() -> None:
        with socket.create_server(("127.0.0.1", 0)) as silent:
            port = silent.getsockname()[1]
            started = asyncio.get_running_loop().time()
            with pytest.raises(TimeoutError):
                await UpstreamTls.open(await _dial(port), tls_context(ca), HOST, SHORT_S)
            assert asyncio.get_running_loop().time() - started < TIMEOUT_S

    asyncio.run(run())


def test_records_that_arrived_together_are_read_in_one_call_then_the_end(tmp_path: Path) -> None:
    """Three records (three writes) sent before the read: one read returns all of them; the
    host's close_notify then reads as the end."""
    written = asyncio.Event()
    events = [b"data: %d\n\n" % i for i in range(3)]
    reads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)
        for event in events:
            writer.write(event)
        await writer.drain()
        written.set()
        await reader.read()  # until the proxy's close_notify
        writer.close()

    async def client(port: int, ca: Path) -> None:
        upstream = await UpstreamTls.open(await _dial(port), tls_context(ca), HOST, TIMEOUT_S)
        upstream.conn.timeout = TIMEOUT_S
        await upstream.write(b"ping")
        await asyncio.wait_for(written.wait(), TIMEOUT_S)
        reads.append(await upstream.read(65536))
        upstream.close()

    asyncio.run(_with_server(tmp_path, handler, client))
    assert reads == [b"".join(events)]


def test_a_body_past_one_slice_arrives_whole_and_close_sends_close_notify(tmp_path: Path) -> None:
    body = bytes(range(256)) * (WRITE_SLICE * 4 // 256) + b"end"
    seen: dict[str, object] = {}
    ended = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.readexactly(len(body))
        seen["digest"] = hashlib.sha256(data).digest()
        writer.write(b"ok")
        await writer.drain()
        seen["after"] = await reader.read()  # b"": a clean TLS end (close_notify)
        ended.set()
        writer.close()

    async def client(port: int, ca: Path) -> None:
        upstream = await UpstreamTls.open(await _dial(port), tls_context(ca), HOST, TIMEOUT_S)
        upstream.conn.timeout = TIMEOUT_S
        await upstream.write(b"", memoryview(body))
        seen["answer"] = await upstream.read(65536)
        upstream.close()  # not awaited: it does not wait for the host's close_notify
        await asyncio.wait_for(ended.wait(), TIMEOUT_S)

    asyncio.run(_with_server(tmp_path, handler, client))
    assert seen == {"digest": hashlib.sha256(body).digest(), "answer": b"ok", "after": b""}


def test_an_end_without_close_notify_reads_as_the_end(tmp_path: Path) -> None:
    """As the asyncio transport did: the answer's framing says whether it was whole."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"partial")
        await writer.drain()
        writer.transport.abort()  # the socket closed, no close_notify

    async def client(port: int, ca: Path) -> None:
        upstream = await UpstreamTls.open(await _dial(port), tls_context(ca), HOST, TIMEOUT_S)
        upstream.conn.timeout = TIMEOUT_S
        got = b""
        while data := await upstream.read(65536):
            got += data
        assert got == b"partial"
        upstream.close()

    asyncio.run(_with_server(tmp_path, handler, client))


def test_a_host_silent_after_the_handshake_times_out_on_read(tmp_path: Path) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    async def client(port: int, ca: Path) -> None:
        upstream = await UpstreamTls.open(await _dial(port), tls_context(ca), HOST, TIMEOUT_S)
        upstream.conn.timeout = SHORT_S
        with pytest.raises(TimeoutError):
            await upstream.read(65536)
        upstream.close()

    asyncio.run(_with_server(tmp_path, handler, client))
