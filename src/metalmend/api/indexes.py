"""Every informer index the controllers use: its name and its function, defined once.

Controllers share informers (``Manager.informer`` returns one per kind and scope), so an
index registered by one controller is seen by all the others on that informer: two
controllers naming different functions alike would silently read each other's index.
Defining each index here, as one ``Index`` value pairing the name with the function, makes
that impossible to write, and ``kube.store.Store.add_index`` refuses it at start-up should
it happen anyway.

Names say the kind indexed and the value: ``machines-by-node`` maps a Node name to the
Machines whose ``status.nodeRef`` names it. The functions are pure (api/links.py holds the
tenancy rules several of them apply).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from metalmend.api import links

IndexFunc = Callable[[Any], Iterable[str]]


@dataclass(frozen=True)
class Index:
    """An informer index: ``function(obj)`` lists the values ``name`` finds ``obj`` by."""

    name: str
    function: IndexFunc


def of(*wanted: Index) -> Mapping[str, IndexFunc]:
    """The ``indexes=`` argument of ``Manager.informer`` for these indexes."""
    return {index.name: index.function for index in wanted}


# ---- functions that are not link rules ---------------------------------------------------------


def machine_name(machine: Any) -> list[str]:
    return [machine.metadata.name]


def machine_provider_id(machine: Any) -> list[str]:
    provider = (machine.get("spec") or {}).get("providerID")
    return [provider] if provider else []


def machine_confirming_host(machine: Any) -> list[str]:
    """The host that confirms this Machine's Node (annotation or providerID)."""
    provider = (machine.get("spec") or {}).get("providerID")
    identity = links.machine_identity(machine)
    key = links.host_key_for_link(identity, links.host_link_of(machine), provider)
    return [key] if key else []


def machine_metal3machine(machine: Any) -> list[str]:
    """The Metal3Machine a Cluster API Machine's spec.infrastructureRef names (own namespace)."""
    key = links.metal3machine_key(links.machine_identity(machine))
    return [key] if key else []


def node_provider_id(node: Any) -> list[str]:
    provider = links.node_provider_id(node)
    return [provider] if provider else []


def remediated_node(remediation: Any) -> list[str]:
    """The Node a Metal3Remediation acts on (``status.node``, written once it is known)."""
    node = (remediation.get("status") or {}).get("node")
    return [node] if node else []


def host_uid(host: Any) -> list[str]:
    return [str(host.metadata.uid)] if host.metadata.uid else []


def bmc_secret_of(host: Any) -> list[str]:
    """``namespace/name`` of the BMC Secret a host names, if it names one it may (a Secret of
    its own namespace: a name with a ``/`` reaches nothing)."""
    name = ((host.get("spec") or {}).get("bmc") or {}).get("credentialsName")
    if not name or "/" in name:
        return []
    return [f"{host.metadata.namespace}/{name}"]


# ---- the indexes -------------------------------------------------------------------------------

# Machines (informer shared by node-link, health checks and both remediation controllers)
MACHINES_BY_HOST = Index("machines-by-host", links.host_of)  # the host it may use
MACHINES_BY_CLAIMED_HOST = Index("machines-by-claimed-host", links.claimed_host_of)  # even refused
MACHINES_BY_CONFIRMING_HOST = Index("machines-by-confirming-host", machine_confirming_host)
MACHINES_BY_NODE = Index("machines-by-node", links.node_of)
MACHINES_BY_NAME = Index("machines-by-name", machine_name)
MACHINES_BY_PROVIDER_ID = Index("machines-by-provider-id", machine_provider_id)
MACHINES_BY_METAL3MACHINE = Index("machines-by-metal3machine", machine_metal3machine)

NODES_BY_PROVIDER_ID = Index("nodes-by-provider-id", node_provider_id)

REMEDIATIONS_BY_NODE = Index("metal3-remediations-by-node", remediated_node)

HOSTS_BY_BMC_SECRET = Index("hosts-by-bmc-secret", bmc_secret_of)
# Hosts (informer shared by node-health-check and both remediation controllers): a Node
# without a Machine finds its host by these (api/links.node_host)
HOSTS_BY_NODE = Index("hosts-by-node", links.host_named_node)
HOSTS_BY_UID = Index("hosts-by-uid", host_uid)
