"""Which Node is a Machine's? (node-link, where no Cluster API keeps ``status.nodeRef``.)

A Node only through a host the Machine legitimately has (api/links.py, rules 1-4):

- A Machine with ``spec.providerID``: the Node with that providerID, only if the providerID
  is an agreed providerID of the Machine's host (the host of its ``metal3.io/BareMetalHost``
  annotation, in its own namespace; without annotation, the host a namespaced providerID
  names, if in its namespace) and that host's ``spec.consumerRef`` names this Machine.
  Otherwise no nodeRef, and the refusal is reported (only when such a Node exists: a
  Machine whose Node has not registered yet is not an error). A providerID that matches no
  Node does not fall back to the name: a Node of that name is another server.
- A Machine without providerID: the Node named like the Machine. If that Node has a
  providerID, the same confirmation applies to the Node's providerID (a tenant must not
  reach another tenant's Node by naming a Machine after it). A Node without providerID is
  linked by name (it carries no proof either way; docs/security.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from metalmend.api.links import (
    REASON_NODE_OF_ANOTHER_HOST,
    REASON_NOT_CONFIRMED,
    HostFacts,
    HostLink,
    MachineIdentity,
    confirm_provider_id,
    host_key_for_link,
)


@dataclass(frozen=True)
class NodeFacts:
    name: str
    uid: str
    provider_id: str | None


@dataclass(frozen=True)
class NodeLink:
    node_ref: dict[str, str] | None
    refusal: str = ""  # why a Node that would have been linked is not
    reason: str = ""


def _ref(node: NodeFacts) -> dict[str, str]:
    return {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid}


def desired_node_ref(
    machine: MachineIdentity,
    provider_id: str | None,
    link: HostLink,
    hosts: Mapping[str, HostFacts],
    nodes_by_provider: Mapping[str, NodeFacts],
    node_named_like_machine: NodeFacts | None,
) -> NodeLink:
    """``hosts``: the hosts that may be asked (by key); ``nodes_by_provider``: Nodes by
    ``spec.providerID``."""
    if provider_id:
        node = nodes_by_provider.get(provider_id)
        if node is None:
            return NodeLink(None)
        why = _confirm(provider_id, machine, link, hosts)
        return NodeLink(None, why, REASON_NOT_CONFIRMED) if why else NodeLink(_ref(node))
    node = node_named_like_machine
    if node is None:
        return NodeLink(None)
    if not node.provider_id:
        return NodeLink(_ref(node))
    why = _confirm(node.provider_id, machine, link, hosts)
    if why:
        message = f"Node {node.name} is named like this Machine, but {why}"
        return NodeLink(None, message, REASON_NODE_OF_ANOTHER_HOST)
    return NodeLink(_ref(node))


def _confirm(
    provider_id: str, machine: MachineIdentity, link: HostLink, hosts: Mapping[str, HostFacts]
) -> str:
    key = host_key_for_link(machine, link, provider_id)
    return confirm_provider_id(provider_id, machine, hosts.get(key) if key else None, key or None)
