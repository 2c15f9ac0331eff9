"""The Redfish drivers' certificate check: one ``Trust`` per CA bundle, shared by every
driver, and one libcurl multi per trust on a loop, which parses the CA store once for all
of them (a store per driver loaded the system's CA store thousands of times: CPU and about
a MiB each; benchmarks/scale.py); a bundle rewritten on disk is a new trust, so it is
loaded again. Only the trust's own sources are trusted."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path

import pytest

from metalmend.bmc import curl
from metalmend.bmc.address import parse
from metalmend.bmc.curl import NO_CHECK, curl_loop, trust_for
from metalmend.bmc.errors import BmcError
from metalmend.bmc.redfish import RedfishDriver
from metalmend.bmc.settings import BmcSettings
from metalmend_lab.pki import CertificateAuthority


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return CertificateAuthority(tmp_path / "pki").pair.cert


def driver(verify: bool | str, port: int, *, system_cas: bool = True) -> RedfishDriver:
    address = parse(f"redfish://127.0.0.1:{port}/redfish/v1/Systems/1")
    return RedfishDriver(address, "user", "secret", verify, BmcSettings(), system_cas=system_cas)


def test_drivers_trusting_one_bundle_share_one_trust(bundle: Path) -> None:
    first, second = driver(str(bundle), 8001), driver(str(bundle), 8002)
    assert first._trust() is second._trust()
    assert first._trust() is trust_for(str(bundle))


def test_drivers_trusting_the_system_store_share_one_trust() -> None:
    assert driver(True, 8001)._trust() is driver(True, 8002)._trust()
    assert driver(False, 8001)._trust() is NO_CHECK


def test_the_bundle_alone_is_trusted_unless_the_system_store_is_allowed(bundle: Path) -> None:
    alone = trust_for(str(bundle), system_cas=False)
    assert (alone.cafile, alone.capath, alone.blob) == (str(bundle), None, None)
    both = trust_for(str(bundle), system_cas=True)
    system = ssl.get_default_verify_paths()
    assert both.cafile == str(bundle) or both.blob is not None
    if both.blob is None:  # the system's CAs by hash, as Python's default context has them
        assert both.capath == system.capath


def test_a_rewritten_bundle_is_loaded_again(bundle: Path, tmp_path: Path) -> None:
    before = trust_for(str(bundle))
    other = CertificateAuthority(tmp_path / "other").pair.cert
    bundle.write_bytes(bundle.read_bytes() + other.read_bytes())  # rotation: both trusted
    os.utime(bundle, ns=(1, 1))
    assert trust_for(str(bundle)) is not before


async def test_one_multi_per_trust_and_a_new_one_for_a_rotated_bundle(
    bundle: Path, tmp_path: Path
) -> None:
    before = trust_for(str(bundle), system_cas=False)
    multi = curl_loop(before)
    assert curl_loop(before) is multi
    assert curl_loop(NO_CHECK) is not multi
    rewrite(bundle)
    after = trust_for(str(bundle), system_cas=False)
    assert after != before
    assert curl_loop(after) is not multi
    table = curl._LOOPS[asyncio.get_running_loop()]
    assert before not in table, "the rotated bundle's old multi is no longer handed out"


def rewrite(bundle: Path) -> None:
    """The bundle rewritten in place (a rotation), with a new modification time."""
    bundle.write_bytes(bundle.read_bytes() + b"\n")
    os.utime(bundle, ns=(2, 2))


def test_a_missing_or_broken_bundle_is_an_error_each_time(tmp_path: Path) -> None:
    with pytest.raises(BmcError, match="cannot load the BMC CA bundle"):
        trust_for(str(tmp_path / "absent.pem"))
    broken = tmp_path / "broken.pem"
    broken.write_text("not a certificate")
    for _ in range(2):  # not cached
        with pytest.raises(BmcError, match="cannot load the BMC CA bundle"):
            trust_for(str(broken))
