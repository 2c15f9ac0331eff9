"""BMC addresses as metal3 writes them in ``spec.bmc.address``, and the policy on where
metalmend may send a namespace's BMC credentials.

| address                                   | protocol | transport                |
|-------------------------------------------|----------|--------------------------|
| ``ipmi://host[:port]``, bare ``host:port`` | IPMI     | UDP, port 623 by default |
| ``redfish://host[:port]/path``             | Redfish  | https (the default)      |
| ``redfish+http://…`` / ``redfish+https://…`` | Redfish  | as named                 |
| ``idrac-redfish[+http|+https]://…``        | Redfish  | as above                 |
| ``redfish-virtualmedia[+http|+https]://…`` | Redfish  | as above (power only)    |

The Redfish path names the system (``/redfish/v1/Systems/1``); it must be a plain path
under ``/redfish/v1/`` (no ``..``, no query). Without one, the BMC must serve exactly one
system. Credentials never belong in the address: they come from the Secret.

Where credentials may go (``check_allowed``, called before any driver is made):

- never over cleartext HTTP unless the operator allows it (``redfish+http``): anyone who
  may create a BareMetalHost could otherwise point it at a listener of theirs and read the
  namespace's BMC password off the wire;
- when the operator lists allowed BMC networks, only to addresses inside them, IPMI as
  well as Redfish. For IPMI the network list is the only protection: IPMI 2.0's RAKP
  handshake hands whoever answers as the BMC a salted HMAC of the password that can be
  cracked offline, so an IPMI address pointing at an impostor leaks the password without
  any cleartext. A host name is resolved once, every address it resolves to must be
  allowed, and the driver then connects to the vetted address itself, so a DNS answer
  changed between the check and the connection (DNS rebinding) cannot redirect it;
- a Secret bound with ``*`` (every host of its namespace) only to addresses inside the
  allowed BMC networks, and refused when none are set: with ``*``, whoever may create a
  host in the namespace chooses where that password goes.

Which certificates prove a Redfish BMC (``check_trust``, before any driver is made):
the operator's CA bundle; the system's CAs only where the operator allows them; no check
at all (``spec.bmc.disableCertificateVerification``) only where the operator allows it.
For a Secret bound with ``*``, the CA bundle only, and never no check.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import SplitResult, unquote, urlsplit

from metalmend.bmc.errors import BadAddress, Refused, Unreachable
from metalmend.bmc.settings import BmcSettings, IpNetwork

IPMI_PORT = 623
REDFISH_FAMILIES = ("redfish", "idrac-redfish", "redfish-virtualmedia")
REDFISH_ROOT = "/redfish/v1/"
MAX_PATH_CHARS = 512
"""Longest Redfish path followed; real ones are well under 100 characters."""

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""Resolves (host, port) to IP address texts; ``resolve_host`` is the real one."""


@dataclass(frozen=True)
class BmcAddress:
    protocol: Literal["redfish", "ipmi"]
    host: str
    port: int | None
    scheme: str = ""  # http or https, Redfish only
    system_path: str = ""  # Redfish only; "" means the BMC's only system

    @property
    def endpoint(self) -> str:
        """Redfish base URL (scheme://host[:port])."""
        port = f":{self.port}" if self.port else ""
        return f"{self.scheme}://{_bracketed(self.host)}{port}"

    @property
    def effective_port(self) -> int:
        if self.port:
            return self.port
        if self.protocol == "ipmi":
            return IPMI_PORT
        return 80 if self.scheme == "http" else 443

    @property
    def key(self) -> str:
        """One BMC endpoint, whatever the spelling of its address: commands to it are
        serialized (it is one small computer, whichever systems it serves)."""
        return f"{self.protocol}/{self.host}/{self.effective_port}"

    @property
    def system_key(self) -> str:
        """One system behind one endpoint, reached one way: what a driver is made for.
        Hosts whose addresses share an endpoint but name different systems get different
        keys, so they never share a driver (and never drive each other's server). The
        scheme is part of it: an https driver is never reused for an http address."""
        if self.protocol == "ipmi":
            return self.key
        return f"{self.key}/{self.scheme}{self.system_path}"

    def __str__(self) -> str:
        if self.protocol == "ipmi":
            return f"ipmi://{_bracketed(self.host)}:{self.port}"
        return f"{self.endpoint}{self.system_path}"


