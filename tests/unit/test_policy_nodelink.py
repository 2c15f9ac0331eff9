"""node-link's rules: which Node is a Machine's (only through a host it legitimately has),
and what it writes to ``status.nodeRef`` (never removed because its Node is gone)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from metalmend.api import links, names
from metalmend.api.links import HostFacts, MachineIdentity
from metalmend.policy.decision import Decision
from metalmend.policy.nodelink import (
    Action,
    NodeFacts,
    SetLinkCondition,
    SetNodeRef,
    View,
    decide,
    desired_node_ref,
)

MACHINE = MachineIdentity(namespace="t1", name="m", uid="uid-m", infrastructure_ref={})
CONSUMER = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "name": "m",
            "namespace": "t1", "uid": "uid-m"}  # fmt: skip
UID_H1 = "6f0c2a4e-1b7d-4c39-9a5e-0d8f3b2c1a01"  # a host uid is a UUID (api/links.parse_provider_id)
OWN = {"t1/h1": HostFacts("t1/h1", UID_H1, CONSUMER)}
UNCLAIMED = {"t1/h1": HostFacts("t1/h1", UID_H1, None)}
OTHERS = {"t1/h1": HostFacts("t1/h1", UID_H1, {**CONSUMER, "name": "m2", "uid": "uid-m2"})}


def node(name: str, provider_id: str | None = None) -> NodeFacts:
    return NodeFacts(name=name, uid="u1", provider_id=provider_id)


@pytest.mark.parametrize(
    ("annotation", "provider_id", "hosts", "by_provider", "named", "expected", "reason"),
    [
        pytest.param("t1/h1", "metal3://t1/h1", OWN, {"metal3://t1/h1": node("n1", "metal3://t1/h1")}, None,
                     "n1", "", id="providerID of the Machine's confirmed host"),
        pytest.param(None, "metal3://t1/h1", OWN, {"metal3://t1/h1": node("n1", "metal3://t1/h1")}, None,
                     "n1", "", id="no annotation: the host the providerID names confirms"),
        pytest.param("t1/h1", f"metal3://{UID_H1}", OWN, {f"metal3://{UID_H1}": node("n1", f"metal3://{UID_H1}")}, None,
                     "n1", "", id="legacy providerID through the annotation"),
        pytest.param("t1/h1", "metal3://t1/h1/m3m", OWN, {"metal3://t1/h1/m3m": node("n1")}, None,
                     "n1", "", id="CAPM3 providerID"),
        pytest.param(None, "metal3://lab/worker-2", {}, {"metal3://lab/worker-2": node("worker-2")}, None,
                     None, links.REASON_NOT_CONFIRMED, id="providerID naming another namespace's host"),
        pytest.param("lab/worker-2", "metal3://lab/worker-2", {}, {"metal3://lab/worker-2": node("worker-2")},
                     None, None, links.REASON_NOT_CONFIRMED, id="annotation and providerID of another namespace"),
        pytest.param("t1/h1", "metal3://t1/h2", OWN, {"metal3://t1/h2": node("n2")}, None,
                     None, links.REASON_NOT_CONFIRMED, id="providerID of another host of the namespace"),
        pytest.param("t1/h1", "metal3://t1/h1", UNCLAIMED, {"metal3://t1/h1": node("n1")}, None,
                     None, links.REASON_NOT_CONFIRMED, id="host without consumerRef"),
        pytest.param("t1/h1", "metal3://t1/h1", OTHERS, {"metal3://t1/h1": node("n1")}, None,
                     None, links.REASON_NOT_CONFIRMED, id="host consumed by another Machine"),
        pytest.param("t1/h1", "metal3://t1/h1", {}, {"metal3://t1/h1": node("n1")}, None,
                     None, links.REASON_NOT_CONFIRMED, id="host not found"),
        pytest.param("t1/h1", "test://t1/h1", OWN, {"test://t1/h1": node("n1")}, None,
                     None, links.REASON_NOT_CONFIRMED, id="providerID of another scheme"),
        pytest.param("t1/h1", "metal3://t1/h1", OWN, {}, None,
                     None, "", id="no Node yet: nothing refused"),
        pytest.param("t1/h1", "metal3://t1/h1", OWN, {}, node("m"),
                     None, "", id="providerID without match does not fall back to the name"),
        pytest.param(None, None, {}, {}, node("m"), "m", "", id="no providerID: same name"),
        pytest.param("t1/h1", None, OWN, {}, node("m", "metal3://t1/h1"),
                     "m", "", id="same name, the Node of the confirmed host"),
        pytest.param(None, None, {}, {}, node("m", "metal3://lab/worker-2"),
                     None, links.REASON_NODE_OF_ANOTHER_HOST, id="same name, a Node of another namespace's host"),
        pytest.param("t1/h1", None, OTHERS, {}, node("m", "metal3://t1/h1"),
                     None, links.REASON_NODE_OF_ANOTHER_HOST, id="same name, a Node of another consumer"),
        pytest.param(None, None, {}, {}, None, None, "", id="no Node: no nodeRef"),
    ],
)  # fmt: skip
def test_node_ref(
    annotation: str | None,
    provider_id: str | None,
    hosts: dict[str, HostFacts],
    by_provider: dict[str, NodeFacts],
    named: NodeFacts | None,
    expected: str | None,
    reason: str,
) -> None:
    link = links.machine_host("t1", annotation)
    verdict = desired_node_ref(MACHINE, provider_id, link, hosts, by_provider, named)
    assert (verdict.node_ref or {}).get("name") == expected
    assert verdict.reason == reason
    assert bool(verdict.refusal) == bool(reason)
    if verdict.node_ref:
        assert verdict.node_ref == {
            "apiVersion": "v1",
            "kind": "Node",
            "name": expected,
            "uid": "u1",
        }


# ---- decide: what node-link writes ------------------------------------------------------------

OWN_NODE = node("n1", "metal3://t1/h1")
REF = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"}


def link_view(**changes: object) -> View:
    """Machine t1/m with providerID metal3://t1/h1, confirmed by its host h1; Node n1 found
    and already its nodeRef."""
    base = View(
        machine=MACHINE, key="t1/m", provider_id="metal3://t1/h1",
        link=links.machine_host("t1", "t1/h1"), hosts=OWN,
        nodes_by_provider={"metal3://t1/h1": OWN_NODE}, node_named_like_machine=None,
        node_ref=REF, node_ref_found=True,
    )  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def node_refs(decision: Decision[Action]) -> list[SetNodeRef]:
    return [a for a in decision.actions if isinstance(a, SetNodeRef)]


def conditions(decision: Decision[Action]) -> list[SetLinkCondition]:
    return [a for a in decision.actions if isinstance(a, SetLinkCondition)]


def test_a_linked_machine_writes_nothing() -> None:
    assert node_refs(decide(link_view())) == []


def test_the_node_found_becomes_the_node_ref() -> None:
    assert node_refs(decide(link_view(node_ref=None, node_ref_found=False))) == [SetNodeRef(REF)]


def test_a_node_registered_again_replaces_the_node_ref() -> None:
    """The kubelet registers a new Node object (new uid) after the old one was deleted."""
    old = {**REF, "uid": "u0"}
    assert node_refs(decide(link_view(node_ref=old))) == [SetNodeRef(REF)]


def test_a_node_ref_is_kept_when_its_node_is_deleted() -> None:
    """Cluster API never clears nodeRef: the health check finds the Machine unhealthy at once
    (NodeNotFound) instead of waiting a fresh nodeStartupTimeout."""
    gone = link_view(nodes_by_provider={}, node_ref_found=False)
    assert node_refs(decide(gone)) == []


def test_a_node_ref_to_a_node_that_is_not_the_machines_is_removed() -> None:
    """The Node named exists but the tenancy rules refuse it (its host is another
    Machine's): no nodeRef, and NodeLinkValid=False says why."""
    decision = decide(link_view(hosts=OTHERS))
    assert node_refs(decision) == [SetNodeRef(None)]
    [_, node_link] = conditions(decision)
    assert (node_link.type, node_link.reason) == (
        names.CONDITION_NODE_LINK,
        links.REASON_NOT_CONFIRMED,
    )


def test_a_forged_node_ref_to_an_existing_node_is_removed() -> None:
    forged = {**REF, "name": "victim-node", "uid": "v1"}
    decision = decide(link_view(nodes_by_provider={}, node_ref=forged, node_ref_found=True))
    assert node_refs(decision) == [SetNodeRef(None)]


def test_both_tenancy_conditions_are_decided_every_time() -> None:
    decision = decide(link_view())
    assert conditions(decision) == [
        SetLinkCondition("t1/m", names.CONDITION_HOST_LINK, "", ""),
        SetLinkCondition("t1/m", names.CONDITION_NODE_LINK, "", ""),
    ]
    assert decision.requeue_at is None


def test_set_node_ref_keeps_every_other_status_field() -> None:
    status = {"phase": "Running", "nodeRef": {"name": "old"}}
    assert SetNodeRef(None).to_wire(status) == {"phase": "Running"}
    assert SetNodeRef(REF).to_wire(status) == {"phase": "Running", "nodeRef": REF}
