"""A BareMetalHost's BMC as the pool reaches it: the one adapter from a host object to a
``BmcTarget`` (host-power, the remediation's own power reads, and destroy).

The host's ``spec.bmc`` is read here and nowhere else: its address (``address.parse``:
a malformed one is ``BadAddress``, raised before any Secret is looked at), the name of its
credentials Secret, and ``disableCertificateVerification``. The credentials come from a
``CredentialStore`` with the checks of docs/security.md (labelled, bound to this host, in
the host's namespace): a cache of Secrets in ``metalmend run``, or the one Secret just read
in ``metalmend serve`` (``credentials.lookup_read``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from metalmend.bmc.address import BmcAddress, parse
from metalmend.bmc.credentials import CredentialStore
from metalmend.bmc.pool import BmcTarget, Credentials


@dataclass(frozen=True)
class HostBmc:
    """What a host's ``spec.bmc`` says, its address already parsed."""

    namespace: str
    name: str
    address: BmcAddress
    credentials_name: Any  # spec.bmc.credentialsName as written (checked by the lookup)
    verify_certificates: bool

    def target(self, credentials: Credentials, *, in_line: bool = True) -> BmcTarget:
        """The target with ``credentials`` (looked up for this host). ``in_line``: a call
        turned away from a busy endpoint keeps its place in its namespace's line under the
        host's key (``BmcTarget.waiter``); False for callers that nobody wakes."""
        return BmcTarget(
            self.address,
            credentials,
            verify_certificates=self.verify_certificates,
            namespace=self.namespace,
            waiter=f"{self.namespace}/{self.name}" if in_line else "",
        )


def host_bmc(host: Any) -> HostBmc:
    """The host's ``spec.bmc``; ``BadAddress`` when its address is missing or malformed."""
    bmc = (host.get("spec") or {}).get("bmc") or {}
    address = parse(bmc.get("address") or "")
    return HostBmc(
        namespace=str(host.metadata.namespace),
        name=str(host.metadata.name),
        address=address,
        credentials_name=bmc.get("credentialsName"),
        verify_certificates=not bmc.get("disableCertificateVerification", False),
    )


def target_for_host(host: Any, credentials: CredentialStore) -> BmcTarget:
    """The host's BMC and its credentials from ``credentials``: ``BadAddress`` or
    ``CredentialsError`` (saying why: not set, outside the namespace, not found or not
    labelled, not bound to this host) when it cannot be reached."""
    bmc = host_bmc(host)
    return bmc.target(credentials.lookup(bmc.namespace, bmc.name, bmc.credentials_name))