def parse(address: str) -> BmcAddress:
    text = address.strip()
    if not text:
        raise BadAddress("the BMC address is empty")
    try:
        if "://" not in text:
            return _ipmi(urlsplit(f"ipmi://{text}"), address)
        parts = urlsplit(text)
    except ValueError as error:  # urlsplit: "Invalid IPv6 URL" and the like
        raise BadAddress(f"malformed BMC address {address[:200]!r}: {error}") from None
    if parts.username or parts.password:
        raise BadAddress(
            "the BMC address must not carry credentials; put them in the Secret named by"
            " spec.bmc.credentialsName"
        )
    family, _, transport = parts.scheme.lower().partition("+")
    if family == "ipmi" and not transport:
        return _ipmi(parts, address)
    if family in REDFISH_FAMILIES and transport in ("", "http", "https"):
        return BmcAddress(
            "redfish",
            _host(parts, address),
            _port(parts, address),
            transport or "https",
            _system_path(parts, address),
        )
    raise BadAddress(
        f"unsupported BMC address scheme {parts.scheme!r}: metalmend drives ipmi:// and"
        f" {', '.join(f'{f}[+http|+https]://' for f in REDFISH_FAMILIES)}"
    )


def redfish_path_problem(path: str) -> str | None:
    """Why ``path`` is not a plain Redfish resource path under /redfish/v1/, or None.

    Applied to the system path of an address and to every link a BMC gives us before we
    follow it: we only ever send the credentials to the endpoint the host names, and only
    to plain resource paths there (no absolute URL, no ``..``, no query)."""
    if not path.startswith(REDFISH_ROOT) or len(path) == len(REDFISH_ROOT):
        return "it must be a path under /redfish/v1/"
    if len(path) > MAX_PATH_CHARS:
        return f"it is longer than {MAX_PATH_CHARS} characters"
    if not path.isascii() or any(c.isspace() or not c.isprintable() for c in path):
        return "it has spaces, control or non-ASCII characters (percent-encode them)"
    if "?" in path or "#" in path:
        return "it has a query or fragment"
    if "\\" in path:
        return "it has a backslash"
    segments = path[len(REDFISH_ROOT) :].removesuffix("/").split("/")
    for segment in segments:
        plain = unquote(segment)
        if not segment:
            return "it has an empty segment (//)"
        if plain in (".", "..") or "/" in plain or "\\" in plain:
            return "it has a '.' or '..' segment or an encoded slash"
    return None


# ---- where credentials may be sent ---------------------------------------------------


