"""No Machine status write at rest, whatever the Nodes' heartbeats (at 5,000 hosts the scale
benchmark saw 5 Machine status writes a second beside kwok's Node heartbeats:
docs/scale.md). The scale lab's shape in small, on the real API server: hosts registered as
``lab up`` registers them, Nodes as kwok keeps them, one check over every Machine with the
lab's remediation template, and every controller that writes Machines; then Node status
heartbeats as kwok and kubelets send them: a new ``lastHeartbeatTime``, the same
conditions. Writes are counted by the API server itself (``apiserver_request_total``).

Between those heartbeats the Nodes are kept alive as kwok keeps them: each Node's Lease
renewed (the Node lifecycle controller's heartbeat), so the control plane's lifecycle
controller (a grace of seconds here: tests/conftest.py) does not mark them Ready Unknown.
Left silent, they were: on a busy machine the set-up alone outlasts the grace, and once a
Node had been Unknown for the check's 300 s its Machine was rightly unhealthy (no longer
``HealthCheckSucceeded``) and the first wait below could not end. A Node marked Unknown
all the same (a renewal late under load) reports Ready again, as its kubelet would."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
from lightkube import ApiError, AsyncClient, Client
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from metalmend.api.resources import Machine, MachineHealthCheck, Metal3RemediationTemplate
from metalmend.controllers import healthcheck, machineremediation, nodelink, remediation
from metalmend.kube.manager import Manager
from metalmend.settings import RuntimeSettings, Settings
from metalmend_lab.controlplane import ControlPlane
from metalmend_lab.hosts import register_host
from metalmend_lab.inventory import HostSpec
from tests.support import until

HOSTS = 12  # many Machines under one check, as at scale
BEATS = 3
NODE_LEASES = "kube-node-lease"
RENEW_EVERY = 1.0  # seconds between two renewals of every Lease (the grace is 6 s)

# kwok's Node conditions (sigs.k8s.io/kwok v0.8.0, ``NodeConditions`` in
# pkg/utils/gotpl/funcs.go), as its node-initialize and node-heartbeat-with-lease stages
# write them (kustomize/stage/node/): every heartbeat sets lastHeartbeatTime to now and
# lastTransitionTime to the Node's creation.
KWOK_CONDITIONS = (
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ("MemoryPressure", "False", "KubeletHasSufficientMemory",
     "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("NetworkUnavailable", "False", "RouteCreated", "RouteController created a route"),
)  # fmt: skip
RESOURCES = {"cpu": "1k", "memory": "1Ti", "pods": "1M"}


def wire(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def kwok_status(node: Any, beat: dt.datetime, *, initialize: bool = False) -> dict[str, Any]:
    """What kwok's stages patch into a Node's status (a strategic merge): node-initialize
    once, node-heartbeat-with-lease at every heartbeat."""
    created = wire(node.metadata.creationTimestamp)
    status: dict[str, Any] = {
        "conditions": [
            {"lastHeartbeatTime": wire(beat), "lastTransitionTime": created, "message": message,
             "reason": reason, "status": status, "type": kind}
            for kind, status, reason, message in KWOK_CONDITIONS
        ],
        "addresses": [{"address": "127.0.0.1", "type": "InternalIP"},
                      {"address": node.metadata.name, "type": "Hostname"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
    }  # fmt: skip
    if initialize:
        version = "kwok-v0.8.0"
        status |= {
            "allocatable": RESOURCES, "capacity": RESOURCES, "phase": "Running",
            "nodeInfo": {"architecture": "amd64", "bootID": "", "machineID": "",
                         "containerRuntimeVersion": version, "kernelVersion": version,
                         "kubeProxyVersion": version, "kubeletVersion": version,
                         "operatingSystem": "linux", "osImage": "", "systemUUID": ""},
        }  # fmt: skip
    return {"status": status}


def machine_status_writes(control_plane: ControlPlane) -> int:
    """Requests that write a Machine's status, every client and answer (a conflict is a
    write attempted), from the API server's own count."""
    with control_plane.admin_http() as http:
        text = http.get("/metrics").text
    total = 0
    for line in text.splitlines():
        if (
            line.startswith("apiserver_request_total{")
            and 'resource="machines"' in line
            and 'subresource="status"' in line
            and any(f'verb="{verb}"' in line for verb in ("PATCH", "PUT", "APPLY"))
        ):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def node_lease(node: Any) -> Lease:
    """A Node's Lease as its kubelet (or kwok) keeps it, owned by the Node, renewed now."""
    now = dt.datetime.now(dt.UTC)
    # A MicroTime: the API server refuses one without its fraction, which lightkube leaves
    # out of a whole second.
    now = now.replace(microsecond=now.microsecond or 1)
    owner = OwnerReference(
        apiVersion="v1", kind="Node", name=node.metadata.name, uid=node.metadata.uid
    )
    return Lease(
        metadata=ObjectMeta(name=node.metadata.name, ownerReferences=[owner]),
        spec=LeaseSpec(holderIdentity=node.metadata.name, leaseDurationSeconds=40, renewTime=now),
    )


