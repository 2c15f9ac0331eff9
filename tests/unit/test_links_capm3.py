"""Cluster API Provider Metal3's links in api/links.py, as tables: a Cluster API Machine
without a host annotation reaches its host through the Metal3Machine its
``spec.infrastructureRef`` names (the annotation CAPM3 puts there, ``HostAnnotation``) or the
providerID ``metal3://<ns>/<host>/<metal3machine>`` (``SetDefaultProviderID``), only a host
of its namespace whose consumerRef names that Metal3Machine."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from metalmend.api import links
from metalmend.api.links import HostFacts, MachineIdentity

M3M_REF = {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Machine",
           "name": "m3m-1"}  # fmt: skip
MACHINE = MachineIdentity(namespace="t1", name="m1", uid="uid-m1", infrastructure_ref=M3M_REF)
CONSUMER = {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Machine",
            "name": "m3m-1", "namespace": "t1"}  # fmt: skip
HOSTS = {
    "t1/h1": HostFacts("t1/h1", "uid-h1", CONSUMER),
    "t1/h2": HostFacts("t1/h2", "uid-h2", {**CONSUMER, "name": "m3m-2"}),
    "t1/h3": HostFacts("t1/h3", "uid-h3", None),
    "t2/h1": HostFacts("t2/h1", "uid-t2h1", {**CONSUMER, "namespace": "t2"}),
}


@pytest.mark.parametrize(
    ("infrastructure_ref", "group", "expected"),
    [
        pytest.param(M3M_REF, links.MACHINE_GROUP, "t1/m3m-1", id="Metal3Machine"),
        pytest.param({**M3M_REF, "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2"},
                     links.MACHINE_GROUP, "t1/m3m-1", id="v1beta2"),
        pytest.param({**M3M_REF, "namespace": "t1"}, links.MACHINE_GROUP, "t1/m3m-1",
                     id="own namespace named"),
        pytest.param({**M3M_REF, "namespace": "t2"}, links.MACHINE_GROUP, None,
                     id="another namespace"),
        pytest.param({**M3M_REF, "kind": "DockerMachine"}, links.MACHINE_GROUP, None,
                     id="another provider"),
        pytest.param({**M3M_REF, "apiVersion": "example.com/v1"}, links.MACHINE_GROUP, None,
                     id="another group"),
        pytest.param({**M3M_REF, "name": ""}, links.MACHINE_GROUP, None, id="no name"),
        pytest.param({}, links.MACHINE_GROUP, None, id="none"),
        pytest.param(M3M_REF, links.OPENSHIFT_MACHINE_GROUP, None, id="an OpenShift Machine"),
    ],
)  # fmt: skip
def test_metal3machine_key(
    infrastructure_ref: dict[str, Any], group: str, expected: str | None
) -> None:
    machine = dataclasses.replace(MACHINE, infrastructure_ref=infrastructure_ref, group=group)
    assert links.metal3machine_key(machine) == expected


@pytest.mark.parametrize(
    ("on_metal3machine", "provider_id", "expected"),
    [
        pytest.param("t1/h1", None, "t1/h1", id="CAPM3's annotation, confirmed"),
        pytest.param("h1", None, "t1/h1", id="bare host name: own namespace"),
        pytest.param("t1/h2", None, None, id="host consumed by another Metal3Machine"),
        pytest.param("t1/h3", None, None, id="host consumed by nothing"),
        pytest.param("t1/h9", None, None, id="host not found"),
        pytest.param("t2/h1", None, None, id="host of another namespace"),
        pytest.param("t1/h1/x", None, None, id="malformed annotation"),
        pytest.param(None, "metal3://t1/h1/m3m-1", "t1/h1", id="providerID, confirmed"),
        pytest.param(None, "metal3://t1/h1/m3m-2", None,
                     id="providerID of another Metal3Machine"),
        pytest.param(None, "metal3://t1/h2/m3m-1", None,
                     id="providerID of a host consumed by another"),
        pytest.param(None, "metal3://t2/h1/m3m-1", None, id="providerID of another namespace"),
        pytest.param(None, "metal3://t1/h1", None, id="metalmend's form names no Metal3Machine"),
        pytest.param(None, "metal3://uid-h1", None, id="legacy uid form"),
        pytest.param(None, "baremetalhost:///t1/h1/uid-h1", None, id="OpenShift's form"),
        pytest.param("t2/h1", "metal3://t1/h1/m3m-1", None,
                     id="a refused annotation is not overridden by the providerID"),
        pytest.param(None, None, None, id="nothing"),
    ],
)  # fmt: skip
def test_capm3_host(
    on_metal3machine: str | None, provider_id: str | None, expected: str | None
) -> None:
    assert links.capm3_host(MACHINE, on_metal3machine, provider_id, HOSTS.get) == expected


def test_capm3_host_needs_a_metal3machine_reference() -> None:
    docker = dataclasses.replace(MACHINE, infrastructure_ref={**M3M_REF, "kind": "DockerMachine"})
    assert links.capm3_host(docker, "t1/h1", "metal3://t1/h1/m3m-1", HOSTS.get) is None
    # rule 2 as for any Machine: a consumerRef naming the Machine itself confirms it too
    machine_consumer = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "name": "m1"}
    hosts = {"t1/h1": HostFacts("t1/h1", "uid-h1", machine_consumer)}
    assert links.capm3_host(MACHINE, "t1/h1", None, hosts.get) == "t1/h1"
