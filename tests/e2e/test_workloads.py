"""Workloads run in the lab: the real scheduler places a StatefulSet's pods on the hosts'
Nodes and each host's kubelet runs them. A hung host's pod turns not Ready once its Node is
Unknown, yet stays where it is: the StatefulSet controller does not start a second copy
while the first may still be running (the at-most-one guarantee that fencing must resolve).
Recovered, the same pod is Ready again, never restarted."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Namespace, Node, Pod

from metalmend_lab import lab
from tests.e2e.conftest import LAB_GRACE
from tests.support import until

SILENCE = LAB_GRACE + 20  # grace period plus the controller's monitor period and slack
WATCHED = 5.0  # seconds we watch for a second copy once the first is not Ready


def stateful_set(replicas: int) -> Any:
    labels = {"app": "db"}
    return StatefulSet.from_dict(
        {
            "metadata": {"name": "db"},
            "spec": {
                "replicas": replicas,
                "serviceName": "db",
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "affinity": {
                            "podAntiAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": [
                                    {
                                        "labelSelector": {"matchLabels": labels},
                                        "topologyKey": "kubernetes.io/hostname",
                                    }
                                ]
                            }
                        },
                        "containers": [{"name": "db", "image": "registry.invalid/metalmend/db:1"}],
                    },
                },
            },
        }
    )


def condition(obj: Any, kind: str) -> str:
    conditions = (obj.status.conditions if obj.status else None) or []
    return next((c.status for c in conditions if c.type == kind), "-")


@pytest.fixture
async def kube(hosts_lab: lab.RunningLab) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(hosts_lab.kubeconfig))
    yield client
    await client.close()


@pytest.fixture
async def namespace(kube: AsyncClient) -> AsyncIterator[str]:
    """A namespace of its own; deleted, and its pods seen gone, so the shared lab's hosts
    run nothing afterwards."""
    name = f"workloads-{secrets.token_hex(3)}"
    await kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    await kube.delete(Namespace, name)

    async def no_pods() -> bool:
        return not [p async for p in kube.list(Pod, namespace=name)]

    await until(no_pods, within=30)


def pods_reported(lab_dir: Path) -> dict[str, int]:
    """What `metalmend lab status` says each host runs (the hardware reports every 0.2 s)."""
    return {h.name: h.pods for h in lab.status(lab_dir).hosts}


async def pods(kube: AsyncClient, namespace: str) -> dict[str, Any]:
    return {p.metadata.name: p async for p in kube.list(Pod, namespace=namespace)}


async def test_a_stateful_pod_on_a_hung_host_waits_and_recovers_in_place(
    hosts_lab: lab.RunningLab, kube: AsyncClient, namespace: str
) -> None:
    lab_dir = hosts_lab.plane.workdir.parent
    assert hosts_lab.hardware is not None
    hosts = {h.name for h in hosts_lab.hardware.hosts}
    for name in hosts:  # an earlier test may have just power-cycled one
        await until(lambda name=name: _node_ready(kube, name, "True"), within=30)
    await kube.create(stateful_set(replicas=2), namespace=namespace)

    async def all_running() -> bool:
        found = await pods(kube, namespace)
        return len(found) == 2 and all(
            p.status.phase == "Running" and condition(p, "Ready") == "True" for p in found.values()
        )

    await until(all_running, within=60)
    running = await pods(kube, namespace)
    placed = {name: p.spec.nodeName for name, p in running.items()}
    assert set(placed.values()) == hosts  # one per host (anti-affinity), each on a lab Node
    for p in running.values():
        assert p.status.podIP
        assert p.status.hostIP == "127.0.0.1"
        (container,) = p.status.containerStatuses
        assert container.ready
        assert container.restartCount == 0
        assert container.state.running is not None
    await until(lambda: pods_reported(lab_dir) == dict.fromkeys(hosts, 1), within=5)

    victim = running["db-0"]
    hung, healthy = victim.spec.nodeName, running["db-1"].spec.nodeName
    lab.inject_fault(lab_dir, hung, "hang")
    try:
        began = time.monotonic()

        async def not_ready() -> bool:
            return condition(await kube.get(Pod, "db-0", namespace=namespace), "Ready") == "False"

        await until(not_ready, within=SILENCE)
        not_ready_after = time.monotonic() - began
        assert await _node_ready(kube, hung, "Unknown")
        # At most one: nobody deletes the pod or starts another db-0, here or elsewhere.
        watch_until = time.monotonic() + WATCHED
        while time.monotonic() < watch_until:
            now = await pods(kube, namespace)
            assert set(now) == {"db-0", "db-1"}
            assert now["db-0"].metadata.uid == victim.metadata.uid
            assert now["db-0"].metadata.deletionTimestamp is None
            assert now["db-0"].spec.nodeName == hung
            assert condition(now["db-1"], "Ready") == "True"
            await asyncio.sleep(0.5)
        assert pods_reported(lab_dir) == dict.fromkeys(hosts, 1)  # a hung kernel's still run
    finally:
        lab.inject_fault(lab_dir, hung, "recover")

    async def ready_again() -> bool:
        return condition(await kube.get(Pod, "db-0", namespace=namespace), "Ready") == "True"

    await until(ready_again, within=30)
    back = await kube.get(Pod, "db-0", namespace=namespace)
    assert back.metadata.uid == victim.metadata.uid
    assert back.spec.nodeName == hung
    assert back.status.phase == "Running"
    # A hang is not a reboot: the same containers, never restarted.
    assert back.status.containerStatuses == victim.status.containerStatuses
    assert (await kube.get(Pod, "db-1", namespace=namespace)).spec.nodeName == healthy

    # Deleted, the pods go: each kubelet confirms its pod stopped.
    await kube.delete(StatefulSet, "db", namespace=namespace)

    async def gone() -> bool:
        return not await pods(kube, namespace)

    await until(gone, within=30)
    print(f"pod not Ready {not_ready_after:.1f} s after the hang (grace {LAB_GRACE:g} s)")


async def _node_ready(kube: AsyncClient, name: str, status: str) -> bool:
    with contextlib.suppress(ApiError):
        return condition(await kube.get(Node, name), "Ready") == status
    return False