async def keep_alive(client: AsyncClient, names: list[str]) -> None:
    """kwok's part between status heartbeats, for every Node of ``names`` that has a Lease
    yet: renew the Lease every ``RENEW_EVERY`` seconds; a Node the lifecycle controller
    marked Ready Unknown all the same (a renewal late on a busy machine) reports Ready
    again, as its kubelet would at its next status sync."""

    async def renew(name: str) -> None:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        # Not made yet (404), or a busy API server's error or timeout: the next round.
        with contextlib.suppress(ApiError, httpx2.HTTPError):
            await client.patch(Lease, name, {"spec": {"renewTime": now}},
                               namespace=NODE_LEASES, patch_type=PatchType.MERGE)  # fmt: skip
            node: Any = await client.get(Node, name)
            ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
            if ready is not None and ready.status != "True":
                beat = kwok_status(node, dt.datetime.now(dt.UTC))
                await client.patch(Node.Status, name, beat, patch_type=PatchType.STRATEGIC)

    while True:
        await asyncio.gather(*(renew(n) for n in names))
        await asyncio.sleep(RENEW_EVERY)


@pytest.fixture
async def lab(kube: Client, aclient: AsyncClient, namespace: str) -> AsyncIterator[list[str]]:
    """HOSTS hosts as the scale benchmark registers them (its Machine, BareMetalHost and
    BMC Secret; its Node for kwok, with the host's providerID, Ready as kwok makes it, and
    its Lease, kept renewed: ``keep_alive``), and one check over them all with the lab's
    template. Yields the Node names."""
    names = [f"{namespace}-w{i}" for i in range(HOSTS)]
    alive = asyncio.create_task(keep_alive(aclient, names))
    try:
        # In a thread: the event loop renews the Leases meanwhile.
        await asyncio.to_thread(register, kube, namespace, names)
        yield names
    finally:
        if alive.done():
            alive.result()  # (a bug in keep_alive: said here)
        alive.cancel()
        await asyncio.gather(alive, return_exceptions=True)
        for name in names:
            kube.delete(Node, name)  # (its Lease with it: the garbage collector)


def register(kube: Client, namespace: str, names: list[str]) -> None:
    """The hosts, Machines, Nodes and Leases of ``names``, the template and the check."""
    for name in names:
        provider = f"metal3://{namespace}/{name}"
        spec = HostSpec(name=name, namespace=namespace, bmc="redfish", bmc_port=1,
                        internal_port=0, username="admin", password="password",
                        provider_id=provider, kubeconfig="", system_id=name)  # fmt: skip
        register_host(kube, spec)
        node = kube.create(
            Node(
                metadata=ObjectMeta(name=name, annotations={"kwok.x-k8s.io/node": "fake"}),
                spec=NodeSpec(providerID=provider),
            )
        )
        beat = node.metadata.creationTimestamp
        kube.create(node_lease(node), namespace=NODE_LEASES)
        kube.patch(Node.Status, name, kwok_status(node, beat, initialize=True),
                   patch_type=PatchType.STRATEGIC)  # fmt: skip
    template = {"strategy": "reboot", "powerOffTimeoutSeconds": 60, "powerOnTimeoutSeconds": 120}
    kube.create(
        Metal3RemediationTemplate(
            metadata=ObjectMeta(name="fence"), spec={"template": {"spec": template}}
        ),
        namespace=namespace,
    )
    spec = {
        "clusterName": "lab", "selector": {"matchLabels": {"role": "worker"}},
        "unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": "300s"},
                                {"type": "KernelDeadlock", "status": "True", "timeout": "5s"}],
        "remediationTemplate": {"apiVersion": "remediation.metal3.io/v1alpha1",
                                "kind": "Metal3RemediationTemplate", "name": "fence"},
    }  # fmt: skip
    kube.create(
        MachineHealthCheck(metadata=ObjectMeta(name="workers"), spec=spec), namespace=namespace
    )


@dataclass
class Controllers:
    manager: Manager
    task: asyncio.Task[None]  # its run(): ended only by a bug, which the waits then name

    def alive(self) -> None:
        """Raise at once when their run ended (a bug): a wait on them would never end."""
        if self.task.done():
            self.task.result()
            raise AssertionError("the controllers' run() ended")

    def idle(self) -> bool:
        """Nothing waiting or being reconciled (a scheduled requeue is not work yet)."""
        self.alive()
        return all(len(c.queue) == 0 and c.queue.in_progress == 0 for c in self.manager.controllers)

    def busy(self) -> dict[str, str]:
        """The controllers not idle: their queue's depth and keys in progress."""
        return {
            c.name: f"{len(c.queue)} waiting, {c.queue.in_progress} in progress"
            for c in self.manager.controllers
            if len(c.queue) or c.queue.in_progress
        }


