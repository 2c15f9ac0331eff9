"""OpenShift's links in api/links.py, as tables: the providerIDs OpenShift's metal3 machine
provider writes (``baremetalhost:///<ns>/<host>/<uid>`` and the older form without uid), a
host's consumerRef naming a ``machine.openshift.io`` Machine, and the Node annotation
``machine.openshift.io/machine`` (trusted only when the Machine names the Node back)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from metalmend.api import links, names
from metalmend.api.links import HostFacts, MachineIdentity, ProviderRef

CAPI = MachineIdentity(namespace="t1", name="m1", uid="uid-m1", infrastructure_ref={})
OPENSHIFT = dataclasses.replace(CAPI, group=links.OPENSHIFT_MACHINE_GROUP)


@pytest.mark.parametrize(
    ("provider_id", "expected"),
    [
        pytest.param("baremetalhost:///t1/h1/uid-h1", ProviderRef("t1", "h1", host_uid="uid-h1"),
                     id="OpenShift form with the host uid"),
        pytest.param("baremetalhost:///t1/h1", ProviderRef("t1", "h1"), id="older form"),
        pytest.param("baremetalhost:///t1/h1/u/x", None, id="four parts"),
        pytest.param("baremetalhost:///t1//u", None, id="empty part"),
        pytest.param("baremetalhost:///t1", None, id="one part"),
        pytest.param("baremetalhost:///", None, id="nothing"),
        pytest.param("baremetalhost://t1/h1", None, id="two slashes: a host part, not a path"),
        pytest.param("baremetalhost:////t1/h1", None, id="four slashes"),
    ],
)  # fmt: skip
def test_parse_openshift_provider_id(provider_id: str, expected: ProviderRef | None) -> None:
    assert links.parse_provider_id(provider_id) == expected


@pytest.mark.parametrize(
    ("provider_id", "names_it"),
    [
        pytest.param("baremetalhost:///t1/h1/uid-h1", True, id="name and uid"),
        pytest.param("baremetalhost:///t1/h1/uid-old", False, id="a host of that name, recreated"),
        pytest.param("baremetalhost:///t1/h1", True, id="older form: name only"),
        pytest.param("baremetalhost:///t2/h1/uid-h1", False, id="another namespace, same uid"),
        pytest.param("baremetalhost:///t1/h2/uid-h1", False, id="another host, same uid"),
    ],
)  # fmt: skip
def test_openshift_provider_id_names_host(provider_id: str, names_it: bool) -> None:
    assert links.provider_id_names_host(provider_id, "t1/h1", "uid-h1") is names_it
    host = HostFacts(key="t1/h1", uid="uid-h1", consumer_ref=None)
    assert (links.node_fence_refusal("n1", provider_id, host) == "") is names_it


def test_a_uid_form_needs_the_host_uid() -> None:
    assert not links.provider_id_names_host("baremetalhost:///t1/h1/u", "t1/h1", "")


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
        pytest.param("baremetalhost:///t1/h1/u", None, "baremetalhost:///t1/h1/u", True,
                     id="same providerID"),
        pytest.param("baremetalhost:///t1/h1/u", None, "baremetalhost:///t1/h2/u", False,
                     id="another providerID"),
        pytest.param(None, None, None, False, id="nothing but the Node's word"),
    ],
)  # fmt: skip
def test_node_machine_confirmed(
    node_provider: str | None, node_ref: str | None, machine_provider: str | None, confirmed: bool
) -> None:
    assert (
        links.node_machine_confirmed("n1", node_provider, node_ref, machine_provider) is confirmed
    )
