"""lnk_proxy.service_relay.relay against a real TLS server on loopback (a CA made here): the
secret only at its template position upstream, the body re-framed, the answer streamed back
with the secret scrubbed even when the service splits it across chunks; a certificate for
another name, or from a CA the proxy does not trust, is never sent the secret."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from lnk_proxy.conn import Conn
from lnk_proxy.http_request import parse_request_head
from lnk_proxy.service_relay import relay, tls_context
from lnk_proxy.services import judge_service, placeholder
from lnk_shared.spec_services import TELEGRAM_HOST, ServiceRule

BOT = ServiceRule("telegram", TELEGRAM_HOST, "bot", ("getMe", "sendMessage"))
SECRET = b"1234567890:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
LOOPBACK = ipaddress.IPv4Address("127.0.0.1")
TIMEOUT_S = 10.0


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _issue(folder: Path, tag: str, host: str) -> tuple[Path, Path, Path]:
    """(CA file, leaf cert, leaf key) for `host`."""
    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(f"test CA {tag}"))
        .issuer_name(_name(f"test CA {tag}"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name(host))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / f"{tag}-ca.pem", folder / f"{tag}-leaf.pem", folder / f"{tag}-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@pytest.fixture
def certs(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


class _Service:
    """A TLS server answering one request with a chunked body that splits the secret."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ssl.SSLError, ConnectionError):
            writer.close()
            return
        self.heads.append(head)
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        self.bodies.append(await reader.readexactly(length))
        half = len(SECRET) // 2
        chunks = [b'{"token": "' + SECRET[:half], SECRET[half:] + b'"}']
        body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Echo: " + SECRET)
        writer.write(b"\r\n\r\n" + body)
        await writer.drain()
        writer.close()


async def _exchange(
    server_cert: tuple[Path, Path], trusted_ca: Path, request_bytes: bytes
) -> tuple[_Service, bytes, BaseException | None]:
    service = _Service()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(str(server_cert[0]), str(server_cert[1]))
    server = await asyncio.start_server(service.handle, "127.0.0.1", 0, ssl=server_tls)
    port = server.sockets[0].getsockname()[1]
    ours, theirs = socket.socketpair()
    client = Conn(ours)
    head_end = request_bytes.index(b"\r\n\r\n") + 4
    request = parse_request_head(request_bytes[:head_end])
    theirs.sendall(request_bytes[head_end:])  # the body, as the sandbox sends it after the head
    forward = judge_service(BOT, request)
    failure: BaseException | None = None
    try:
        await relay(
            forward,
            SECRET,
            request,
            client,
            LOOPBACK,
            context=tls_context(trusted_ca),
            connect_timeout_s=TIMEOUT_S,
            io_timeout_s=TIMEOUT_S,
            port=port,
        )
    except (OSError, ssl.SSLError) as exc:
        failure = exc
    finally:
        client.close()
        server.close()
        await server.wait_closed()
    answer = b""
    with theirs:
        theirs.settimeout(TIMEOUT_S)
        try:
            while chunk := theirs.recv(65536):
                answer += chunk
        except ConnectionResetError:  # closed with the body unread: the sandbox sees a reset
            pass
    return service, answer, failure


def _post(body: bytes) -> bytes:
    token = placeholder(BOT)
    return (
        f"POST http://{TELEGRAM_HOST}/bot{token}/sendMessage HTTP/1.1\r\nHost: {TELEGRAM_HOST}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def test_the_secret_goes_in_the_path_and_comes_back_scrubbed(certs: Path) -> None:
    ca, leaf, key = _issue(certs, "good", TELEGRAM_HOST)
    service, answer, failure = asyncio.run(_exchange((leaf, key), ca, _post(b"text=hi")))
    assert failure is None
    assert service.heads[0].startswith(b"POST /bot" + SECRET + b"/sendMessage HTTP/1.1\r\n")
    assert b"Host: api.telegram.org\r\n" in service.heads[0]
    assert service.heads[0].count(SECRET) == 1 and service.bodies == [b"text=hi"]
    assert SECRET not in answer
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close" in answer
    assert b"Transfer-Encoding" not in answer  # re-framed: close-delimited
    assert answer.endswith(b'{"token": "' + placeholder(BOT).encode() + b'"}')
    assert b"X-Echo: " + placeholder(BOT).encode() in answer


@pytest.mark.parametrize("case", ["another-name", "untrusted-ca"])
def test_an_upstream_the_proxy_cannot_verify_never_gets_the_secret(certs: Path, case: str) -> None:
    if case == "another-name":
        ca, leaf, key = _issue(certs, "other", "api.telegram.org.evil.example")
        trusted = ca
    else:
        _, leaf, key = _issue(certs, "rogue", TELEGRAM_HOST)
        trusted = _issue(certs, "trusted", TELEGRAM_HOST)[0]
    service, answer, failure = asyncio.run(_exchange((leaf, key), trusted, _post(b"x")))
    assert isinstance(failure, ssl.SSLCertVerificationError)
    assert service.heads == [] and answer == b""
