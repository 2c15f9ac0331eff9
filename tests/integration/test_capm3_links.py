"""Cluster API Machines linked to their hosts as Cluster API Provider Metal3 (CAPM3) links
them, on the real API server serving upstream's Metal3Machine CRD (cluster-api-provider-metal3
``config/crd/bases/infrastructure.cluster.x-k8s.io_metal3machines.yaml``, commit 2f6d76b,
unmodified): the Machine carries no ``metal3.io/BareMetalHost``; its
``spec.infrastructureRef`` names a Metal3Machine that does; the host's consumerRef names the
Metal3Machine; the providerID ``metal3://<ns>/<host>/<metal3machine>`` is on the Machine and
its Node (baremetal/metal3machine_manager.go: ``HostAnnotation``, ``SetDefaultProviderID``).
CAPM3 itself cannot be built here (its module is refused by the Go module proxy): the objects
are made as it makes them. The test plays host-power, as tests/integration/test_remediation.py
does.

The CRD is read from the pinned upstream CRDs CI provides beside the checkout (the directory
``METALMEND_UPSTREAM_CRDS`` names, with ``metal3/`` in it); the tests fail, naming it, when
it is missing."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.resources import BareMetalHost, FenceRemediation, Machine, Metal3Machine
from metalmend.controllers import fenceremediation, machineremediation, nodelink
from metalmend.controllers import machines as machine_kinds
from metalmend.kube.crds import install_crds
from metalmend_lab.controlplane import ControlPlane
from tests.integration.test_openshift_machines import Running
from tests.integration.test_remediation import World, _has, _is_none, _lacks, key_of
from tests.support import until

REPO = Path(__file__).resolve().parents[2]
M3M_CRD = "infrastructure.cluster.x-k8s.io_metal3machines.yaml"
M3M_API = "infrastructure.cluster.x-k8s.io/v1beta1"


def upstream_metal3() -> Path:
    base = os.environ.get("METALMEND_UPSTREAM_CRDS") or str(REPO.parent / "shared" / "upstream")
    found = Path(base) / "metal3" / M3M_CRD
    if not found.is_file():
        pytest.fail(
            f"upstream CAPM3 Metal3Machine CRD not found at {found}: set METALMEND_UPSTREAM_CRDS"
            " to the directory of the pinned upstream CRDs (metal3/, cluster-api/)"
        )
    return found


@pytest.fixture(scope="module")
def metal3machine_crd(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> None:
    directory = tmp_path_factory.mktemp("capm3-crds")
    shutil.copy(upstream_metal3(), directory)
    install_crds(Client(KubeConfig.from_file(control_plane.kubeconfig)), directory)


@pytest.fixture
async def running(
    aclient: AsyncClient, namespace: str, metal3machine_crd: None
) -> AsyncIterator[Running]:
    made = Running(aclient, namespace)
    yield made
    await made.kill()


@pytest.fixture
async def world(aclient: AsyncClient, namespace: str) -> AsyncIterator[World]:
    made = World(aclient, namespace)
    yield made
    await made.cleanup()


async def capm3_machine(
    world: World, name: str, host: str, *, consumer: str | None = None, provider: bool = True
) -> Any:
    """A host, a Metal3Machine annotated with it, its Cluster API Machine (no annotation of
    its own, ``spec.infrastructureRef`` naming the Metal3Machine) and the Node, as CAPM3 and
    Cluster API make them. ``consumer``: the Metal3Machine the host's consumerRef names (the
    Machine's own by default); ``provider``: whether the providerID is set yet."""
    ns, m3m = world.ns, f"{name}-m3m"
    world.host_of[name] = host
    provider_id = f"metal3://{ns}/{host}/{m3m}"
    await world.client.create(
        Metal3Machine(
            metadata=ObjectMeta(name=m3m, annotations={names.MACHINE_HOST: f"{ns}/{host}"}),
            spec={"providerID": provider_id} if provider else {},
        ),
        namespace=ns,
    )
    ref = {"apiVersion": M3M_API, "kind": "Metal3Machine", "name": m3m}
    spec: dict[str, Any] = {"clusterName": "c", "infrastructureRef": ref}
    if provider:
        spec["providerID"] = provider_id
    machine = await world.client.create(
        Machine(metadata=ObjectMeta(name=name), spec=spec), namespace=ns
    )
    consumer_ref = {**ref, "name": consumer or m3m, "namespace": ns}
    await world.client.create(
        BareMetalHost(
            metadata=ObjectMeta(name=host), spec={"online": True, "consumerRef": consumer_ref}
        ),
        namespace=ns,
    )
    await world.power(host, on=True)
    node = world.node_name(name)
    await world.client.create(
        Node(metadata=ObjectMeta(name=node), spec=NodeSpec(providerID=provider_id))
    )
    world.nodes.append(node)
    return machine


async def node_ref(world: World, name: str) -> str | None:
    found = await world.get(Machine, name)
    return ((found.get("status") or {}).get("nodeRef") or {}).get("name") if found else None


