"""Lab certificates: identities and names as the apiserver will read them."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from metalmend_lab.pki import CertificateAuthority, write_signing_key


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_client_certificate_carries_user_and_groups(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    cert = load(ca.issue("alice", "alice", organizations=("team-a", "team-b")).cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    groups = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert groups == ["team-a", "team-b"]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.issuer == load(ca.pair.cert).subject


def test_serving_certificate_names_loopback(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    pair = ca.issue(
        "api", "api", dns_names=("localhost",), ip_addresses=("127.0.0.1",), server=True
    )
    names = load(pair.cert).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]


def test_ca_is_reused_so_old_clients_stay_trusted(tmp_path: Path) -> None:
    first = CertificateAuthority(tmp_path)
    issued = load(first.issue("bob", "bob").cert)
    second = CertificateAuthority(tmp_path)
    assert load(second.pair.cert).subject == issued.issuer
    assert second.pair.cert.read_bytes() == first.pair.cert.read_bytes()


def test_private_keys_are_owner_only(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    pair = ca.issue("carol", "carol")
    signing = write_signing_key(tmp_path)
    for key in (ca.pair.key, pair.key, signing.key):
        assert key.stat().st_mode & 0o077 == 0
