"""Throwaway certificates for tests and the embedded cluster (``LocalCluster(secure=True)``):
a CA, node certificates valid for loopback, and client certificates. Needs ``cryptography``
(the ``tls`` extra). Not for production PKI."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CertFiles:
    cert_file: str
    key_file: str


def _x509() -> tuple[Any, Any, Any, Any]:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "generating certificates needs the 'cryptography' package: pip install 'quorumlog[tls]'"
        ) from exc
    return x509, hashes, serialization, ec


def _write(directory: Path, name: str, cert: Any, key: Any, serialization: Any) -> CertFiles:
    directory.mkdir(parents=True, exist_ok=True)
    cert_path = directory / f"{name}.crt"
    key_path = directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return CertFiles(str(cert_path), str(key_path))


class CertificateAuthority:
    """A CA whose key stays in memory; ``issue`` writes PEM files under ``directory``."""

    def __init__(self, directory: str | Path, name: str = "quorumlog test CA") -> None:
        x509, hashes, serialization, ec = _x509()
        self.directory = Path(directory)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        subject = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, name)])
        self._name = subject
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca_file = str(self.directory / "ca.crt")
        Path(self.ca_file).write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        name: str,
        *,
        hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
        expired: bool = False,
        self_signed: bool = False,
    ) -> CertFiles:
        """A certificate for ``name`` valid for ``hosts`` (serverAuth and clientAuth).
        ``expired`` and ``self_signed`` make the bad ones tests need."""
        x509, hashes, serialization, ec = _x509()
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        if expired:
            not_before, not_after = now - dt.timedelta(days=10), now - dt.timedelta(days=1)
        else:
            not_before, not_after = now - dt.timedelta(minutes=5), now + dt.timedelta(days=30)
        subject = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, name)])
        sans: list[Any] = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject if self_signed else self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [
                        x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                        x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH,
                    ]
                ),
                critical=False,
            )
            .sign(key if self_signed else self._key, hashes.SHA256())
        )
        return _write(self.directory, name, cert, key, serialization)
