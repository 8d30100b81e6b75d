"""Certificates the tests make for themselves (with `cryptography`): a certificate
authority, and certificates it signs for brokers and clients, valid for 127.0.0.1
and localhost, written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Issued:
    certfile: Path
    keyfile: Path
    subject: str  # the principal a broker derives from it: "User:CN=...,O=..." (names without RFC 4514 specials)


class CertificateAuthority:
    def __init__(self, directory: Path, name: str = "logbus-test-ca") -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self._certificate = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.cafile = self.directory / f"{name}.pem"
        self.cafile.write_bytes(self._certificate.public_bytes(serialization.Encoding.PEM))

    def issue(self, common_name: str, organization: str = "logbus-tests", unit: str | None = None) -> Issued:
        """A certificate for `CN=common_name[,OU=unit],O=organization`, written under
        `common_name` (and `unit`) as the file name."""
        key = ec.generate_private_key(ec.SECP256R1())
        units = [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit)] if unit else []
        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization), *units,
                             x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        certificate = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(self._certificate.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        name = f"{common_name}.{unit}" if unit else common_name
        certfile = self.directory / f"{name}.crt"
        keyfile = self.directory / f"{name}.key"
        certfile.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
        keyfile.chmod(0o600)
        return Issued(certfile, keyfile, f"User:CN={common_name}{f',OU={unit}' if unit else ''},O={organization}")
