"""The test internet's certificates (`net.py`): a throwaway CA made for each TestInternet and
the leaf certificates it signs for the hosts, each naming every name that answers its address.
Test data only: the CA lives as long as its TestInternet, and no client but the tests' is told to
trust it."""

from __future__ import annotations

import datetime as dt
import os
from ipaddress import IPv4Address
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

if TYPE_CHECKING:
    from net import Host

CERT_VALIDITY = dt.timedelta(days=2)  # a test run is hours at most


class Certs:
    """A throwaway CA (P-256, fast to make) and leaf certificates it signs."""

    def __init__(self, tag: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"lnk test CA {tag}")])
        self.name = name
        ski = x509.SubjectKeyIdentifier.from_public_key(self.key.public_key())
        self.cert = (
            _builder(name, self.key.public_key(), name)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(ski, critical=False)
            .sign(self.key, hashes.SHA256())
        )

    @property
    def pem(self) -> str:
        """The CA's certificate, PEM: what a client is told to trust."""
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    def issue(self, host: Host, names: list[str], directory: Path) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host.name)])
        alt: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
        alt.append(x509.IPAddress(IPv4Address(host.address)))
        ca_ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        cert = (
            _builder(subject, key.public_key(), self.name)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), False
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(self.key, hashes.SHA256())
        )
        cert_path, key_path = directory / f"{host.log.stem}.pem", directory / f"{host.log.stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        return cert_path, key_path


def _builder(subject: x509.Name, public_key: Any, issuer: x509.Name) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + CERT_VALIDITY)
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )
