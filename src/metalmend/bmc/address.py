"""BMC addresses as metal3 writes them in ``spec.bmc.address``.

| address                                   | protocol | transport                |
|-------------------------------------------|----------|--------------------------|
| ``ipmi://host[:port]``, bare ``host:port`` | IPMI     | UDP, port 623 by default |
| ``redfish://host[:port]/path``             | Redfish  | https (the default)      |
| ``redfish+http://…`` / ``redfish+https://…`` | Redfish  | as named                 |
| ``idrac-redfish[+http|+https]://…``        | Redfish  | as above                 |
| ``redfish-virtualmedia[+http|+https]://…`` | Redfish  | as above (power only)    |

The Redfish path names the system (``/redfish/v1/Systems/1``); without one, the BMC's only
system is used. Credentials never belong in the address: they come from the Secret.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import SplitResult, urlsplit

from metalmend.bmc.errors import BadAddress

IPMI_PORT = 623
REDFISH_FAMILIES = ("redfish", "idrac-redfish", "redfish-virtualmedia")


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
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = f":{self.port}" if self.port else ""
        return f"{self.scheme}://{host}{port}"

    @property
    def key(self) -> str:
        """One BMC, whatever the spelling of its address: commands to it are serialized."""
        return f"{self.protocol}/{self.host}/{self.port or ''}"

    def __str__(self) -> str:
        if self.protocol == "ipmi":
            return f"ipmi://{self.host}:{self.port}"
        return f"{self.endpoint}{self.system_path}"


def parse(address: str) -> BmcAddress:
    text = address.strip()
    if not text:
        raise BadAddress("the BMC address is empty")
    if "://" not in text:
        return _ipmi(urlsplit(f"ipmi://{text}"), address)
    parts = urlsplit(text)
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
            parts.path.rstrip("/") if parts.path not in ("", "/") else "",
        )
    raise BadAddress(
        f"unsupported BMC address scheme {parts.scheme!r}: metalmend drives ipmi:// and"
        f" {', '.join(f'{f}[+http|+https]://' for f in REDFISH_FAMILIES)}"
    )


def _ipmi(parts: SplitResult, address: str) -> BmcAddress:
    return BmcAddress("ipmi", _host(parts, address), _port(parts, address) or IPMI_PORT)


def _host(parts: SplitResult, address: str) -> str:
    host = parts.hostname
    if not host:
        raise BadAddress(f"no host in BMC address {address!r}")
    return str(host)


def _port(parts: SplitResult, address: str) -> int | None:
    try:
        port = parts.port
    except ValueError:
        raise BadAddress(f"bad port in BMC address {address!r}") from None
    return int(port) if port else None