@pytest.fixture
async def controllers(aclient: AsyncClient, namespace: str) -> AsyncIterator[Controllers]:
    """Every controller of `metalmend run` that writes Machines (host-power writes hosts
    only, and needs BMCs)."""
    manager = Manager(aclient)
    settings = Settings(runtime=RuntimeSettings(namespace=namespace))
    for setup in (nodelink.setup, healthcheck.setup, remediation.setup, machineremediation.setup):
        setup(manager, settings)
    task = asyncio.create_task(manager.run())
    await manager.wait_synced()
    yield Controllers(manager, task)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def ready_of(node: Any) -> str:
    ready = next((c for c in (node.status.conditions or []) if c.type == "Ready"), None)
    return f"Ready {ready.status} ({ready.reason})" if ready is not None else "no Ready"


def machine_state(machine: Any) -> str:
    status = machine.get("status") or {}
    checked = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "HealthCheckSucceeded"),
        {},
    )
    node = (status.get("nodeRef") or {}).get("name")
    return f"nodeRef {node}, HealthCheckSucceeded {checked.get('status')} ({checked.get('reason')})"


async def test_node_heartbeats_write_no_machine_status(
    aclient: AsyncClient,
    namespace: str,
    control_plane: ControlPlane,
    lab: list[str],
    controllers: Controllers,
) -> None:
    def is_reconciled(machine: Any) -> bool:
        status = machine.get("status") or {}
        return bool(status.get("nodeRef")) and any(
            c.get("type") == "HealthCheckSucceeded" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )

    async def reconciled() -> bool:
        controllers.alive()
        machines = [m async for m in aclient.list(Machine, namespace=namespace)]
        return len(machines) == HOSTS and all(is_reconciled(m) for m in machines)

    async def not_reconciled() -> dict[str, object]:
        """The Machines not linked or not healthy yet, and their Nodes' Ready."""
        machines = [m async for m in aclient.list(Machine, namespace=namespace)]
        found: dict[str, object] = {}
        for machine in machines:
            if not is_reconciled(machine):
                name = machine["metadata"]["name"]
                try:
                    node = ready_of(await aclient.get(Node, name))
                except ApiError as error:
                    node = f"unread: {error.status.code}"
                found[name] = f"{machine_state(machine)}; its Node {node}"
        return {"machines": len(machines), **found, "busy": controllers.busy()}

    await until(reconciled, within=60, what=f"all {HOSTS} Machines linked and healthy",
                state=not_reconciled)  # fmt: skip
    await until(controllers.idle, within=30, what="the controllers idle",
                state=controllers.busy)  # fmt: skip
    before = machine_status_writes(control_plane)
    nodes = controllers.manager.informer(Node).store
    start = dt.datetime.now(dt.UTC)
    for beat in range(1, BEATS + 1):
        moment = start + dt.timedelta(minutes=beat)  # a new lastHeartbeatTime each time
        written: dict[str, int] = {}
        for name in lab:
            node: Any = await aclient.get(Node, name)
            node = await aclient.patch(Node.Status, name, kwok_status(node, moment),
                                       patch_type=PatchType.STRATEGIC)  # fmt: skip
            written[name] = int(node.metadata.resourceVersion)

        def behind(written: dict[str, int] = written) -> dict[str, str]:
            """The Nodes whose heartbeat the controllers' cache has not seen yet."""
            cached = {name: nodes.get(name) for name in written}
            return {
                name: f"wrote {written[name]}, cached "
                f"{node.metadata.resourceVersion if node is not None else None}"
                for name, node in cached.items()
                if node is None or int(node.metadata.resourceVersion) < written[name]
            }

        def seen_and_done(written: dict[str, int] = written) -> bool:
            return not behind(written) and controllers.idle()

        def waiting(written: dict[str, int] = written) -> object:
            informer = controllers.manager.informer(Node)
            return {
                "Nodes not seen": behind(written),
                "busy": controllers.busy(),
                "Node informer": f"lists {informer.lists}, last error {informer.last_error}",
            }

        await until(seen_and_done, within=30, what=f"heartbeat {beat} seen, the controllers idle",
                    state=waiting)  # fmt: skip
    writes = machine_status_writes(control_plane) - before
    assert writes == 0, f"{writes} Machine status writes for {BEATS} heartbeats of {HOSTS} Nodes"
