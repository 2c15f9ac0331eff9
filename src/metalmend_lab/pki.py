"""Certificates and keys for the lab's control plane.

One throw-away CA signs the serving certificates (apiserver, controller-manager) and every
client certificate (admin, controller-manager, users minted for RBAC tests). ECDSA P-256
keeps generation fast; kube-apiserver accepts it everywhere, including as the
service-account signing key (ES256).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM private key, as files."""

    cert: Path
    key: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


class CertificateAuthority:
    """A CA kept on disk, so that a restarted control plane keeps trusting old clients."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.pair = KeyPair(directory / "ca.crt", directory / "ca.key")
        if self.pair.cert.exists() and self.pair.key.exists():
            self._cert = x509.load_pem_x509_certificate(self.pair.cert.read_bytes())
            loaded = serialization.load_pem_private_key(self.pair.key.read_bytes(), None)
            assert isinstance(loaded, ec.EllipticCurvePrivateKey)
            self._key = loaded
        else:
            self._key = _new_key()
            self._cert = self._self_signed()
            _write(self.pair.key, _key_pem(self._key), private=True)
            _write(self.pair.cert, self._cert.public_bytes(serialization.Encoding.PEM))

    def _self_signed(self) -> x509.Certificate:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "metalmend-lab-ca")])
        now = dt.datetime.now(dt.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        dns_names: tuple[str, ...] = (),
        ip_addresses: tuple[str, ...] = (),
        server: bool = False,
    ) -> KeyPair:
        """Issue a client certificate (or a serving one with ``server=True``) as files."""
        key = _new_key()
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        now = dt.datetime.now(dt.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        _write(pair.key, _key_pem(key), private=True)
        _write(pair.cert, cert.public_bytes(serialization.Encoding.PEM))
        return pair


def write_signing_key(directory: Path) -> KeyPair:
    """The service-account token signing key (private) and its public half, as files."""
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    if not pair.key.exists():
        key = _new_key()
        _write(pair.key, _key_pem(key), private=True)
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        _write(pair.cert, public)
    return pair
