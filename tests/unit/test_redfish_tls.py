"""The Redfish drivers' certificate check: one TLS context per CA bundle, shared by every
driver (a context per driver loaded the system's CA store thousands of times: CPU and
about a MiB each; benchmarks/scale.py), loaded again when the bundle on disk changes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metalmend.bmc.address import parse
from metalmend.bmc.errors import BmcError
from metalmend.bmc.redfish import RedfishDriver, tls_context
from metalmend.bmc.settings import BmcSettings
from metalmend_lab.pki import CertificateAuthority


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return CertificateAuthority(tmp_path / "pki").pair.cert


def driver(verify: bool | str, port: int) -> RedfishDriver:
    address = parse(f"redfish://127.0.0.1:{port}/redfish/v1/Systems/1")
    return RedfishDriver(address, "user", "secret", verify, BmcSettings())


def test_drivers_trusting_one_bundle_share_one_context(bundle: Path) -> None:
    first, second = driver(str(bundle), 8001), driver(str(bundle), 8002)
    assert first._tls() is second._tls()
    assert first._tls() is tls_context(str(bundle))


def test_drivers_trusting_the_system_store_share_one_context() -> None:
    assert driver(True, 8001)._tls() is driver(True, 8002)._tls()
    assert driver(False, 8001)._tls() is False


def test_a_rewritten_bundle_is_loaded_again(bundle: Path, tmp_path: Path) -> None:
    before = tls_context(str(bundle))
    other = CertificateAuthority(tmp_path / "other").pair.cert
    bundle.write_bytes(bundle.read_bytes() + other.read_bytes())  # rotation: both trusted
    os.utime(bundle, ns=(1, 1))
    assert tls_context(str(bundle)) is not before


def test_a_missing_or_broken_bundle_is_an_error_each_time(tmp_path: Path) -> None:
    with pytest.raises(BmcError, match="cannot load the BMC CA bundle"):
        tls_context(str(tmp_path / "absent.pem"))
    broken = tmp_path / "broken.pem"
    broken.write_text("not a certificate")
    for _ in range(2):  # not cached
        with pytest.raises(BmcError, match="cannot load the BMC CA bundle"):
            tls_context(str(broken))
