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

And what it does with ``status.nodeRef`` (``decide``, in the decide/act shape of
docs/decide-act.md): it is set to the Node found, replaced when another Node is found (a
Node registered again has a new uid), and removed when the Node it names exists but is not
this Machine's (refused by the rules above, or no longer matching). It is **never removed
because its Node is gone**: Cluster API never clears nodeRef either, and the health check
finds a Machine whose nodeRef names a deleted Node unhealthy at once (Cluster API's
MachineHealthCheck, ``NodeNotFound``), the same with node-link running or Cluster API
owning nodeRef. (Removing it would make the Machine wait a fresh ``nodeStartupTimeout``,
forever with ``nodeStartupTimeout: 0``.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from metalmend.api import names
from metalmend.api.links import (
    REASON_NODE_OF_ANOTHER_HOST,
    REASON_NOT_CONFIRMED,
    HostFacts,
    HostLink,
    MachineIdentity,
    confirm_provider_id,
    host_key_for_link,
)
from metalmend.policy.decision import Decision
from metalmend.policy.decision import Event as Event  # one of this policy's actions
from metalmend.policy.tenancy import SetLinkCondition as SetLinkCondition  # an action here too


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


# ---- the decision: what node-link writes ----------------------------------------------------


@dataclass(frozen=True)
class View:
    """One Machine and what its nodeRef rule reads, from the caches."""

    machine: MachineIdentity
    key: str  # "namespace/name" of the Machine
    provider_id: str | None  # spec.providerID
    link: HostLink  # its metal3.io/BareMetalHost annotation, as the tenancy rules read it
    hosts: Mapping[str, HostFacts]  # the host the rules may ask (by key), if found
    nodes_by_provider: Mapping[str, NodeFacts]  # Nodes with the Machine's providerID
    node_named_like_machine: NodeFacts | None
    node_ref: Mapping[str, Any] | None  # status.nodeRef as written (None: absent)
    node_ref_found: bool  # a Node of the name status.nodeRef gives is in the cache


@dataclass(frozen=True)
class SetNodeRef:
    """Make ``status.nodeRef`` this reference (None removes it); every other status field is
    kept (``to_wire``)."""

    node_ref: Mapping[str, str] | None

    def to_wire(self, status: Mapping[str, Any]) -> dict[str, Any]:
        result = dict(status)
        if self.node_ref is None:
            result.pop("nodeRef", None)
        else:
            result["nodeRef"] = dict(self.node_ref)
        return result


Action = SetLinkCondition | SetNodeRef | Event


def decide(view: View) -> Decision[Action]:
    """The Machine's two tenancy conditions, then its nodeRef. No deadline: only a watched
    object (Machine, Node, host) can change the answer."""
    verdict = desired_node_ref(
        view.machine, view.provider_id, view.link, view.hosts, view.nodes_by_provider,
        view.node_named_like_machine,
    )  # fmt: skip
    decision: Decision[Action] = Decision()
    decision.do(
        SetLinkCondition(view.key, names.CONDITION_HOST_LINK, view.link.refusal,
                         view.link.reason),
        SetLinkCondition(view.key, names.CONDITION_NODE_LINK, verdict.refusal, verdict.reason),
    )  # fmt: skip
    wanted = verdict.node_ref
    if wanted == view.node_ref:
        return decision
    named = (view.node_ref or {}).get("name")
    if wanted is None and named and not view.node_ref_found:
        return decision  # its Node is gone: kept, as Cluster API keeps it (module docstring)
    return decision.do(SetNodeRef(wanted))
