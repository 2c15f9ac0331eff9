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

    # -- which BMC certificates are trusted, and for which bindings (docs/security.md) --
    allow_disable_certificate_verification: bool = False
    """Honour ``spec.bmc.disableCertificateVerification`` on hosts whose Secret binds them
    by name. Off: such a host is refused before anything is sent. Without a certificate
    check, whoever may create or edit a host bound to a Secret can name a listener of
    theirs with a self-signed certificate and receive that Secret's password; allow it
    only where every such person may know the password anyway. Never honoured for a
    Secret bound with ``*``."""

    trust_system_cas: bool = False
    """Trust the system's CA store for BMC certificates, besides ``ca_bundle``. Off: only
    ``ca_bundle``. A public CA vouches only that someone owns a name; anyone who may create
    a host could name a server of theirs with such a certificate and receive a password.
    Turn it on only when the BMCs carry certificates of public CAs and the hosts' creators
    are trusted. Never used for a Secret bound with ``*``."""
