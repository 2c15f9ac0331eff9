"""node-link's rule: which Node is a Machine's (only through a host it legitimately has)."""

from __future__ import annotations

import pytest

from metalmend.api import links
from metalmend.api.links import HostFacts, MachineIdentity
from metalmend.policy.nodelink import NodeFacts, desired_node_ref

MACHINE = MachineIdentity(namespace="t1", name="m", uid="uid-m", infrastructure_ref={})
CONSUMER = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "name": "m",
            "namespace": "t1", "uid": "uid-m"}  # fmt: skip
OWN = {"t1/h1": HostFacts("t1/h1", "uid-h1", CONSUMER)}
UNCLAIMED = {"t1/h1": HostFacts("t1/h1", "uid-h1", None)}
OTHERS = {"t1/h1": HostFacts("t1/h1", "uid-h1", {**CONSUMER, "name": "m2", "uid": "uid-m2"})}


def node(name: str, provider_id: str | None = None) -> NodeFacts:
    return NodeFacts(name=name, uid="u1", provider_id=provider_id)


@pytest.mark.parametrize(
    ("annotation", "provider_id", "hosts", "by_provider", "named", "expected", "reason"),
    [
        pytest.param("t1/h1", "metal3://t1/h1", OWN, {"metal3://t1/h1": node("n1", "metal3://t1/h1")}, None,
                     "n1", "", id="providerID of the Machine's confirmed host"),
        pytest.param(None, "metal3://t1/h1", OWN, {"metal3://t1/h1": node("n1", "metal3://t1/h1")}, None,
                     "n1", "", id="no annotation: the host the providerID names confirms"),
        pytest.param("t1/h1", "metal3://uid-h1", OWN, {"metal3://uid-h1": node("n1", "metal3://uid-h1")}, None,
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
