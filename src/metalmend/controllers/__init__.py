"""The controllers ``metalmend run`` can start, by name.

Each entry wires one controller into a Manager: it asks the manager for the informers it
needs and adds its Controller. Controllers arrive with their issues; until then ``run``
syncs nothing and serves health.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from metalmend.kube.manager import Manager


@dataclass(frozen=True)
class RunOptions:
    """Options every controller may read (filled from the command line)."""

    namespace: str | None = None  # None: all namespaces
    # Namespaces whose BMC Secrets host-power may read (cached, labelled ones only), when
    # ``namespace`` is not set: empty means all namespaces (cluster-wide list/watch).
    secret_namespaces: tuple[str, ...] = ()
    bmc_ca_bundle: str | None = None  # trusted for Redfish BMCs, besides the system's CAs
    bmc_timeout: float = 30.0
    # Where BMC credentials may be sent (bmc.address.check_allowed): redfish+http only if
    # allowed; when networks are listed, only to BMC addresses inside them.
    bmc_allow_insecure_http: bool = False
    bmc_allowed_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    soft_power_off_timeout: float = 180.0
    power_poll_interval: float = 20.0
    # Remediation: how a Node is fenced once its host is off, and the first wait after a
    # failed attempt (it doubles with every failure).
    fence_method: Literal["delete-node", "out-of-service-taint"] = "delete-node"
    remediation_retry_base: float = 30.0
    # How a MachineHealthCheck without a remediationTemplate asks for remediation when it
    # does not say (annotation metalmend.dev/request-remediation-by): "conditions" (Cluster
    # API) or "annotation" (host.metal3.io/external-remediation, metal3's annotation-based
    # remediation design).
    request_remediation_by: Literal["conditions", "annotation"] = "conditions"


Setup = Callable[[Manager, RunOptions], None]
