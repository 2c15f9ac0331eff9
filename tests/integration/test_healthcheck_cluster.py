"""The health check and Cluster API's Cluster on the real API server (issue 11 point 2):
where ``clusters.cluster.x-k8s.io`` is served, nodeStartupTimeout counts from the
Cluster becoming ready and no Machine is judged before it is; where it is not served,
nothing changes and nothing warns. The Cluster CRD is a test fixture
(tests/fixtures/cluster.x-k8s.io_clusters.yaml): metalmend does not ship it."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, Client
from lightkube.codecs import load_all_yaml
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.types import PatchType

from metalmend.api.resources import Machine, MachineHealthCheck
from metalmend.controllers import clusters
from metalmend.controllers.clusters import Cluster
from metalmend.controllers.healthcheck import setup
from metalmend.kube.crds import FIELD_MANAGER, wait_established
from metalmend.kube.discovery import serves
from metalmend.kube.manager import Manager
from metalmend.settings import RuntimeSettings, Settings
from tests.support import until

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "cluster.x-k8s.io_clusters.yaml"
CRD_NAME = "clusters.cluster.x-k8s.io"
STARTUP = 30  # seconds: the checks' nodeStartupTimeout (the CRD's least)
# The controller's clock runs this far ahead of the API server's: a Machine the test has
# just created is, to the health check, an hour old (a BareMetalHost long in provisioning)
# without the test waiting for it.
AHEAD = dt.timedelta(hours=1)


class Ahead:
    """The controller's clock, AHEAD of the real one."""

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) + AHEAD


def controller_now() -> dt.datetime:
    return Ahead().now()


@pytest.fixture
async def cluster_kind(kube: Client, aclient: AsyncClient) -> AsyncIterator[Callable[[], None]]:
    """Installs the Cluster CRD when called (at the start of a test, or later); removes it
    after the test, and waits until the API server no longer serves it. Ask for it before
    ``running``, so that the controller has stopped before its Clusters go away."""
    installed: list[bool] = []

    def install() -> None:
        kube.apply(load_all_yaml(FIXTURE.read_text())[0], field_manager=FIELD_MANAGER, force=True)
        wait_established(kube, [CRD_NAME], 30)
        installed.append(True)

    yield install
    if installed:
        kube.delete(CustomResourceDefinition, CRD_NAME)
        await until(lambda: _not_served(aclient), within=60)


async def _not_served(client: AsyncClient) -> bool:
    return await serves(client, clusters.GROUP_VERSION, "clusters") is False


