"""Which Node is a Machine's? (node-link, where no Cluster API keeps ``status.nodeRef``.)

The Node whose ``spec.providerID`` equals the Machine's; failing that, for Machines without
a providerID, the Node named like the Machine. No match: no nodeRef. A Machine whose
providerID matches no Node does not fall back to its name: a Node of the same name with
another providerID is another server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def desired_node_ref(
    machine_provider_id: str | None,
    machine_name: str,
    nodes_by_provider: Mapping[str, Any],
    nodes_by_name: Mapping[str, Any],
) -> dict[str, str] | None:
    node = None
    if machine_provider_id:
        node = nodes_by_provider.get(machine_provider_id)
    else:
        node = nodes_by_name.get(machine_name)
    if node is None:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node.metadata.name,
        "uid": node.metadata.uid,
    }
