"""BMC addresses as metal3 writes them: which protocol, where, which system."""

from __future__ import annotations

import pytest

from metalmend.bmc import BadAddress, parse
from metalmend.bmc.errors import POWER_MANAGEMENT_ERROR, REGISTRATION_ERROR, TimedOut, scrub


@pytest.mark.parametrize(
    ("address", "protocol", "endpoint_or_host", "port", "system"),
    [
        pytest.param("ipmi://10.0.0.5", "ipmi", "10.0.0.5", 623, "", id="ipmi default port"),
        pytest.param("ipmi://10.0.0.5:6230", "ipmi", "10.0.0.5", 6230, "", id="ipmi with port"),
        pytest.param("10.0.0.5:6231", "ipmi", "10.0.0.5", 6231, "", id="bare host:port is ipmi"),
        pytest.param("bmc.example", "ipmi", "bmc.example", 623, "", id="bare host is ipmi"),
        pytest.param(
            "redfish://10.0.0.6/redfish/v1/Systems/1", "redfish", "https://10.0.0.6", None,
            "/redfish/v1/Systems/1", id="redfish is https by default",
        ),
        pytest.param(
            "redfish+http://10.0.0.6:8000/redfish/v1/Systems/abc", "redfish",
            "http://10.0.0.6:8000", 8000, "/redfish/v1/Systems/abc", id="redfish+http",
        ),
        pytest.param(
            "redfish+https://[fd00::6]:8443/redfish/v1/Systems/1/", "redfish",
            "https://[fd00::6]:8443", 8443, "/redfish/v1/Systems/1", id="ipv6 and trailing slash",
        ),
        pytest.param(
            "idrac-redfish://10.0.0.7/redfish/v1/Systems/System.Embedded.1", "redfish",
            "https://10.0.0.7", None, "/redfish/v1/Systems/System.Embedded.1", id="idrac-redfish",
        ),
        pytest.param(
            "redfish-virtualmedia+http://10.0.0.8", "redfish", "http://10.0.0.8", None, "",
            id="virtualmedia without a path uses the only system",
        ),
    ],
)  # fmt: skip
def test_addresses(
    address: str, protocol: str, endpoint_or_host: str, port: int | None, system: str
) -> None:
    bmc = parse(address)
    assert bmc.protocol == protocol
    assert (bmc.endpoint if protocol == "redfish" else bmc.host) == endpoint_or_host
    assert bmc.port == port
    assert bmc.system_path == system


@pytest.mark.parametrize(
    ("address", "says"),
    [
        pytest.param("", "empty", id="empty"),
        pytest.param(
            "libvirt://10.0.0.1", "unsupported BMC address scheme 'libvirt'", id="libvirt"
        ),
        pytest.param("ilo5-redfish://10.0.0.1", "unsupported", id="ilo5"),
        pytest.param("redfish+ftp://10.0.0.1", "unsupported", id="bad transport"),
        pytest.param(
            "redfish://admin:secret@10.0.0.1", "must not carry credentials", id="userinfo"
        ),
        pytest.param("ipmi://10.0.0.1:notaport", "bad port", id="bad port"),
        pytest.param("redfish:///redfish/v1", "no host", id="no host"),
    ],
)
def test_bad_addresses_are_registration_errors(address: str, says: str) -> None:
    with pytest.raises(BadAddress, match=says) as caught:
        parse(address)
    assert caught.value.error_type == REGISTRATION_ERROR
    assert "secret" not in str(caught.value)


def test_one_bmc_whatever_the_spelling() -> None:
    assert parse("ipmi://10.0.0.5").key == parse("10.0.0.5:623").key
    assert parse("redfish://h/redfish/v1/Systems/1").key == parse("idrac-redfish://h").key


def test_power_errors_are_power_management_errors() -> None:
    assert TimedOut("x").error_type == POWER_MANAGEMENT_ERROR


def test_scrub_hides_every_secret() -> None:
    assert scrub("login p4ss failed for p4ss", "p4ss", "") == "login *** failed for ***"