def fence_remediation(machine: Any) -> FenceRemediation:
    """As Cluster API's MachineHealthCheck makes it from a FenceRemediationTemplate."""
    owner = OwnerReference(
        apiVersion="cluster.x-k8s.io/v1beta1", kind="Machine",
        name=machine.metadata.name, uid=machine.metadata.uid,
    )  # fmt: skip
    spec = {"strategy": "reboot", "powerOffTimeoutSeconds": 30, "powerOnTimeoutSeconds": 60}
    return FenceRemediation(
        metadata=ObjectMeta(name=machine.metadata.name, ownerReferences=[owner]), spec=spec
    )


async def test_metal3machines_are_read_where_served(
    aclient: AsyncClient, metal3machine_crd: None
) -> None:
    assert await machine_kinds.served_metal3machines(aclient) is True


async def test_node_link_follows_the_capm3_provider_id(world: World, running: Running) -> None:
    await running.start(nodelink.setup)
    await capm3_machine(world, "m1", "host-1")

    async def linked() -> bool:
        return await node_ref(world, "m1") == world.node_name("m1")

    await until(linked)
    assert names.MACHINE_HOST not in ((await world.get(Machine, "m1")).metadata.annotations or {})


async def test_a_fence_remediation_of_a_capm3_machine_fences_its_host_across_a_restart(
    world: World, running: Running
) -> None:
    """Cluster API's MachineHealthCheck's request, for a Machine whose host only its
    Metal3Machine names: the host is held off, the Node deleted only once it is off, the
    host released; metalmend killed in between resumes from what is on the objects."""
    await running.start(fenceremediation.setup)
    machine = await capm3_machine(world, "m1", "host-1", provider=False)
    await world.client.patch(
        Machine.Status, "m1", {"status": {"nodeRef": {"kind": "Node", "name": world.node_name("m1")}}},
        namespace=world.ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    obj = await world.client.create(fence_remediation(machine), namespace=world.ns)
    key = key_of(obj)
    await until(lambda: _has(world.host_annotations("host-1"), key))
    await running.kill()
    await running.start(fenceremediation.setup)
    assert await world.node_obj("m1") is not None, "no fencing before the host is reported off"
    await world.power("host-1", on=False)
    await until(lambda: _is_none(world.node_obj("m1")))
    await until(lambda: _lacks(world.host_annotations("host-1"), key))
    # the Machine was never written with the host: the link is read, not made
    assert names.MACHINE_HOST not in ((await world.get(Machine, "m1")).metadata.annotations or {})


async def test_a_host_that_confirms_another_metal3machine_is_never_touched(
    world: World, running: Running
) -> None:
    """The Metal3Machine's annotation is its writer's word: without the host's consumerRef
    naming that Metal3Machine, the Machine has no host, and the request fails in words."""
    await running.start(fenceremediation.setup)
    machine = await capm3_machine(world, "m1", "host-1", consumer="someone-else")
    obj = await world.client.create(fence_remediation(machine), namespace=world.ns)

    async def failed() -> bool:
        got = await world.get(FenceRemediation, obj.metadata.name)
        return bool(got) and (got.get("status") or {}).get("phase") == "failed"

    await until(failed)
    got = await world.get(FenceRemediation, obj.metadata.name)
    assert "Metal3Machine" in got.status["message"]
    assert not [k for k in await world.host_annotations("host-1") if k.startswith("reboot.")]


async def test_the_machine_remediation_annotation_on_a_capm3_machine(
    world: World, running: Running
) -> None:
    """The reboot.metal3.io/machine-remediation flow (the annotation Cluster API's check does
    not set, but a hand or another checker may) for a Machine linked through its
    Metal3Machine: the link appears when the host's consumerRef comes, later than the
    Machine, as CAPM3 sets it."""
    await running.start(nodelink.setup, machineremediation.setup)
    await capm3_machine(world, "m1", "host-1", consumer="not-yet")

    async def linked() -> bool:
        return await node_ref(world, "m1") == world.node_name("m1")

    consumer = {"apiVersion": M3M_API, "kind": "Metal3Machine", "name": "m1-m3m",
                "namespace": world.ns}  # fmt: skip
    await world.client.patch(
        BareMetalHost, "host-1", {"spec": {"consumerRef": consumer}},
        namespace=world.ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    await until(linked)
    await world.client.patch(
        Machine, "m1", {"metadata": {"annotations": {names.EXTERNAL_REMEDIATION: ""}}},
        namespace=world.ns, patch_type=PatchType.MERGE,
    )  # fmt: skip

    async def held() -> bool:
        return names.MACHINE_REMEDIATION_REBOOT in await world.host_annotations("host-1")

    await until(held)
    await world.power("host-1", on=False)
    await until(lambda: _is_none(world.node_obj("m1")))

    async def request_removed() -> bool:
        found = await world.get(Machine, "m1")
        return names.EXTERNAL_REMEDIATION not in (found.metadata.annotations or {})

    await until(request_removed)