@pytest.fixture
async def running(
    aclient: AsyncClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Manager]:
    monkeypatch.setattr(clusters, "DISCOVERY_INTERVAL", 0.5)  # a CRD installed later: soon
    manager = Manager(aclient, clock=Ahead())
    setup(manager, Settings(runtime=RuntimeSettings(namespace=namespace)))
    task = asyncio.create_task(manager.run())
    await manager.wait_synced()
    yield manager
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def rfc3339(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def machine_without_node(client: AsyncClient, namespace: str, name: str = "m1") -> None:
    await client.create(
        Machine(metadata=ObjectMeta(name=name, labels={"role": "worker"}), spec={"clusterName": "c"}),
        namespace=namespace,
    )  # fmt: skip


async def cluster(
    client: AsyncClient, namespace: str, infrastructure: bool, ready_since: dt.datetime
) -> None:
    """Cluster ``c``: ControlPlaneInitialized=True and InfrastructureReady as asked, both
    since ``ready_since``."""
    with contextlib.suppress(ApiError):  # already there: only its status changes
        await client.create(Cluster(metadata=ObjectMeta(name="c"), spec={}), namespace=namespace)
    since = rfc3339(ready_since)
    conditions = [
        {"type": "ControlPlaneInitialized", "status": "True", "lastTransitionTime": since},
        {"type": "InfrastructureReady", "status": "True" if infrastructure else "False",
         "lastTransitionTime": since},
    ]  # fmt: skip
    await client.patch(
        Cluster.Status, "c", {"status": {"conditions": conditions}},
        namespace=namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip


async def health_check(client: AsyncClient, namespace: str, cluster_name: str = "c") -> None:
    spec = {
        "clusterName": cluster_name,
        "selector": {"matchLabels": {"role": "worker"}},
        "nodeStartupTimeout": f"{STARTUP}s",
        "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "5m"}],
    }
    await client.create(
        MachineHealthCheck(metadata=ObjectMeta(name=f"workers-{cluster_name}"), spec=spec),
        namespace=namespace,
    )


async def machine_conditions(client: AsyncClient, namespace: str) -> dict[str, Any]:
    obj: Any = await client.get(Machine, "m1", namespace=namespace)
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def evaluated(client: AsyncClient, namespace: str) -> Callable[[], Awaitable[bool]]:
    """The check has judged its one Machine not healthy (waiting or unhealthy)."""

    async def check() -> bool:
        obj: Any = await client.get(MachineHealthCheck, "workers-c", namespace=namespace)
        status = obj.get("status") or {}
        return status.get("expectedMachines") == 1 and status.get("currentHealthy") == 0

    return check


def remediated(client: AsyncClient, namespace: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        found = await machine_conditions(client, namespace)
        return bool(found.get("OwnerRemediated", {}).get("status") == "False")

    return check


async def still_waiting(client: AsyncClient, namespace: str, seconds: float) -> None:
    """Nothing is written on the Machine for ``seconds`` (waiting: not remediated)."""
    loop = asyncio.get_running_loop()
    until_then = loop.time() + seconds
    while loop.time() < until_then:
        assert await machine_conditions(client, namespace) == {}
        await asyncio.sleep(0.2)


async def test_a_machine_created_long_ago_waits_for_its_node_when_its_cluster_became_ready_recently(
    cluster_kind: Callable[[], None], aclient: AsyncClient, namespace: str, running: Manager
) -> None:
    """A BareMetalHost that took longer than nodeStartupTimeout to provision is not
    replaced: the timeout counts from its Cluster becoming ready, as Cluster API."""
    cluster_kind()
    ready_since = controller_now() - dt.timedelta(seconds=5)
    await cluster(aclient, namespace, infrastructure=True, ready_since=ready_since)
    await machine_without_node(aclient, namespace)  # an hour old, to the controller
    await health_check(aclient, namespace)
    await until(evaluated(aclient, namespace), within=10)
    await still_waiting(aclient, namespace, 2)


async def test_without_the_cluster_kind_the_same_machine_times_out_from_its_creation_silently(
    aclient: AsyncClient, namespace: str, running: Manager, caplog: pytest.LogCaptureFixture
) -> None:
    """Where Cluster API's Cluster is not served, the health check judges as before, and
    says nothing about the kind it does not find."""
    caplog.set_level(logging.INFO)
    assert await _not_served(aclient)
    await machine_without_node(aclient, namespace)
    await health_check(aclient, namespace)
    await until(remediated(aclient, namespace), within=10)
    verdict = (await machine_conditions(aclient, namespace))["HealthCheckSucceeded"]
    assert verdict["reason"] == "NodeStartupTimeout"
    assert "after creation" in verdict["message"]
    noisy = [r for r in caplog.records if r.name.startswith("metalmend") and (
        r.levelno >= logging.WARNING or "Cluster" in r.getMessage())]  # fmt: skip
    assert noisy == [], [r.getMessage() for r in noisy]


async def test_a_cluster_kind_installed_later_is_read_and_holds_machines_until_it_is_ready(
    cluster_kind: Callable[[], None], aclient: AsyncClient, namespace: str, running: Manager
) -> None:
    """The CRD appears while metalmend runs (discovery is asked again); a Machine of a
    Cluster whose infrastructure is not ready is not judged, as Cluster API; the Cluster
    becoming ready wakes its check."""
    await health_check(aclient, namespace, cluster_name="elsewhere")  # discovers: not served

    async def judged_elsewhere() -> bool:
        obj: Any = await aclient.get(MachineHealthCheck, "workers-elsewhere", namespace=namespace)
        return (obj.get("status") or {}).get("expectedMachines") == 0

    await until(judged_elsewhere, within=10)
    cluster_kind()
    long_ago = controller_now() - dt.timedelta(hours=2)
    await cluster(aclient, namespace, infrastructure=False, ready_since=long_ago)
    await asyncio.sleep(2)  # discovery, every 0.5 s here, finds the kind served
    await machine_without_node(aclient, namespace)  # an hour old: unhealthy, if judged
    await health_check(aclient, namespace)
    await until(evaluated(aclient, namespace), within=10)
    await still_waiting(aclient, namespace, 2)
    await cluster(aclient, namespace, infrastructure=True, ready_since=long_ago)
    await until(remediated(aclient, namespace), within=10)
    verdict = (await machine_conditions(aclient, namespace))["HealthCheckSucceeded"]
    assert verdict["reason"] == "NodeStartupTimeout"


async def test_a_paused_cluster_pauses_its_health_checks_until_unpaused(
    cluster_kind: Callable[[], None], aclient: AsyncClient, namespace: str, running: Manager
) -> None:
    """As Cluster API (``clusterctl move`` pauses a Cluster while its objects move)."""
    cluster_kind()
    await aclient.create(
        Cluster(metadata=ObjectMeta(name="c"), spec={"paused": True}), namespace=namespace
    )
    long_ago = controller_now() - dt.timedelta(hours=2)
    await cluster(aclient, namespace, infrastructure=True, ready_since=long_ago)
    await machine_without_node(aclient, namespace)  # an hour old: unhealthy, if judged
    await health_check(aclient, namespace)
    await asyncio.sleep(2)
    check: Any = await aclient.get(MachineHealthCheck, "workers-c", namespace=namespace)
    assert not check.get("status")
    assert await machine_conditions(aclient, namespace) == {}
    await aclient.patch(Cluster, "c", {"spec": {"paused": False}},
                        namespace=namespace, patch_type=PatchType.MERGE)  # fmt: skip
    await until(remediated(aclient, namespace), within=10)
