"""When a Node may be removed from the cluster, which labels clear-labels removes and when
the pods have settled after it, decided purely (docs/teardown.md).

Airship's node teardown spec ("Promenade Delete Node from Cluster", airship-specs
``specs/approved/workflow_node-teardown.rst``): the Node must be cordoned, drained, and
carry no label other than ``promenade-decomission``; otherwise 409 Conflict. "Drained"
means what the drain step leaves: no pod that the drain would evict (DaemonSet and mirror
pods may stay, as after ``kubectl drain --ignore-daemonsets``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from metalmend.teardown.policy.drain import Disposition, PodFacts, Requirement, disposition
from metalmend.teardown.policy.settings import DECOMMISSION_LABEL


@dataclass(frozen=True)
class NodeFacts:
    name: str
    uid: str
    cordoned: bool
    labels: Mapping[str, str]


def labels_to_clear(labels: Mapping[str, str]) -> list[str]:
    """Every label but ``promenade-decomission``: the spec's clear-labels "removes the labels
    that have been added to the node", and removal then accepts that one alone. The
    kubelet's own labels (``kubernetes.io/hostname``...) go too; it sets them again only
    when it registers anew."""
    return sorted(key for key in labels if key != DECOMMISSION_LABEL)


def removal_conflicts(node: NodeFacts, pods: Sequence[PodFacts]) -> list[str]:
    """Why ``node`` may not be deleted yet, one line each; empty when it may."""
    problems = []
    if not node.cordoned:
        problems.append(f"Node {node.name} is not cordoned: drain it first")
    for pod in pods:
        if disposition(pod)[0] is Disposition.EVICT:
            problems.append(f"Node {node.name} is not drained: pod {pod.key} is still on it")
    for key in labels_to_clear(node.labels):
        problems.append(f"Node {node.name} still has the label {key}: clear its labels first")
    return problems


def fits(pod: PodFacts, node: str, labels: Mapping[str, str]) -> bool:
    """Whether the Node (``node``, with ``labels``) still satisfies the pod's nodeSelector
    and required node affinity, as the scheduler and the DaemonSet controller read them."""
    if any(labels.get(key) != value for key, value in pod.node_selector):
        return False
    if pod.node_affinity is None:
        return True
    # Terms are alternatives; a term without requirements matches no Node.
    return any(
        term and all(_satisfied(r, node, labels) for r in term) for term in pod.node_affinity
    )


def _satisfied(requirement: Requirement, node: str, labels: Mapping[str, str]) -> bool:
    value = node if requirement.field else labels.get(requirement.key)
    if requirement.field and requirement.key != "metadata.name":
        return False
    match requirement.operator:
        case "In":
            return value is not None and value in requirement.values
        case "NotIn":
            return value is None or value not in requirement.values
        case "Exists":
            return value is not None
        case "DoesNotExist":
            return value is None
        case "Gt" | "Lt":
            try:
                have, bound = int(value or ""), int(requirement.values[0])
            except (ValueError, IndexError):
                return False
            return have > bound if requirement.operator == "Gt" else have < bound
        case _:
            return False


def _misplaced(node: str, labels: Mapping[str, str], pods: Sequence[PodFacts]) -> list[PodFacts]:
    return [
        pod
        for pod in pods
        if not pod.mirror
        and pod.phase not in ("Succeeded", "Failed")
        and not fits(pod, node, labels)
    ]


def unsettled(node: str, labels: Mapping[str, str], pods: Sequence[PodFacts]) -> list[str]:
    """The pods clear-labels waits for, one line each: DaemonSet pods that no longer fit
    the Node, which their controller removes. Mirror and finished pods are not waited
    for."""
    return [
        f"pod {pod.key} (DaemonSet {pod.controller_name}) no longer fits the Node's labels"
        f" and is {'being removed' if pod.deleting else 'still there'}"
        for pod in _misplaced(node, labels, pods)
        if pod.controller_kind == "DaemonSet"
    ]


def stranded(node: str, labels: Mapping[str, str], pods: Sequence[PodFacts]) -> list[str]:
    """Other pods that no longer fit the Node: nothing moves a running pod whose node
    selector stops matching (IgnoredDuringExecution), so they are named, not waited for."""
    return [
        f"pod {pod.key} no longer fits the Node's labels but keeps running: drain the Node to"
        " move it"
        for pod in _misplaced(node, labels, pods)
        if pod.controller_kind != "DaemonSet"
    ]
