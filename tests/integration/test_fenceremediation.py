"""FenceRemediation on the real API server, created as the health checkers create it:
Cluster API's MachineHealthCheck (named after the Machine, owned by it) and medik8s
NodeHealthCheck (``generateName`` + the node-name annotation, owned by the cluster-scoped
NodeHealthCheck). The test plays host-power, as tests/integration/test_remediation.py does."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_global_resource
from lightkube.models.apiextensions_v1 import (
    CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec,
    CustomResourceDefinitionVersion,
    CustomResourceValidation,
    JSONSchemaProps,
)
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.resources import (
    BareMetalHost,
    FenceRemediation,
    FenceRemediationTemplate,
    Machine,
    MachineHealthCheck,
)
from metalmend.controllers import fenceremediation, healthcheck
from metalmend.policy import fenceremediation as fence
from tests.integration.test_remediation import (
    Controllers,
    World,
    _has,
    _is_none,
    _lacks,
    controllers,
    key_of,
    world,
)
from tests.support import reconciles, until

__all__ = ["controllers", "world"]  # the fixtures, shared with test_remediation

NodeHealthCheck = create_global_resource(
    "remediation.medik8s.io", "v1alpha1", "NodeHealthCheck", "nodehealthchecks"
)

# the hosts' word on their Node counts only while its writers are guarded (api/links.node_host)
pytestmark = pytest.mark.usefixtures("node_names_guarded")


@pytest.fixture
async def nhc(aclient: AsyncClient, namespace: str) -> AsyncIterator[Any]:
    """A NodeHealthCheck to own the remediation (its CRD reduced to what an owner needs:
    the garbage collector must find the owner, or it deletes what it owns)."""
    crd = CustomResourceDefinition(
        metadata=ObjectMeta(name="nodehealthchecks.remediation.medik8s.io"),
        spec=CustomResourceDefinitionSpec(
            group="remediation.medik8s.io",
            names=CustomResourceDefinitionNames(
                kind="NodeHealthCheck", plural="nodehealthchecks", singular="nodehealthcheck"
            ),
            scope="Cluster",
            versions=[
                CustomResourceDefinitionVersion(
                    name="v1alpha1",
                    served=True,
                    storage=True,
                    schema=CustomResourceValidation(
                        openAPIV3Schema=JSONSchemaProps(
                            type="object", x_kubernetes_preserve_unknown_fields=True
                        )
                    ),
                )
            ],
        ),
    )
    with contextlib.suppress(ApiError):
        await aclient.create(crd)

    async def established() -> bool:
        got = await aclient.get(CustomResourceDefinition, crd.metadata.name)
        conditions = (got.status.conditions if got.status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    await until(established)
    owner = await aclient.create(
        NodeHealthCheck(metadata=ObjectMeta(name=f"nhc-{namespace}"), spec={"selector": {}})
    )
    yield owner
    with contextlib.suppress(ApiError):
        await aclient.delete(NodeHealthCheck, owner.metadata.name)


def spec() -> dict[str, Any]:
    # spec.template.spec of a FenceRemediationTemplate, as the health checker copies it
    return {"strategy": "reboot", "powerOffTimeoutSeconds": 30, "powerOnTimeoutSeconds": 60}


async def capi_shaped(world: World, machine: Any) -> Any:
    """What Cluster API's MachineHealthCheck creates: the Machine's name, its namespace,
    an owner reference to the Machine."""
    owner = OwnerReference(
        apiVersion="cluster.x-k8s.io/v1beta1", kind="Machine",
        name=machine.metadata.name, uid=machine.metadata.uid,
    )  # fmt: skip
    return await world.client.create(
        FenceRemediation(
            metadata=ObjectMeta(name=machine.metadata.name, ownerReferences=[owner]), spec=spec()
        ),
        namespace=world.ns,
    )


async def nhc_shaped(world: World, nhc: Any, node: str) -> Any:
    """What NodeHealthCheck creates with multiple-templates support: generateName, the
    node-name annotation, an owner reference to the NodeHealthCheck."""
    owner = OwnerReference(
        apiVersion="remediation.medik8s.io/v1alpha1", kind="NodeHealthCheck",
        name=nhc.metadata.name, uid=nhc.metadata.uid,
    )  # fmt: skip
    meta = ObjectMeta(
        generateName="fence-",
        annotations={names.NHC_NODE_NAME: node},
        ownerReferences=[owner],
    )
    return await world.client.create(
        FenceRemediation(metadata=meta, spec=spec()), namespace=world.ns
    )


async def conditions_of(world: World, name: str) -> dict[str, str]:
    obj = await world.get(FenceRemediation, name)
    found = ((obj.get("status") or {}) if obj else {}).get("conditions") or []
    return {c["type"]: c["status"] for c in found}


def conditions_are(world: World, name: str, **expected: str) -> Any:
    async def check() -> bool:
        found = await conditions_of(world, name)
        return all(found.get(k) == v for k, v in expected.items())

    return check


def phase_of(world: World, name: str, phase: str) -> Any:
    async def check() -> bool:
        obj = await world.get(FenceRemediation, name)
        return bool(obj) and (obj.get("status") or {}).get("phase") == phase

    return check


P, S, D = fence.PROCESSING, fence.SUCCEEDED, fence.PERMANENT_NODE_DELETION


async def test_machine_health_check_shaped_is_fenced_first_and_reports_success(
    world: World, controllers: Controllers
) -> None:
    await controllers.start(fenceremediation.setup)
    machine = await world.machine("m1")
    obj = await capi_shaped(world, machine)
    key = key_of(obj)

    await until(lambda: _has(world.host_annotations("host-m1"), key))
    await until(conditions_are(world, "m1", **{P: "True", S: "Unknown", D: "False"}))
    got = await world.get(FenceRemediation, "m1")
    assert names.REMEDIATION_FINALIZER in got.metadata.finalizers
    assert await world.node_obj("m1") is not None, "no fencing before the host is reported off"

    await world.power("host-m1", on=False)
    await until(lambda: _is_none(world.node_obj("m1")))
    await until(phase_of(world, "m1", "power-on"))
    await until(lambda: _lacks(world.host_annotations("host-m1"), key))

    await world.power("host-m1", on=True)
    await world.node("m1")
    await until(phase_of(world, "m1", "waiting"))
    await until(conditions_are(world, "m1", **{P: "False", S: "True", D: "False"}))
    # nothing changed: a reconcile (woken by the Node) writes nothing
    version = (await world.get(FenceRemediation, "m1")).metadata.resourceVersion
    before = reconciles("fence-remediation")
    await world.client.patch(
        Node, world.node_name("m1"), {"metadata": {"labels": {"poke": "1"}}},
        patch_type=PatchType.MERGE,
    )  # fmt: skip
    await until(lambda: reconciles("fence-remediation") > before)
    assert (await world.get(FenceRemediation, "m1")).metadata.resourceVersion == version

    await world.client.delete(FenceRemediation, "m1", namespace=world.ns)  # healthy again
    await until(lambda: _is_none(world.get(FenceRemediation, "m1")))


async def test_node_health_check_shaped_survives_a_controller_kill(
    world: World, controllers: Controllers, nhc: Any
) -> None:
    await controllers.start(fenceremediation.setup)
    await world.machine("m1")
    obj = await nhc_shaped(world, nhc, world.node_name("m1"))
    name, key = obj.metadata.name, key_of(obj)
    assert name != world.node_name("m1")  # generated: the annotation names the Node

    await until(lambda: _has(world.host_annotations("host-m1"), key))
    await controllers.kill()
    await world.power("host-m1", on=False)  # the host goes off while nobody watches
    await controllers.start(fenceremediation.setup)
    await until(phase_of(world, name, "power-on"))
    assert await world.node_obj("m1") is None
    await controllers.kill()
    await world.power("host-m1", on=True)
    await world.node("m1")
    await controllers.start(fenceremediation.setup)
    await until(phase_of(world, name, "waiting"))
    await until(conditions_are(world, name, **{P: "False", S: "True"}))


async def test_timed_out_annotation_stops_and_releases_the_host(
    world: World, controllers: Controllers, nhc: Any
) -> None:
    await controllers.start(fenceremediation.setup)
    await world.machine("m1")
    obj = await nhc_shaped(world, nhc, world.node_name("m1"))
    name, key = obj.metadata.name, key_of(obj)
    await until(lambda: _has(world.host_annotations("host-m1"), key))

    await world.client.patch(
        FenceRemediation, name,
        {"metadata": {"annotations": {names.NHC_TIMED_OUT: "2026-03-01T12:00:00Z"}}},
        namespace=world.ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    await until(lambda: _lacks(world.host_annotations("host-m1"), key))
    await until(conditions_are(world, name, **{P: "False", S: "False", D: "False"}))
    got = await world.get(FenceRemediation, name)
    assert names.REMEDIATION_FINALIZER not in (got.metadata.finalizers or [])
    # the host going off now fences nothing: the remediation has stopped
    await world.power("host-m1", on=False, for_reboot=False)
    await until(conditions_are(world, name, **{P: "False"}))
    assert await world.node_obj("m1") is not None
    assert key not in await world.host_annotations("host-m1")


async def test_a_node_naming_no_host_is_refused_in_words(
    world: World, controllers: Controllers, nhc: Any
) -> None:
    await controllers.start(fenceremediation.setup)
    obj = await nhc_shaped(world, nhc, "no-such-node")
    await until(phase_of(world, obj.metadata.name, "failed"))
    await until(conditions_are(world, obj.metadata.name, **{P: "False", S: "False"}))
    got = await world.get(FenceRemediation, obj.metadata.name)
    assert "names no BareMetalHost" in got.status["message"]


async def test_a_node_without_a_machine_is_fenced_through_the_host_it_names(
    world: World, controllers: Controllers, nhc: Any
) -> None:
    """NodeHealthCheck on a cluster without Machines: the host names the Node (and the
    Node's metal3 providerID agrees); the FenceRemediation named after the Node fences it."""
    await controllers.start(fenceremediation.setup)
    node = f"{world.ns}-n1"
    await world.client.create(
        BareMetalHost(
            metadata=ObjectMeta(name="host-n1", annotations={names.HOST_NODE: node}),
            spec={"online": True},
        ),
        namespace=world.ns,
    )
    await world.power("host-n1", on=True)
    await world.client.create(
        Node(
            metadata=ObjectMeta(name=node), spec=NodeSpec(providerID=f"metal3://{world.ns}/host-n1")
        )
    )
    world.nodes.append(node)
    owner = OwnerReference(
        apiVersion="remediation.medik8s.io/v1alpha1", kind="NodeHealthCheck",
        name=nhc.metadata.name, uid=nhc.metadata.uid,
    )  # fmt: skip
    obj = await world.client.create(
        FenceRemediation(metadata=ObjectMeta(name=node, ownerReferences=[owner]), spec=spec()),
        namespace=world.ns,
    )
    await until(lambda: _has(world.host_annotations("host-n1"), key_of(obj)))
    await until(conditions_are(world, node, **{P: "True"}))
    await world.power("host-n1", on=False)
    await until(phase_of(world, node, "power-on"))
    await until(lambda: _lacks(world.host_annotations("host-n1"), key_of(obj)))


async def test_a_machine_health_check_instantiates_the_template(
    world: World, controllers: Controllers
) -> None:
    """metalmend's own machine-health-check, which follows Cluster API's contract, names
    a FenceRemediationTemplate: the object it creates is fenced by fence-remediation."""
    await controllers.start(healthcheck.setup, fenceremediation.setup)
    template = {"template": {"spec": spec()}}
    await world.client.create(
        FenceRemediationTemplate(metadata=ObjectMeta(name="fence-first"), spec=template),
        namespace=world.ns,
    )
    await world.machine("m1")
    await world.client.patch(
        Machine, "m1", {"metadata": {"labels": {"role": "worker"}}},
        namespace=world.ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    ref = {
        "apiVersion": "remediation.metalmend.dev/v1alpha1",
        "kind": "FenceRemediationTemplate",
        "name": "fence-first",
    }
    check = {
        "clusterName": "c",
        "selector": {"matchLabels": {"role": "worker"}},
        "unhealthyConditions": [{"type": "KernelDeadlock", "status": "True", "timeout": "1s"}],
        "remediationTemplate": ref,
    }
    await world.client.create(
        MachineHealthCheck(metadata=ObjectMeta(name="workers"), spec=check), namespace=world.ns
    )
    now = dt.datetime.now(dt.UTC).isoformat()
    deadlock = {"type": "KernelDeadlock", "status": "True", "reason": "DockerHung",
                "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
    await world.client.patch(
        Node.Status, world.node_name("m1"), {"status": {"conditions": [deadlock]}}
    )

    await until(lambda: _exists(world.get(FenceRemediation, "m1")), within=60)
    obj = await world.get(FenceRemediation, "m1")
    owner = obj.metadata.ownerReferences[0]
    assert (owner.kind, owner.name) == ("Machine", "m1")
    await until(lambda: _has(world.host_annotations("host-m1"), key_of(obj)))
    await until(conditions_are(world, "m1", **{P: "True"}))
    await world.power("host-m1", on=False)
    await until(lambda: _is_none(world.node_obj("m1")))


async def _exists(found: Any) -> bool:
    return await found is not None
