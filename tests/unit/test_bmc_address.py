"""BMC addresses as metal3 writes them: which protocol, where, which system."""

from __future__ import annotations

import re

import pytest

from metalmend.bmc import BadAddress, parse
from metalmend.bmc.errors import POWER_MANAGEMENT_ERROR, REGISTRATION_ERROR, TimedOut


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
        pytest.param(
            "redfish://[not-an-address/redfish/v1/Systems/1",
            "malformed BMC address",
            id="unclosed IPv6 bracket is a message, not a ValueError",
        ),
        pytest.param("ipmi://[::1", "malformed BMC address", id="unclosed IPv6 bracket, ipmi"),
        pytest.param("redfish://%zz/redfish/v1", "bad host", id="percent in host"),
        pytest.param("ipmi://bmc 1", "bad host", id="space in host"),
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


@pytest.mark.parametrize(
    ("address", "says"),
    [
        pytest.param("redfish://h/redfish/v1/Systems/../Managers/1", "'.' or '..'", id="dot-dot"),
        pytest.param(
            "redfish://h/redfish/v1/Systems/%2e%2e/x", "'.' or '..'", id="encoded dot-dot"
        ),
        pytest.param("redfish://h/redfish/v1/Systems/a%2Fb", "encoded slash", id="encoded slash"),
        pytest.param("redfish://h/redfish/v1/Systems//1", "empty segment", id="double slash"),
        pytest.param(
            "redfish://h/Systems/1", "under /redfish/v1/", id="not under the service root"
        ),
        pytest.param("redfish://h/redfish/v2/Systems/1", "under /redfish/v1/", id="other version"),
        pytest.param("redfish://h/redfish/v1/Systems/1?$expand=*", "query", id="query"),
        pytest.param("redfish://h/redfish/v1/Systems/1#x", "query or fragment", id="fragment"),
        pytest.param("redfish://h/redfish/v1/Systems/1?", "query", id="empty query"),
        pytest.param("redfish://h/redfish/v1/Systems/é", "non-ASCII", id="non-ascii"),
        pytest.param("redfish://h/redfish/v1/Systems/a\\b", "backslash", id="backslash"),
    ],
)
def test_a_system_path_must_be_a_plain_path_under_the_service_root(address: str, says: str) -> None:
    with pytest.raises(BadAddress, match=re.escape(says)) as caught:
        parse(address)
    assert caught.value.error_type == REGISTRATION_ERROR


@pytest.mark.parametrize("path", ["", "/", "/redfish/v1", "/redfish/v1/"])
def test_the_service_root_names_no_system(path: str) -> None:
    assert parse(f"redfish://h{path}").system_path == ""


def test_hosts_on_one_endpoint_share_its_key_but_not_their_system_key() -> None:
    a = parse("redfish://chassis:8443/redfish/v1/Systems/A")
    b = parse("redfish://chassis:8443/redfish/v1/Systems/B")
    assert a.key == b.key  # one BMC: its commands are serialized
    assert a.system_key != b.system_key  # two systems: never one driver
    assert a.system_key == parse("idrac-redfish://chassis:8443/redfish/v1/Systems/A/").system_key


def test_the_system_key_tells_http_from_https() -> None:
    https = parse("redfish+https://h:8000/redfish/v1/Systems/1")
    http = parse("redfish+http://h:8000/redfish/v1/Systems/1")
    assert https.key == http.key
    assert https.system_key != http.system_key  # an https driver never serves an http host


def test_a_default_port_written_out_is_the_same_bmc() -> None:
    assert parse("redfish://h").key == parse("redfish://h:443").key
    assert parse("redfish+http://h").key == parse("redfish+http://h:80").key
    assert parse("ipmi://h").system_key == parse("h:623").system_key
