"""OpenShift's links in api/links.py, as tables: a host's consumerRef naming a
``machine.openshift.io`` Machine, and the Node annotation ``machine.openshift.io/machine``
(trusted only when the Machine names the Node back). The providerIDs OpenShift's metal3
machine provider writes are in test_links.py's one table of providerIDs."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from metalmend.api import links, names
from metalmend.api.links import HostFacts, MachineIdentity, NodeMachine

CAPI = MachineIdentity(namespace="t1", name="m1", uid="uid-m1", infrastructure_ref={})
OPENSHIFT = dataclasses.replace(CAPI, group=links.OPENSHIFT_MACHINE_GROUP)
UID = "6f0c2a4e-1b7d-4c39-9a5e-0d8f3b2c1a01"


def _consumer(api_version: str, name: str = "m1", uid: str = "uid-m1") -> dict[str, str]:
    return {"apiVersion": api_version, "kind": "Machine", "name": name, "namespace": "t1",
            "uid": uid}  # fmt: skip


@pytest.mark.parametrize(
    ("machine", "consumer_ref", "expected"),
    [
        pytest.param(OPENSHIFT, _consumer("machine.openshift.io/v1beta1"), "confirmed",
                     id="OpenShift Machine, its own group"),
        pytest.param(OPENSHIFT, _consumer("machine.openshift.io/v1beta1", uid="u0"), "other",
                     id="OpenShift Machine recreated"),
        pytest.param(OPENSHIFT, _consumer("machine.openshift.io/v1beta1", name="m2"), "other",
                     id="another OpenShift Machine"),
        pytest.param(OPENSHIFT, _consumer("cluster.x-k8s.io/v1beta1"), "other",
                     id="a Cluster API Machine of the same name"),
        pytest.param(CAPI, _consumer("machine.openshift.io/v1beta1"), "other",
                     id="Cluster API Machine, OpenShift consumer of the same name"),
        pytest.param(CAPI, _consumer("cluster.x-k8s.io/v1beta2"), "confirmed",
                     id="Cluster API Machine, its own group"),
    ],
)  # fmt: skip
def test_consumer_of_by_machine_group(
    machine: MachineIdentity, consumer_ref: dict[str, str], expected: str
) -> None:
    assert links.consumer_of(consumer_ref, "t1", machine) == expected


@pytest.mark.parametrize(
    ("api_version", "group"),
    [
        ("machine.openshift.io/v1beta1", links.OPENSHIFT_MACHINE_GROUP),
        ("cluster.x-k8s.io/v1beta1", links.MACHINE_GROUP),
        ("cluster.x-k8s.io/v1beta2", links.MACHINE_GROUP),
        (None, links.MACHINE_GROUP),
        ("example.com/v1", links.MACHINE_GROUP),
    ],
)
def test_machine_group(api_version: str | None, group: str) -> None:
    machine: Any = SimpleNamespace(apiVersion=api_version)
    assert links.machine_group(machine) == group


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ("openshift-machine-api/worker-0", "openshift-machine-api/worker-0"),
        (" t1/m1 ", "t1/m1"),
        ("m1", None),
        ("t1/m1/x", None),
        ("/m1", None),
        ("", None),
        (None, None),
    ],
)
def test_node_machine_key(value: str | None, key: str | None) -> None:
    annotations = {} if value is None else {names.OPENSHIFT_NODE_MACHINE: value}
    assert links.node_machine_key(annotations) == key


@pytest.mark.parametrize(
    ("node_provider", "node_ref", "machine_provider", "confirmed"),
    [
        pytest.param(None, "n1", None, True, id="the Machine's nodeRef names the Node"),
        pytest.param(None, "n2", None, False, id="its nodeRef names another Node"),
        pytest.param(f"baremetalhost:///t1/h1/{UID}", None, f"baremetalhost:///t1/h1/{UID}", True,
                     id="same providerID, carrying a host's uid"),
        pytest.param(f"baremetalhost:///t1/h1/{UID}", None, f"baremetalhost:///t1/h2/{UID}", False,
                     id="another providerID"),
        pytest.param("baremetalhost:///t1/h1", None, "baremetalhost:///t1/h1", False,
                     id="same providerID without uid: a kubelet can guess it"),
        pytest.param("metal3://t1/h1", None, "metal3://t1/h1", False,
                     id="same metal3 providerID without uid"),
        pytest.param("baremetalhost:///t1/h1", "n1", None, True,
                     id="nodeRef, whatever the providerID"),
        pytest.param(f"baremetalhost:///t1/h1/{UID}", "n2", f"baremetalhost:///t1/h1/{UID}", False,
                     id="same providerID, but the nodeRef names another Node"),
        pytest.param(None, None, None, False, id="nothing but the Node's word"),
    ],
)  # fmt: skip
def test_node_machine_confirmed(
    node_provider: str | None, node_ref: str | None, machine_provider: str | None, confirmed: bool
) -> None:
    assert (
        links.node_machine_confirmed("n1", node_provider, node_ref, machine_provider) is confirmed
    )


# ---- a Node's host through the OpenShift Machine its annotation names ----------------------

W = MachineIdentity("t1", "worker-0", "uid-w0", {}, group=links.OPENSHIFT_MACHINE_GROUP)
OWN = {"apiVersion": "machine.openshift.io/v1beta1", "kind": "Machine", "name": "worker-0",
       "namespace": "t1", "uid": "uid-w0"}  # fmt: skip
H1 = HostFacts("t1/h1", UID, OWN)
H2 = HostFacts("t1/h2", "6f0c2a4e-1b7d-4c39-9a5e-0d8f3b2c1a02", None)
P1 = f"baremetalhost:///t1/h1/{UID}"


def _machine(**changes: Any) -> NodeMachine:
    base = NodeMachine(W, "t1/h1", P1, "n1")
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    ("node_provider", "machine", "hosts", "host", "problem"),
    [
        pytest.param(P1, _machine(), [H1], "t1/h1", "", id="OpenShift as it links them"),
        pytest.param(None, _machine(), [H1], "t1/h1", "", id="a Node without providerID, named back"),
        pytest.param(P1, _machine(node_ref=None), [H1], "t1/h1", "",
                     id="no nodeRef yet, the same providerID with the host's uid"),
        pytest.param("baremetalhost:///t1/h1", _machine(node_ref=None, provider_id="baremetalhost:///t1/h1"),
                     [H1], None, "does not name the Node back", id="the same guessable providerID"),
        pytest.param(P1, _machine(node_ref="n2"), [H1], None, "does not name the Node back",
                     id="the Machine is another Node's"),
        pytest.param(P1, None, [H1], None, "which does not exist", id="no such Machine"),
        pytest.param(P1, _machine(identity=dataclasses.replace(W, group=links.MACHINE_GROUP)), [H1],
                     None, "which does not exist", id="a Cluster API Machine of that name"),
        pytest.param(P1, _machine(host_annotation="t2/h1"), [H1], None, "in another namespace",
                     id="its host in another namespace"),
        pytest.param(None, _machine(host_annotation=None, provider_id=None), [H1], None,
                     "names no host", id="the Machine names no host"),
        pytest.param(P1, _machine(), [], None, "host t1/h1 not found", id="host not found"),
        pytest.param(P1, _machine(), [dataclasses.replace(H1, consumer_ref=None)], None,
                     "does not confirm this Machine", id="the host is nobody's"),
        pytest.param(None, _machine(provider_id=None), [dataclasses.replace(H1, consumer_ref=None)],
                     None, "does not confirm that Machine", id="the host is nobody's, no providerID"),
        pytest.param(P1, _machine(), [dataclasses.replace(H1, consumer_ref={**OWN, "uid": "old"})],
                     None, "does not confirm this Machine", id="the host's consumer, made again"),
        pytest.param(P1, _machine(provider_id=f"baremetalhost:///t1/h1/{H2.uid}"), [H1], None,
                     "not an agreed providerID", id="the Machine's providerID, another host's uid"),
        pytest.param(f"baremetalhost:///t1/h2/{H2.uid}", _machine(), [H1, H2], None,
                     "not a Node of host t1/h1", id="the Node's providerID names another host"),
        pytest.param("aws:///eu-west-1a/i-0123", _machine(), [H1], None, "not a Node of host t1/h1",
                     id="the Node of another provider"),
    ],
)  # fmt: skip
def test_node_host_through_machine(
    node_provider: str | None,
    machine: NodeMachine | None,
    hosts: list[HostFacts],
    host: str | None,
    problem: str,
) -> None:
    known = {h.key: h for h in hosts}
    found = links.node_host_through_machine("n1", node_provider, "t1/worker-0", machine, known.get)
    assert found.key == host
    assert problem in found.problem
    assert bool(found.problem) is (host is None)
    if problem:
        assert "Node n1 names Machine t1/worker-0 (machine.openshift.io/machine)" in found.problem


NONE = links.NodeHost(None, "no BareMetalHost names Node n1")
VIA_NONE = links.NodeHost(None, "Machine does not name the Node back")


@pytest.mark.parametrize(
    ("direct", "via", "naming", "host", "problem"),
    [
        pytest.param(NONE, None, [], None, "no BareMetalHost", id="no annotation: the hosts' word"),
        pytest.param(NONE, links.NodeHost("t1/h1"), [], "t1/h1", "", id="found only through the Machine"),
        pytest.param(links.NodeHost("t1/h1"), VIA_NONE, [H1], "t1/h1", "",
                     id="a bad annotation cannot opt a confirmed Node out"),
        pytest.param(links.NodeHost("t1/h1"), links.NodeHost("t1/h1"), [H1], "t1/h1", "",
                     id="both, the same host"),
        pytest.param(links.NodeHost("t1/h2"), links.NodeHost("t1/h1"), [H2], None, "neither is trusted",
                     id="both, two hosts"),
        pytest.param(NONE, VIA_NONE, [], None, "does not name the Node back",
                     id="neither: the Machine's refusal said"),
        pytest.param(links.NodeHost(None, "hosts t1/h1, t1/h2 all name Node n1"), links.NodeHost("t1/h1"),
                     [H1, H2], None, "host t1/h2 names the Node", id="another host names the Node too"),
    ],
)  # fmt: skip
def test_node_host_confirmed(
    direct: links.NodeHost,
    via: links.NodeHost | None,
    naming: list[HostFacts],
    host: str | None,
    problem: str,
) -> None:
    key = "t1/worker-0" if via is not None else None
    found = links.node_host_confirmed("n1", direct, key, via, naming)
    assert found.key == host
    assert problem in found.problem