async def resolve_host(host: str, port: int) -> list[str]:
    """The IP addresses ``host`` resolves to (the system resolver, in the loop's executor:
    a caller's deadline ends the wait; the lookup itself ends at the resolver's timeout)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def check_allowed(
    address: BmcAddress,
    settings: BmcSettings,
    resolve: Resolver = resolve_host,
    *,
    every_host: bool = False,
) -> str | None:
    """Refuse (``Refused``) an address metalmend must not send credentials to; nothing is
    sent by this check but a DNS query for a host name when networks are restricted.
    ``every_host``: the credentials come from a Secret bound with ``*``.

    Returns the vetted IP address the driver must connect to when the BMC networks are
    restricted (the host's IP literal, or the address its name resolved to), or None when
    they are not (the driver connects to the address as written)."""
    refuse_cleartext(address, settings)
    if every_host and not settings.allowed_networks:
        raise Refused(
            f"{address}: the host's Secret is bound to every host of its namespace"
            f" ({EVERY_HOST_NOTE}), which metalmend honours only for BMC addresses inside the"
            " allowed BMC networks, and none are set (--bmc-allowed-network); bind the"
            " Secret to its hosts by name. Nothing was sent"
        )
    if not settings.allowed_networks:
        return None
    literal = ip_literal(address.host)
    if literal is not None:
        return vetted_ip(address, [str(literal)], settings.allowed_networks)
    try:
        resolved = await resolve(address.host, address.effective_port)
    except OSError as error:
        why = error.strerror or type(error).__name__
        raise Unreachable(f"{address}: cannot resolve {address.host}: {why}") from None
    return vetted_ip(address, resolved, settings.allowed_networks)


EVERY_HOST_NOTE = "metalmend.dev/bmc-hosts: '*'"


@dataclass(frozen=True)
class Trust:
    """What proves a Redfish BMC's certificate: the CA bundle and/or the system's CAs."""

    ca_bundle: str | None
    system_cas: bool


def check_trust(
    address: BmcAddress, verify_certificates: bool, every_host: bool, settings: BmcSettings
) -> Trust | None:
    """What the BMC's certificate is checked against (None: not checked, as the host asks
    and the operator allows), or ``Refused`` when nothing the operator trusts could prove
    it. Pure; nothing is sent. Not TLS (IPMI, cleartext Redfish): None."""
    if address.protocol != "redfish" or address.scheme != "https":
        return None
    if not verify_certificates:
        if every_host:
            raise Refused(
                f"{address}: spec.bmc.disableCertificateVerification is never honoured for a"
                f" Secret bound to every host of its namespace ({EVERY_HOST_NOTE}): anyone"
                " who may create a host there could receive its password. Bind the Secret to"
                " this host by name, or give the BMC a certificate of the operator's CA."
                " Nothing was sent"
            )
        if not settings.allow_disable_certificate_verification:
            raise Refused(
                f"{address}: spec.bmc.disableCertificateVerification is set, and the operator"
                " does not allow BMC certificates to go unchecked"
                " (--bmc-allow-disable-certificate-verification); give the BMC a certificate"
                " of the BMC CA bundle. Nothing was sent"
            )
        return None
    system_cas = settings.trust_system_cas and not every_host
    if settings.ca_bundle is None and not system_cas:
        why = (
            f"a Secret bound to every host ({EVERY_HOST_NOTE}) trusts the BMC CA bundle only"
            if every_host and settings.trust_system_cas
            else "no BMC CA bundle is set (--bmc-ca-bundle) and the system CAs are not trusted"
            " (--bmc-trust-system-cas)"
        )
        raise Refused(
            f"{address}: nothing could prove the BMC's certificate: {why}. Nothing was sent"
        )
    return Trust(settings.ca_bundle, system_cas)


def refuse_cleartext(address: BmcAddress, settings: BmcSettings) -> None:
    insecure = address.protocol == "redfish" and address.scheme == "http"
    if insecure and not settings.allow_insecure_http:
        raise Refused(
            f"{address}: credentials would be sent in cleartext; use https or ask the"
            " operator to allow insecure BMC HTTP (--bmc-allow-insecure-http)"
        )


def vetted_ip(address: BmcAddress, resolved: Sequence[str], networks: Sequence[IpNetwork]) -> str:
    """The address to connect to, if every address in ``resolved`` lies in ``networks``
    (a name that also resolves outside could be steered there); else ``Refused``."""
    if not resolved:
        raise Unreachable(f"{address}: {address.host} resolves to no address")
    ips: list[IpAddress] = []
    for text in resolved:
        ip = ip_literal(text)
        if ip is None:
            raise Refused(f"{address}: {address.host} resolves to {text!r}, not an IP address")
        ips.append(ip)
    for ip in ips:
        if not any(_inside(ip, network) for network in networks):
            via = "" if str(ip) == address.host else f"{address.host} resolves to {ip}, "
            shown = ", ".join(str(n) for n in networks[:5])
            more = f" and {len(networks) - 5} more" if len(networks) > 5 else ""
            raise Refused(
                f"{address}: {via}{ip} is outside the allowed BMC networks ({shown}{more});"
                " nothing was sent"
            )
    return str(ips[0])


def ip_literal(text: str) -> IpAddress | None:
    """``text`` as an IP address (IPv4-mapped IPv6 as the IPv4 address it reaches)."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _inside(ip: IpAddress, network: IpNetwork) -> bool:
    return ip.version == network.version and ip in network


# ---- parsing helpers -----------------------------------------------------------------


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _ipmi(parts: SplitResult, address: str) -> BmcAddress:
    return BmcAddress("ipmi", _host(parts, address), _port(parts, address) or IPMI_PORT)


# A DNS name (letters, digits, '-', '.', '_') or an IP literal; anything else (spaces,
# '%', quotes) would be passed on to a resolver or a URL as is.
_HOST = re.compile(r"^(?:[A-Za-z0-9_.-]{1,253}|[0-9A-Fa-f:.]{2,45})$")


def _host(parts: SplitResult, address: str) -> str:
    host = parts.hostname
    if not host:
        raise BadAddress(f"no host in BMC address {address!r}")
    if not _HOST.match(host):
        raise BadAddress(f"bad host {host[:100]!r} in BMC address: not a DNS name or IP address")
    return str(host)


def _port(parts: SplitResult, address: str) -> int | None:
    try:
        port = parts.port
    except ValueError:
        raise BadAddress(f"bad port in BMC address {address!r}") from None
    return int(port) if port else None


def _system_path(parts: SplitResult, address: str) -> str:
    if parts.query or parts.fragment or address.rstrip().endswith(("?", "#")):
        raise BadAddress(f"BMC address {address!r} has a query or fragment; name a system path")
    path = parts.path
    if path in ("", "/", "/redfish/v1", REDFISH_ROOT):
        return ""  # no system named: the BMC must serve exactly one
    problem = redfish_path_problem(path)
    if problem is not None:
        raise BadAddress(
            f"the system path {path!r} of BMC address {address!r} is not usable: {problem}"
            " (for example /redfish/v1/Systems/1)"
        )
    return path.rstrip("/")
