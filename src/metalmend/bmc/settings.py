"""Settings of the BMC layer: one dataclass, each default written once, with the reason."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class BmcSettings:
    timeout: float = 30.0
    """Hard deadline of one BMC call (connect, login, request, answer): the call is ended
    when it passes, whatever the BMC is doing."""

    max_in_flight: int = 16
    """BMC calls in flight at once, over all BMCs. A controller that calls BMCs from its
    workers needs more workers than this: a call that finds no slot returns ``Busy`` at
    once, so only calls holding a slot occupy a worker, and one is always left for a host
    whose BMC has room (with fewer workers, slow BMCs hold every worker and a healthy
    host's reboot waits in the queue)."""

    max_in_flight_per_namespace: int = 8
    """BMC calls in flight at once for the hosts of one namespace (one tenant), so that a
    tenant's broken or hostile BMCs cannot take every slot."""

    ca_bundle: str | None = None
    """CA bundle trusted for Redfish BMCs' certificates, besides the system's CAs."""

    allow_insecure_http: bool = False
    """Allow ``redfish+http://`` addresses. Off: credentials are never sent in cleartext
    (anyone who may create a BareMetalHost could otherwise point it at a listener of theirs
    and receive the namespace's BMC password)."""

    allowed_networks: tuple[IpNetwork, ...] = field(default_factory=tuple)
    """If not empty, BMC addresses must resolve into these networks (the BMC management
    networks); any other address is refused on the host before anything is sent."""

    max_response_bytes: int = 1 << 20
    """Largest BMC answer read (Redfish bodies are a few KiB); more is an error, not memory."""

    max_message_chars: int = 500
    """Longest BMC-provided text kept in an error message, status or Event (its start)."""
