"""Where metalmend may send a namespace's BMC credentials (``address.check_allowed``): pure
policy, with a resolver given as an argument (no DNS, no sockets)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

import pytest

from metalmend.bmc.address import Trust, check_allowed, check_trust, parse, redfish_path_problem
from metalmend.bmc.errors import REGISTRATION_ERROR, Refused, Unreachable
from metalmend.bmc.settings import BmcSettings

MGMT = (ipaddress.ip_network("10.20.0.0/16"), ipaddress.ip_network("fd00:20::/64"))
RESTRICTED = BmcSettings(allowed_networks=MGMT)


class Resolver:
    """A DNS of fixed answers that remembers what it was asked."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append((host, port))
        if host not in self.answers:
            raise OSError(-2, "Name or service not known")
        return self.answers[host]


NO_DNS = Resolver({})


@pytest.mark.parametrize(
    "address", ["redfish+http://10.20.0.5/redfish/v1/Systems/1", "idrac-redfish+http://bmc"]
)
async def test_cleartext_http_is_refused_by_default(address: str) -> None:
    with pytest.raises(Refused, match="credentials would be sent in cleartext") as caught:
        await check_allowed(parse(address), BmcSettings(), NO_DNS)
    assert "--bmc-allow-insecure-http" in str(caught.value)
    assert caught.value.error_type == REGISTRATION_ERROR


async def test_cleartext_http_passes_when_the_operator_allows_it() -> None:
    settings = BmcSettings(allow_insecure_http=True)
    assert await check_allowed(parse("redfish+http://bmc/"), settings, NO_DNS) is None


@pytest.mark.parametrize("address", ["redfish://bmc.example", "ipmi://bmc.example", "bmc:6230"])
async def test_without_allowed_networks_anything_else_passes_unresolved(address: str) -> None:
    assert await check_allowed(parse(address), BmcSettings(), NO_DNS) is None
    assert NO_DNS.asked == []  # nothing resolved: the driver connects as written


@pytest.mark.parametrize(
    ("address", "vetted"),
    [
        pytest.param("redfish://10.20.3.4/redfish/v1/Systems/1", "10.20.3.4", id="redfish ipv4"),
        pytest.param("ipmi://10.20.3.4", "10.20.3.4", id="ipmi ipv4"),
        pytest.param("redfish://[fd00:20::7]:8443", "fd00:20::7", id="ipv6"),
        pytest.param("ipmi://[::ffff:10.20.3.4]", "10.20.3.4", id="ipv4-mapped"),
    ],
)
async def test_an_ip_inside_the_allowed_networks_is_the_vetted_address(
    address: str, vetted: str
) -> None:
    assert await check_allowed(parse(address), RESTRICTED, NO_DNS) == vetted


@pytest.mark.parametrize(
    "address",
    [
        pytest.param("redfish://10.21.0.1/redfish/v1/Systems/1", id="redfish outside"),
        pytest.param("ipmi://192.0.2.10", id="ipmi outside: RAKP would hand out a crackable hash"),
        pytest.param("ipmi://169.254.169.254", id="metadata service"),
        pytest.param("redfish://127.0.0.1:8000", id="loopback"),
        pytest.param("redfish://[fd00:21::1]", id="ipv6 outside"),
    ],
)
async def test_an_ip_outside_the_allowed_networks_is_refused(address: str) -> None:
    with pytest.raises(Refused, match="outside the allowed BMC networks") as caught:
        await check_allowed(parse(address), RESTRICTED, NO_DNS)
    assert "10.20.0.0/16" in str(caught.value)
    assert "nothing was sent" in str(caught.value)


async def test_a_name_whose_addresses_are_all_allowed_is_vetted_to_one_of_them() -> None:
    dns = Resolver({"bmc-7.mgmt": ["10.20.0.7", "fd00:20::7"]})
    address = parse("redfish://bmc-7.mgmt/redfish/v1/Systems/1")
    assert await check_allowed(address, RESTRICTED, dns) == "10.20.0.7"
    assert dns.asked == [("bmc-7.mgmt", 443)]


async def test_a_name_with_any_address_outside_is_refused() -> None:
    # A name that also resolves outside could be steered there between check and connect.
    dns = Resolver({"bmc-7.mgmt": ["10.20.0.7", "203.0.113.66"]})
    with pytest.raises(Refused, match=re.escape("bmc-7.mgmt resolves to 203.0.113.66")):
        await check_allowed(parse("ipmi://bmc-7.mgmt"), RESTRICTED, dns)
    assert dns.asked == [("bmc-7.mgmt", 623)]


async def test_a_name_that_does_not_resolve_is_unreachable() -> None:
    with pytest.raises(
        Unreachable, match=re.escape("cannot resolve nowhere.mgmt: Name or service not known")
    ):
        await check_allowed(parse("redfish://nowhere.mgmt"), RESTRICTED, NO_DNS)


async def test_a_name_resolving_to_nothing_is_unreachable() -> None:
    with pytest.raises(Unreachable, match="resolves to no address"):
        await check_allowed(parse("redfish://empty.mgmt"), RESTRICTED, Resolver({"empty.mgmt": []}))


