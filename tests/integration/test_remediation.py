"""The remediation controllers on the real API server. The test plays the host power
controller (it writes the host's power status) so that every step is under its control;
the lab tests (tests/e2e) run the real one against real BMCs."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import Container, NodeSpec, PodSpec
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.reboot import is_reboot_annotation
from metalmend.api.resources import BareMetalHost, Machine, MachineHealthCheck, Metal3Remediation
from metalmend.api.stamps import parse_stamp, stamp
from metalmend.controllers import Setup, healthcheck, machineremediation, nodelink, remediation
from metalmend.kube.manager import Manager
from metalmend.policy.fencing import POWERED_OFF_FOR
from metalmend.settings import FenceMethod, RemediationSettings, RuntimeSettings, Settings
from tests.support import until


class Controllers:
    """Managers started (and killed) by a test, as `metalmend run` would run them."""

    def __init__(self, client: AsyncClient, namespace: str | None) -> None:
        self.client = client
        self.namespace = namespace  # None: all namespaces
        self.tasks: list[asyncio.Task[None]] = []

    async def start(
        self,
        *setups: Setup,
        fence: FenceMethod = FenceMethod.DELETE_NODE,
        remediation: RemediationSettings | None = None,
    ) -> None:
        manager = Manager(self.client)
        settings = Settings(
            runtime=RuntimeSettings(namespace=self.namespace),
            remediation=remediation or RemediationSettings(fence=fence),
        )
        for setup in setups:
            setup(manager, settings)
        self.tasks.append(asyncio.create_task(manager.run()))
        await manager.wait_synced()

    async def kill(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()


@pytest.fixture
async def controllers(aclient: AsyncClient, namespace: str) -> AsyncIterator[Controllers]:
    running = Controllers(aclient, namespace)
    yield running
    await running.kill()


class World:
    """A Machine, its host and its Node, made by hand; the test reports the host's power."""

    def __init__(self, client: AsyncClient, namespace: str) -> None:
        self.client = client
        self.ns = namespace
        self.nodes: list[str] = []
        self.host_of: dict[str, str] = {}  # machine -> host

    def provider_id(self, machine: str) -> str:
        # node-link pairs Machine and Node by it: CAPM3's form, metal3://<ns>/<host>/<name>,
        # which names the Machine's host (api/links.py) and differs per Machine.
        return f"metal3://{self.ns}/{self.host_of.get(machine, f'host-{machine}')}/{machine}"

    def node_name(self, machine: str) -> str:
        return f"{self.ns}-{machine}"

    async def machine(self, name: str, host: str | None = None, **annotations: str) -> Any:
        host = host or f"host-{name}"
        self.host_of[name] = host
        annotations[names.MACHINE_HOST] = f"{self.ns}/{host}"
        machine: Any = await self.client.create(
            Machine(
                metadata=ObjectMeta(name=name, annotations=annotations),
                spec={"clusterName": "c", "providerID": self.provider_id(name)},
            ),
            namespace=self.ns,
        )
        consumer = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "name": name,
                    "namespace": self.ns, "uid": machine.metadata.uid}  # fmt: skip
        with contextlib.suppress(ApiError):  # several Machines may name one host: the first
            await self.client.create(  # is its consumer
                BareMetalHost(
                    metadata=ObjectMeta(name=host), spec={"online": True, "consumerRef": consumer}
                ),
                namespace=self.ns,
            )
            await self.power(host, on=True)
        await self.node(name)
        return machine

    async def node(
        self, machine: str, ready: bool = True, labels: dict[str, str] | None = None
    ) -> Any:
        name = self.node_name(machine)
        node: Any = await self.client.create(
            Node(
                metadata=ObjectMeta(
                    name=name,
                    labels=labels if labels is not None else {"role": "worker", "rack": "r7"},
                    annotations={"team": "storage"},
                ),
                spec=NodeSpec(providerID=self.provider_id(machine)),
            )
        )
        if name not in self.nodes:
            self.nodes.append(name)
        now = dt.datetime.now(dt.UTC).isoformat()
        condition = {"type": "Ready", "status": "True" if ready else "Unknown", "reason": "Test",
                     "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
        await self.client.patch(Node.Status, name, {"status": {"conditions": [condition]}})
        await self.client.patch(
            Machine.Status, machine,
            {"status": {"nodeRef": {"kind": "Node", "name": name, "uid": node.metadata.uid}}},
            namespace=self.ns, patch_type=PatchType.MERGE,
        )  # fmt: skip
        return node

    async def pod_on(self, machine: str, name: str) -> None:
        pod = Pod(
            metadata=ObjectMeta(name=name),
            spec=PodSpec(
                nodeName=self.node_name(machine), containers=[Container(name="c", image="i")]
            ),
        )
        await self.client.create(pod, namespace=self.ns)

    async def power(self, host: str, on: bool, for_reboot: bool = True) -> None:
        """Report the host's power as host-power would: off for the reboot keys on the host
        now (listed in poweredOffFor) or, with for_reboot=False, an old "off" (read before
        any of them was added: none listed)."""
        now = dt.datetime.now(dt.UTC)
        hour = dt.timedelta(hours=1)
        provisioning = {"state": "provisioned", "lastPoweredOn": stamp(now - hour)}
        listed = None
        if not on:
            provisioning["pendingRebootSince"] = stamp(now if for_reboot else now - 2 * hour)
            keys = [k for k in await self.host_annotations(host) if is_reboot_annotation(k)]
            listed = sorted(k for k in keys if k != names.REBOOT) if for_reboot else None
        status = {
            "poweredOn": on,
            "operationalStatus": "OK",
            "provisioning": provisioning,
            POWERED_OFF_FOR: listed or None,
        }
        await self.client.patch(
            BareMetalHost.Status,
            host,
            {"status": status},
            namespace=self.ns,
            patch_type=PatchType.MERGE,
        )

    async def remediation(self, machine: Any, **spec: Any) -> Any:
        owner = OwnerReference(
            apiVersion="cluster.x-k8s.io/v1beta1", kind="Machine",
            name=machine.metadata.name, uid=machine.metadata.uid,
        )  # fmt: skip
        body = {"powerOffTimeoutSeconds": 30, "powerOnTimeoutSeconds": 60, **spec}
        return await self.client.create(
            Metal3Remediation(
                metadata=ObjectMeta(name=machine.metadata.name, ownerReferences=[owner]), spec=body
            ),
            namespace=self.ns,
        )

    async def get(self, resource: Any, name: str) -> Any | None:
        try:
            return await self.client.get(resource, name, namespace=self.ns)
        except ApiError as error:
            if error.status.code == 404:
                return None
            raise

    async def node_obj(self, machine: str) -> Any | None:
        try:
            return await self.client.get(Node, self.node_name(machine))
        except ApiError as error:
            if error.status.code == 404:
                return None
            raise

    async def phase(self, name: str) -> str:
        obj = await self.get(Metal3Remediation, name)
        return str(((obj.get("status") or {}) if obj else {}).get("phase") or "")

    async def host_annotations(self, host: str) -> dict[str, str]:
        obj = await self.get(BareMetalHost, host)
        return dict(obj.metadata.annotations or {}) if obj else {}

    async def cleanup(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(ApiError):
                await self.client.delete(Node, node)


@pytest.fixture
async def world(aclient: AsyncClient, namespace: str) -> AsyncIterator[World]:
    made = World(aclient, namespace)
    yield made
    await made.cleanup()


def key_of(obj: Any) -> str:
    return f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}{obj.metadata.uid}"


async def phase_is(world: World, name: str, phase: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await world.phase(name) == phase

    return check


async def test_fence_first_then_power_on_and_restore_labels(
    world: World, controllers: Controllers
) -> None:
    await controllers.start(remediation.setup)
    machine = await world.machine("m1")
    await world.pod_on("m1", "db-0")
    obj = await world.remediation(machine)
    key = key_of(obj)

    await until(lambda: _has(world.host_annotations("host-m1"), key))
    assert json.loads((await world.host_annotations("host-m1"))[key]) == {"mode": "hard"}
    assert await world.phase("m1") == "power-off"
    got = await world.get(Metal3Remediation, "m1")
    assert names.REMEDIATION_FINALIZER in got.metadata.finalizers
    await asyncio.sleep(1)
    assert await world.node_obj("m1") is not None, "no fencing before the host is reported off"

    await world.power("host-m1", on=False)
    await until(lambda: _is_none(world.node_obj("m1")))
    await until(lambda: _is_none(world.get(Pod, "db-0")))
    await until(await phase_is(world, "m1", "power-on"))
    await until(lambda: _lacks(world.host_annotations("host-m1"), key))
    got = await world.get(Metal3Remediation, "m1")
    assert json.loads(got.metadata.annotations[names.NODE_LABELS_BACKUP]) == {
        "role": "worker",
        "rack": "r7",
    }

    await world.power("host-m1", on=True)
    await world.node("m1", labels={"rack": "r9"})  # the kubelet registers again, labels lost
    await until(await phase_is(world, "m1", "waiting"))
    node = await world.node_obj("m1")
    assert node.metadata.labels == {"rack": "r9", "role": "worker"}  # restored what it lacked
    assert node.metadata.annotations["team"] == "storage"
    got = await world.get(Metal3Remediation, "m1")
    assert got.status["lastRemediated"]
    assert got.status["retryCount"] == 0

    await world.client.delete(Metal3Remediation, "m1", namespace=world.ns)  # the MHC: healthy
    await until(lambda: _is_none(world.get(Metal3Remediation, "m1")))
    reasons = {e.reason async for e in world.client.list(Event, namespace=world.ns)}
    assert {"PowerOffRequested", "HostPoweredOff", "NodeFenced", "NodeReady"} <= reasons


async def test_an_old_off_report_fences_nothing(world: World, controllers: Controllers) -> None:
    await controllers.start(remediation.setup)
    machine = await world.machine("m1")
    await world.power("host-m1", on=False, for_reboot=False)  # off, before any request
    obj = await world.remediation(machine)
    await until(lambda: _has(world.host_annotations("host-m1"), key_of(obj)))
    await asyncio.sleep(1.5)
    assert await world.node_obj("m1") is not None
    assert await world.phase("m1") == "power-off"


async def test_deleted_while_powering_off_releases_the_host(
    world: World, controllers: Controllers
) -> None:
    await controllers.start(remediation.setup)
    machine = await world.machine("m1")
    obj = await world.remediation(machine)
    await until(lambda: _has(world.host_annotations("host-m1"), key_of(obj)))
    await world.client.delete(Metal3Remediation, "m1", namespace=world.ns)
    await until(lambda: _is_none(world.get(Metal3Remediation, "m1")))
    assert key_of(obj) not in await world.host_annotations("host-m1")
    assert await world.node_obj("m1") is not None


async def test_machine_deleted_mid_power_off_releases_the_host(
    world: World, controllers: Controllers
) -> None:
    await controllers.start(remediation.setup)
    machine = await world.machine("m1")
    obj = await world.remediation(machine)
    await until(lambda: _has(world.host_annotations("host-m1"), key_of(obj)))
    await world.client.delete(Machine, "m1", namespace=world.ns)  # GC takes the remediation
    await until(lambda: _is_none(world.get(Metal3Remediation, "m1")), within=30)
    assert key_of(obj) not in await world.host_annotations("host-m1")


async def test_restart_mid_remediation_finishes_the_job(
    world: World, controllers: Controllers
) -> None:
    await controllers.start(remediation.setup)
    machine = await world.machine("m1")
    obj = await world.remediation(machine)
    await until(lambda: _has(world.host_annotations("host-m1"), key_of(obj)))
    await controllers.kill()
    await world.power("host-m1", on=False)  # the host goes off while nobody watches
    await controllers.start(remediation.setup)
    await until(await phase_is(world, "m1", "power-on"))
    assert await world.node_obj("m1") is None
    await controllers.kill()
    await world.power("host-m1", on=True)
    await world.node("m1")
    await controllers.start(remediation.setup)
    await until(await phase_is(world, "m1", "waiting"))


async def test_escalate_deletes_the_machine_after_failed_attempts(
    world: World, controllers: Controllers
) -> None:
    await controllers.start(remediation.setup)
    machine = await world.machine("m1")
    await world.remediation(
        machine, strategy="escalate", deleteAfterRetries=1, powerOffTimeoutSeconds=1
    )
    await until(lambda: _is_none(world.get(Machine, "m1")), within=20)
    # The Machine's garbage collection takes the remediation (finalizer released) with it.
    await until(lambda: _is_none(world.get(Metal3Remediation, "m1")), within=30)
    left = await world.host_annotations("host-m1")
    assert not any(k.startswith("reboot.metal3.io/") for k in left)
    assert names.ESCALATING not in left  # the escalation's mark went with the object


async def test_one_remediation_at_a_time_per_host(world: World, controllers: Controllers) -> None:
    await controllers.start(remediation.setup)
    first = await world.machine("m1", host="shared")
    second = await world.machine("m2", host="shared")
    a = await world.remediation(first)
    b = await world.remediation(second)
    await until(lambda: _any_key(world.host_annotations("shared"), {key_of(a), key_of(b)}))
    await asyncio.sleep(1)
    keys = {
        k
        for k in await world.host_annotations("shared")
        if k.startswith(names.METAL3_REMEDIATION_REBOOT_PREFIX)
    }
    assert len(keys) == 1
    waiting = "m2" if key_of(a) in keys else "m1"
    got = await world.get(Metal3Remediation, waiting)
    assert "being remediated by" in got.status["message"]


async def test_annotation_based_remediation_from_annotations_alone(
    world: World, controllers: Controllers
) -> None:
    await controllers.start(machineremediation.setup, nodelink.setup)
    await world.machine("m1")
    await world.pod_on("m1", "db-0")
    await world.client.patch(
        Machine, "m1", {"metadata": {"annotations": {names.EXTERNAL_REMEDIATION: ""}}},
        namespace=world.ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    await until(lambda: _has(world.host_annotations("host-m1"), names.MACHINE_REMEDIATION_REBOOT))
    await controllers.kill()  # resumes from the annotations alone
    await controllers.start(machineremediation.setup, nodelink.setup)
    await asyncio.sleep(0.5)
    assert await world.node_obj("m1") is not None
    await world.power("host-m1", on=False)
    await until(lambda: _is_none(world.node_obj("m1")))
    await until(lambda: _is_none(world.get(Pod, "db-0")))

    def machine_annotations():
        return _lacks(_annotations(world, Machine, "m1"), names.EXTERNAL_REMEDIATION)

    await until(machine_annotations)
    await until(lambda: _lacks(world.host_annotations("host-m1"), names.MACHINE_REMEDIATION_REBOOT))


async def test_annotation_flow_finishes_where_cluster_api_keeps_the_deleted_nodes_ref(
    world: World, controllers: Controllers
) -> None:
    """No node-link: status.nodeRef keeps naming the Node this flow deleted, as Cluster API
    keeps it. The truth table's "node ref" is whether that Node is found: once it is gone
    the request is removed and the host released (not "delete node" forever, host off). A
    Node registered again under that name (new uid, nodeRef not updated) is fenced the next
    time."""
    await controllers.start(machineremediation.setup)
    await world.machine("m1")
    request = {"metadata": {"annotations": {names.EXTERNAL_REMEDIATION: ""}}}
    key = names.MACHINE_REMEDIATION_REBOOT
    for _ in range(2):
        await world.client.patch(Machine, "m1", request, namespace=world.ns,
                                 patch_type=PatchType.MERGE)  # fmt: skip
        await until(lambda: _has(world.host_annotations("host-m1"), key))
        await world.power("host-m1", on=False)
        await until(lambda: _is_none(world.node_obj("m1")))
        await until(lambda: _lacks(_annotations(world, Machine, "m1"), names.EXTERNAL_REMEDIATION))
        await until(lambda: _lacks(world.host_annotations("host-m1"), key))
        machine = await world.get(Machine, "m1")
        assert machine.status["nodeRef"]["name"] == world.node_name("m1")  # still named
        await world.power("host-m1", on=True)
        # the kubelet registers again: a new Node object; nobody updates nodeRef's uid
        await world.client.create(
            Node(
                metadata=ObjectMeta(name=world.node_name("m1")),
                spec=NodeSpec(providerID=world.provider_id("m1")),
            )
        )


async def test_health_check_can_request_by_annotation(
    world: World, controllers: Controllers
) -> None:
    await controllers.start(healthcheck.setup)
    await world.machine("m1")
    await world.client.patch(Machine, "m1", {"metadata": {"labels": {"role": "worker"}}},
                             namespace=world.ns, patch_type=PatchType.MERGE)  # fmt: skip
    check = MachineHealthCheck(
        metadata=ObjectMeta(name="workers", annotations={names.REQUEST_REMEDIATION_BY: "annotation"}),
        spec={"clusterName": "c", "selector": {"matchLabels": {"role": "worker"}},
              "unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": "1s"}]},
    )  # fmt: skip
    await world.client.create(check, namespace=world.ns)
    await world.client.delete(Node, world.node_name("m1"))
    await world.node("m1", ready=False)
    await until(
        lambda: _has(_annotations(world, Machine, "m1"), names.EXTERNAL_REMEDIATION), within=15
    )
    await world.client.delete(Node, world.node_name("m1"))
    await world.node("m1", ready=True)
    await until(
        lambda: _lacks(_annotations(world, Machine, "m1"), names.EXTERNAL_REMEDIATION), within=15
    )


async def _annotation_check(world: World, startup: str) -> None:
    """A check asking by annotation for Machines whose Node says KernelDeadlock=True (a
    condition the node-lifecycle controller leaves alone, so the test owns it)."""
    await world.client.patch(Machine, "m1", {"metadata": {"labels": {"role": "worker"}}},
                             namespace=world.ns, patch_type=PatchType.MERGE)  # fmt: skip
    check = MachineHealthCheck(
        metadata=ObjectMeta(name="workers", annotations={names.REQUEST_REMEDIATION_BY: "annotation"}),
        spec={"clusterName": "c", "selector": {"matchLabels": {"role": "worker"}},
              "nodeStartupTimeout": startup,
              "unhealthyConditions": [{"type": "KernelDeadlock", "status": "True", "timeout": "1s"}]},
    )  # fmt: skip
    await world.client.create(check, namespace=world.ns)


async def _deadlock(world: World, machine: str) -> None:
    now = dt.datetime.now(dt.UTC).isoformat()
    condition = {"type": "KernelDeadlock", "status": "True", "reason": "DockerHung",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
    await world.client.patch(Node.Status, world.node_name(machine),
                             {"status": {"conditions": [condition]}})  # fmt: skip


async def _power_cycle_by_the_check(world: World) -> None:
    """The Node hangs; the check asks, machine-remediation powers the host off (the test
    reports it off, as host-power would), deletes the Node, ends the request and releases
    the host, which the test then reports on: the server is booting, no Node yet."""
    key = names.MACHINE_REMEDIATION_REBOOT
    await _deadlock(world, "m1")
    await until(lambda: _has(world.host_annotations("host-m1"), key), within=15)
    await world.power("host-m1", on=False)
    await until(lambda: _is_none(world.node_obj("m1")))
    await until(lambda: _lacks(world.host_annotations("host-m1"), key), within=15)
    await world.power("host-m1", on=True)


async def test_a_remediated_server_gets_node_startup_timeout_to_register_its_node_again(
    world: World, controllers: Controllers
) -> None:
    """Health check and annotation flow together, nodeRef kept (no node-link, as Cluster
    API): the Node this flow deleted is missing, but the server is booting. The check waits
    for it (nodeStartupTimeout from the end of the remediation) instead of asking again at
    once, which, with the host read on, would add the reboot key again: a second power
    cycle, and a loop that never lets the server boot. The new Node ends the wait."""
    await controllers.start(healthcheck.setup, machineremediation.setup)
    await world.machine("m1")
    await _annotation_check(world, startup="10m")
    await _power_cycle_by_the_check(world)
    machine = await world.get(Machine, "m1")
    assert names.EXTERNAL_REMEDIATION not in machine.metadata.annotations
    assert names.REMEDIATION_ENDED_AT in machine.metadata.annotations
    await asyncio.sleep(3)  # booting: the kubelet has not registered yet
    assert names.MACHINE_REMEDIATION_REBOOT not in await world.host_annotations("host-m1")
    machine = await world.get(Machine, "m1")
    assert names.EXTERNAL_REMEDIATION not in machine.metadata.annotations, "asked again at once"
    # the kubelet registers again: a new Node object; nobody updates nodeRef's uid
    await world.client.create(
        Node(
            metadata=ObjectMeta(name=world.node_name("m1")),
            spec=NodeSpec(providerID=world.provider_id("m1")),
        )
    )
    await until(lambda: _lacks(_annotations(world, Machine, "m1"), names.REMEDIATION_ENDED_AT))
    await asyncio.sleep(1)
    assert names.EXTERNAL_REMEDIATION not in await _annotations(world, Machine, "m1")
    assert names.MACHINE_REMEDIATION_REBOOT not in await world.host_annotations("host-m1")


async def test_a_remediated_server_without_a_node_after_node_startup_timeout_is_remediated_again(
    world: World, controllers: Controllers
) -> None:
    await controllers.start(healthcheck.setup, machineremediation.setup)
    await world.machine("m1")
    """The wait has an end: a server whose Node is not back nodeStartupTimeout (the schema's
    least, 30 s) after its remediation ended is asked for again, at that deadline."""
    await _annotation_check(world, startup="30s")
    await _power_cycle_by_the_check(world)
    ended = parse_stamp((await _annotations(world, Machine, "m1"))[names.REMEDIATION_ENDED_AT])
    assert ended is not None
    await until(
        lambda: _has(_annotations(world, Machine, "m1"), names.EXTERNAL_REMEDIATION), within=45
    )
    assert dt.datetime.now(dt.UTC) - ended >= dt.timedelta(seconds=30), "not within the window"
    await until(lambda: _has(world.host_annotations("host-m1"), names.MACHINE_REMEDIATION_REBOOT))


# ---- small async predicates -----------------------------------------------------------------


async def _annotations(world: World, resource: Any, name: str) -> dict[str, str]:
    obj = await world.get(resource, name)
    return dict(obj.metadata.annotations or {}) if obj else {}


async def _has(found: Awaitable[dict[str, str]], key: str) -> bool:
    return key in await found


async def _lacks(found: Awaitable[dict[str, str]], key: str) -> bool:
    return key not in await found


async def _any_key(found: Awaitable[dict[str, str]], keys: set[str]) -> bool:
    return bool(keys & set(await found))


async def _is_none(found: Awaitable[Any]) -> bool:
    return await found is None
