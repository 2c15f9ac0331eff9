"""No Machine status write at rest, whatever the Nodes' heartbeats (at 5,000 hosts the scale
benchmark saw 5 Machine status writes a second beside kwok's Node heartbeats:
docs/scale.md). The scale lab's shape in small, on the real API server: hosts registered as
``lab up`` registers them, Nodes as kwok keeps them, one check over every Machine with the
lab's remediation template, and every controller that writes Machines; then Node status
heartbeats as kwok and kubelets send them: a new ``lastHeartbeatTime``, the same
conditions. Writes are counted by the API server itself (``apiserver_request_total``)."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import pytest
from lightkube import AsyncClient, Client
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta
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


@pytest.fixture
async def lab(kube: Client, namespace: str) -> AsyncIterator[list[str]]:
    """HOSTS hosts as the scale benchmark registers them (its Machine, BareMetalHost and
    BMC Secret; its Node for kwok, with the host's providerID, Ready as kwok makes it), and
    one check over them all with the lab's template. Yields the Node names."""
    names = [f"{namespace}-w{i}" for i in range(HOSTS)]
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
    try:
        yield names
    finally:
        for name in names:
            kube.delete(Node, name)


@pytest.fixture
async def controllers(aclient: AsyncClient, namespace: str) -> AsyncIterator[Manager]:
    """Every controller of `metalmend run` that writes Machines (host-power writes hosts
    only, and needs BMCs)."""
    manager = Manager(aclient)
    settings = Settings(runtime=RuntimeSettings(namespace=namespace))
    for setup in (nodelink.setup, healthcheck.setup, remediation.setup, machineremediation.setup):
        setup(manager, settings)
    task = asyncio.create_task(manager.run())
    await manager.wait_synced()
    yield manager
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def idle(manager: Manager) -> bool:
    return all(len(c.queue) == 0 and c.queue.in_progress == 0 for c in manager.controllers)


async def test_node_heartbeats_write_no_machine_status(
    aclient: AsyncClient,
    namespace: str,
    control_plane: ControlPlane,
    lab: list[str],
    controllers: Manager,
) -> None:
    async def reconciled() -> bool:
        machines = [m async for m in aclient.list(Machine, namespace=namespace)]
        return len(machines) == HOSTS and all(
            (m.get("status") or {}).get("nodeRef")
            and any(
                c.get("type") == "HealthCheckSucceeded" and c.get("status") == "True"
                for c in (m.get("status") or {}).get("conditions") or []
            )
            for m in machines
        )

    await until(reconciled, within=60)
    await until(lambda: idle(controllers), within=30)
    before = machine_status_writes(control_plane)
    nodes = controllers.informer(Node).store
    start = dt.datetime.now(dt.UTC)
    for beat in range(1, BEATS + 1):
        moment = start + dt.timedelta(minutes=beat)  # a new lastHeartbeatTime each time
        written: dict[str, int] = {}
        for name in lab:
            node: Any = await aclient.get(Node, name)
            node = await aclient.patch(Node.Status, name, kwok_status(node, moment),
                                       patch_type=PatchType.STRATEGIC)  # fmt: skip
            written[name] = int(node.metadata.resourceVersion)

        def seen_and_done(written: dict[str, int] = written) -> bool:
            cached = {name: nodes.get(name) for name in written}
            return all(
                node is not None and int(node.metadata.resourceVersion) >= written[name]
                for name, node in cached.items()
            ) and idle(controllers)

        await until(seen_and_done, within=30)
    writes = machine_status_writes(control_plane) - before
    assert writes == 0, f"{writes} Machine status writes for {BEATS} heartbeats of {HOSTS} Nodes"