async def test_cleartext_is_refused_before_anything_is_resolved() -> None:
    dns = Resolver({"bmc-7.mgmt": ["10.20.0.7"]})
    with pytest.raises(Refused, match="cleartext"):
        await check_allowed(parse("redfish+http://bmc-7.mgmt"), RESTRICTED, dns)
    assert dns.asked == []


@pytest.mark.parametrize(
    ("path", "usable"),
    [
        ("/redfish/v1/Systems/1", True),
        ("/redfish/v1/Systems/System.Embedded.1", True),
        ("/redfish/v1/Systems/blade%201/", True),
        ("/redfish/v1/Systems", True),
        ("/redfish/v1/", False),
        ("https://203.0.113.9/redfish/v1/Systems/1", False),
        ("//203.0.113.9/redfish/v1/Systems/1", False),
        ("/redfish/v1/Systems/1/../../../x", False),
        ("/redfish/v1/Systems/1?$skip=2", False),
        ("/redfish/v1/Systems/\u202e1", False),
        ("/redfish/v1/Systems/" + "a" * 600, False),
    ],
)
def test_links_followed_are_plain_paths_under_the_service_root(path: str, usable: bool) -> None:
    assert (redfish_path_problem(path) is None) == usable


# ---- what each binding trusts (check_trust, and check_allowed for '*') -------------------

BUNDLE = "/etc/metalmend/bmc-ca.crt"
HTTPS = parse("redfish+https://10.20.0.5/redfish/v1/Systems/1")


@pytest.mark.parametrize(
    ("case", "verify", "every_host", "settings", "expected"),
    [
        ("by name, bundle", True, False, BmcSettings(ca_bundle=BUNDLE), Trust(BUNDLE, False)),
        (
            "by name, bundle and system CAs allowed",
            True, False, BmcSettings(ca_bundle=BUNDLE, trust_system_cas=True), Trust(BUNDLE, True),
        ),
        ("by name, system CAs only", True, False, BmcSettings(trust_system_cas=True),
         Trust(None, True)),
        ("'*', bundle", True, True, BmcSettings(ca_bundle=BUNDLE), Trust(BUNDLE, False)),
        (
            "'*', system CAs allowed: never for '*'",
            True, True, BmcSettings(ca_bundle=BUNDLE, trust_system_cas=True), Trust(BUNDLE, False),
        ),
        (
            "by name, no check, allowed",
            False, False, BmcSettings(allow_disable_certificate_verification=True), None,
        ),
    ],
)  # fmt: skip
def test_what_proves_a_bmc_certificate(
    case: str, verify: bool, every_host: bool, settings: BmcSettings, expected: Trust | None
) -> None:
    assert check_trust(HTTPS, verify, every_host, settings) == expected, case


@pytest.mark.parametrize(
    ("case", "verify", "every_host", "settings", "says"),
    [
        (
            "no check asked, not allowed",
            False, False, BmcSettings(ca_bundle=BUNDLE),
            "--bmc-allow-disable-certificate-verification",
        ),
        (
            "no check asked with '*', even where allowed",
            False, True, BmcSettings(allow_disable_certificate_verification=True),
            "never honoured for a Secret bound to every host",
        ),
        ("nothing trusted (the default)", True, False, BmcSettings(), "--bmc-ca-bundle"),
        (
            "'*' with the system CAs only",
            True, True, BmcSettings(trust_system_cas=True), "trusts the BMC CA bundle only",
        ),
    ],
)  # fmt: skip
def test_certificates_nothing_the_operator_trusts_could_prove_are_refused(
    case: str, verify: bool, every_host: bool, settings: BmcSettings, says: str
) -> None:
    with pytest.raises(Refused, match=re.escape(says)) as caught:
        check_trust(HTTPS, verify, every_host, settings)
    assert "Nothing was sent" in str(caught.value), case
    assert caught.value.error_type == REGISTRATION_ERROR


@pytest.mark.parametrize("address", ["ipmi://10.20.0.5", "redfish+http://10.20.0.5/"])
def test_no_tls_no_certificate_question(address: str) -> None:
    assert check_trust(parse(address), False, True, BmcSettings()) is None


async def test_a_secret_bound_to_every_host_goes_only_inside_the_allowed_networks() -> None:
    for address in ("ipmi://10.20.0.5", "redfish://10.20.0.5/redfish/v1/Systems/1"):
        with pytest.raises(Refused, match="none are set"):
            await check_allowed(parse(address), BmcSettings(), NO_DNS, every_host=True)
        assert await check_allowed(parse(address), RESTRICTED, NO_DNS, every_host=True) == (
            "10.20.0.5"
        )
    with pytest.raises(Refused, match="outside the allowed BMC networks"):
        await check_allowed(parse("ipmi://192.0.2.7"), RESTRICTED, NO_DNS, every_host=True)
    # bound by name: as before, anywhere unless the operator restricts the networks
    assert await check_allowed(parse("ipmi://192.0.2.7"), BmcSettings(), NO_DNS) is None
