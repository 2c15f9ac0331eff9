"""The NodeHealthCheck on OpenShift, without hand-made annotations: a Node's host found through
the ``machine.openshift.io/v1beta1`` Machine that OpenShift's nodelink-controller names on
the Node (``machine.openshift.io/machine: <namespace>/<machine>``), trusted only as far as
that Machine names the Node back (its ``status.nodeRef``) and its host confirms the Machine
(its consumerRef), as api/links.node_host_through_machine demands. On the real API server
serving OpenShift's own Machine CRD (from the `make openshift` cache, unmodified). The test
plays host-power (it writes the host's power status), as test_nodehealthcheck.py does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.reboot import is_reboot_annotation
from metalmend.api.resources import BareMetalHost, OpenShiftMachine
from metalmend.controllers import machines as machine_kinds
from metalmend.kube.manager import Manager
from tests.integration import test_openshift_machines as openshift_tests
from tests.integration.test_nodehealthcheck import (
    DURATION,
    Run,
    World,
    _annotated,
    _exists,
    _gone,
    _lacks,
    _status_is,
)
from tests.integration.test_nodehealthcheck_trust import not_remediated
from tests.support import until

# The fixtures of that module, by the names the tests here ask for.
kube_module = openshift_tests.kube_module
openshift_crds = openshift_tests.openshift_crds


class OpenShiftRun(Run):
    """node-health-check and metal3-remediation as `metalmend run` runs them on OpenShift:
    the Machine kinds the API server serves are read (controllers/machines.py)."""

    async def manager(self) -> Manager:
        manager = Manager(self.client)
        machine_kinds.use_kinds(manager, await machine_kinds.served_machine_kinds(self.client))
        return manager


@pytest.fixture
async def world(aclient: AsyncClient, namespace: str) -> AsyncIterator[World]:
    made = World(aclient, namespace)
    yield made
    await made.cleanup()


@pytest.fixture
async def run(aclient: AsyncClient, namespace: str, openshift_crds: Path) -> AsyncIterator[Run]:
    running = OpenShiftRun(aclient, namespace)
    yield running
    await running.kill()


async def openshift_worker(world: World, machine: str, host: str, node: str | None) -> Any:
    """A host, not naming any Node, consumed by an OpenShift Machine as OpenShift's metal3
    provider makes them (the host annotation; the older providerID, which carries no uid,
    so the Node's providerID alone confirms nothing); the Machine's ``status.nodeRef``
    names Node ``node`` (short name; None: no nodeRef), as nodelink-controller sets it."""
    ns = world.ns
    await world.host(host, node="")
    made: Any = await world.client.create(
        OpenShiftMachine(
            metadata=ObjectMeta(name=machine, annotations={names.MACHINE_HOST: f"{ns}/{host}"}),
            spec={"providerID": f"baremetalhost:///{ns}/{host}"},
        ),
        namespace=ns,
    )
    consumer = {"apiVersion": "machine.openshift.io/v1beta1", "kind": "Machine",
                "name": machine, "namespace": ns, "uid": made.metadata.uid}  # fmt: skip
    await world.client.patch(BareMetalHost, host, {"spec": {"consumerRef": consumer}},
                             namespace=ns, patch_type=PatchType.MERGE)  # fmt: skip
    if node is not None:
        ref = {"kind": "Node", "name": world.node_name(node)}
        await world.client.patch(OpenShiftMachine.Status, machine, {"status": {"nodeRef": ref}},
                                 namespace=ns, patch_type=PatchType.MERGE)  # fmt: skip
    return made


async def openshift_node(world: World, name: str, machine: str, host: str) -> None:
    """A Node as OpenShift registers it: the older providerID, and the annotation naming its
    Machine (nodelink-controller's); nothing on it or on the host names one another."""
    annotations = {names.OPENSHIFT_NODE_MACHINE: f"{world.ns}/{machine}"}
    await world.node(name, f"baremetalhost:///{world.ns}/{host}", **annotations)


async def test_an_openshift_node_is_remediated_through_the_machine_its_annotation_names(
    world: World, run: Run
) -> None:
    await openshift_worker(world, "worker-0", "host-0", node="w0")
    await openshift_node(world, "w0", "worker-0", "host-0")
    await world.check("workers", maxUnhealthy=1)
    await run.start()
    await until(lambda: _status_is(world, "workers", observedNodes=1, healthyNodes=1))

    await world.ready("w0", False)
    await until(lambda: _exists(world.remediation("w0")), within=DURATION + 20)
    made: Any = await world.remediation("w0")
    assert made.metadata.annotations[names.REMEDIATED_NODE] == world.node_name("w0")
    key = f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}{made.metadata.uid}"
    await until(lambda: _annotated(world, "host-0", key))  # fence first: the host held off
    assert await world.node_obj("w0") is not None, "not fenced before the host is off"

    await run.kill()  # mid-remediation: the host goes off while nobody watches
    await world.power("host-0", on=False)
    await run.start()
    await until(lambda: _gone(world.node_obj("w0")))  # fenced (Node deleted), after the off
    again: Any = await world.remediation("w0")
    assert again is not None
    assert again.metadata.uid == made.metadata.uid, "one remediation, never a second"

    await run.kill()
    await world.power("host-0", on=True)
    await openshift_node(world, "w0", "worker-0", "host-0")  # registered again, Ready
    await run.start()
    await until(lambda: _gone(world.remediation("w0")), within=30)  # healthy: deleted
    await until(lambda: _lacks(world, "host-0", key))
    await until(lambda: _status_is(world, "workers", phase="Enabled", healthyNodes=1))


async def _event_says(world: World, reason: str, text: str) -> bool:
    async for event in world.client.list(Event, namespace="default"):
        if event.reason == reason and text in (event.message or ""):
            return True
    return False


async def test_a_node_whose_machine_does_not_name_it_back_is_refused(
    world: World, run: Run
) -> None:
    """The annotation is the kubelet's to write: a Node naming a Machine whose nodeRef names
    another Node (or none) gets no host through it, and the check says why."""
    await openshift_worker(world, "worker-1", "host-1", node="w1")  # the real Node's Machine
    await openshift_worker(world, "worker-2", "host-2", node=None)  # a Machine without nodeRef
    await openshift_node(world, "w1", "worker-1", "host-1")
    await openshift_node(world, "ghost", "worker-1", "host-1")  # names worker-1 too
    await openshift_node(world, "stray", "worker-2", "host-2")
    await world.check("workers", maxUnhealthy="100%")
    await run.start()
    await until(lambda: _status_is(world, "workers", observedNodes=3, healthyNodes=3))

    await world.ready("ghost", False)
    await world.ready("stray", False)
    wanted = {world.node_name("ghost"), world.node_name("stray")}

    async def reported() -> bool:
        return wanted <= set(await not_remediated(world, "workers"))

    await until(reported, within=DURATION + 20)
    why = await not_remediated(world, "workers")
    for node, machine in (("ghost", "worker-1"), ("stray", "worker-2")):
        said = why[world.node_name(node)]
        assert f"names Machine {world.ns}/{machine} (machine.openshift.io/machine)" in said, said
        assert "does not name the Node back" in said, said
    assert "status.nodeRef: " + world.node_name("w1") in why[world.node_name("ghost")]
    ghost = world.node_name("ghost")
    await until(lambda: _event_says(world, "NoBareMetalHost", f"Node {ghost} is unhealthy"))
    for node in ("ghost", "stray"):
        assert await world.remediation(node) is None
    for host in ("host-1", "host-2"):
        obj: Any = await world.client.get(BareMetalHost, host, namespace=world.ns)
        assert not any(is_reboot_annotation(k) for k in obj.metadata.annotations or {})
