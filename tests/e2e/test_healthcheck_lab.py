"""Health checks end to end: a hung host's Node goes Unknown (the real node-lifecycle
controller), and after the check's timeout a Metal3Remediation appears; recovered, it goes.
With 3 of 5 hung and maxUnhealthy 40%, nothing is remediated and the condition says why.
A Node deleted under its Machine, with node-link running, is remediated at once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node

from metalmend.api.resources import (
    Machine,
    MachineHealthCheck,
    Metal3Remediation,
    Metal3RemediationTemplate,
)
from metalmend_lab import lab
from metalmend_lab.hosts import NAMESPACE
from tests.support import until

GRACE = 6.0
TIMEOUT = 4  # seconds Ready=Unknown must last
SILENCE = GRACE + 20 + TIMEOUT


@pytest.fixture(scope="module")
def five_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("mhc-lab"), node_monitor_grace_period=GRACE, hosts=5,
        bmc="ipmi", boot_delay=1.0, controllers="node-link,machine-health-check",
    )  # fmt: skip
    with lab.started(options) as running:
        yield running


@pytest.fixture
async def kube(five_hosts: lab.RunningLab) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(five_hosts.kubeconfig))
    yield client
    for name in ("workers", "fence"):
        for resource in (MachineHealthCheck, Metal3RemediationTemplate):
            with contextlib.suppress(ApiError):
                await client.delete(resource, name, namespace=NAMESPACE)
    await client.close()


async def create_check(client: AsyncClient, **spec: Any) -> None:
    await client.create(
        Metal3RemediationTemplate(
            metadata=ObjectMeta(name="fence"), spec={"template": {"spec": {"strategy": "reboot"}}}
        ),
        namespace=NAMESPACE,
    )
    body = {
        "clusterName": "lab",
        "selector": {"matchLabels": {"role": "worker"}},
        "unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": f"{TIMEOUT}s"}],
        "remediationTemplate": {
            "apiVersion": "remediation.metal3.io/v1alpha1", "kind": "Metal3RemediationTemplate",
            "name": "fence",
        },
        **spec,
    }  # fmt: skip
    await client.create(
        MachineHealthCheck(metadata=ObjectMeta(name="workers"), spec=body), namespace=NAMESPACE
    )


async def remediation(client: AsyncClient, name: str) -> Any | None:
    try:
        return await client.get(Metal3Remediation, name, namespace=NAMESPACE)
    except ApiError:
        return None


async def check_status(client: AsyncClient) -> dict[str, Any]:
    obj: Any = await client.get(MachineHealthCheck, "workers", namespace=NAMESPACE)
    return dict(obj.get("status") or {})


async def all_healthy(client: AsyncClient, count: int) -> bool:
    try:
        return (await check_status(client)).get("currentHealthy") == count
    except ApiError:
        return False


async def test_a_hung_host_gets_a_remediation_that_goes_when_it_recovers(
    five_hosts: lab.RunningLab, kube: AsyncClient
) -> None:
    lab_dir = five_hosts.plane.workdir.parent
    await create_check(kube, maxUnhealthy="40%")
    await until(lambda: all_healthy(kube, 5), within=60)
    lab.inject_fault(lab_dir, "worker-0", "hang")
    try:
        await until(lambda: _present(kube, "worker-0"), within=SILENCE)
        created: Any = await remediation(kube, "worker-0")
        assert created.metadata.ownerReferences[0].name == "worker-0"
        assert await remediation(kube, "worker-1") is None
    finally:
        lab.inject_fault(lab_dir, "worker-0", "recover")
    await until(lambda: _absent(kube, "worker-0"), within=30)


async def test_three_of_five_hung_with_max_unhealthy_40_percent_remediates_nothing(
    five_hosts: lab.RunningLab, kube: AsyncClient
) -> None:
    lab_dir = five_hosts.plane.workdir.parent
    await create_check(kube, maxUnhealthy="40%")
    await until(lambda: all_healthy(kube, 5), within=60)
    hung = ["worker-1", "worker-2", "worker-3"]
    for name in hung:
        lab.inject_fault(lab_dir, name, "hang")
    try:

        async def blocked() -> bool:
            conditions = {c["type"]: c for c in (await check_status(kube)).get("conditions", [])}
            allowed = conditions.get("RemediationAllowed", {})
            return allowed.get("status") == "False" and "3 unhealthy" in allowed.get("message", "")

        await until(blocked, within=SILENCE)
        for name in hung:
            assert await remediation(kube, name) is None, "the short-circuit let one through"
    finally:
        for name in hung:
            lab.inject_fault(lab_dir, name, "recover")
    await until(lambda: all_healthy(kube, 5), within=60)


async def _present(client: AsyncClient, name: str) -> bool:
    return await remediation(client, name) is not None


async def _absent(client: AsyncClient, name: str) -> bool:
    return await remediation(client, name) is None


async def test_a_node_deleted_under_its_machine_is_remediated_at_once(
    five_hosts: lab.RunningLab, kube: AsyncClient
) -> None:
    """Issue 11 point 3, with node-link running: nodeRef keeps naming the deleted Node
    (node-link, like Cluster API, never clears it), so the check finds it missing at once,
    even with nodeStartupTimeout 0, long before a Node condition timeout could expire."""
    await create_check(kube, maxUnhealthy="40%", nodeStartupTimeout="0")
    await until(lambda: all_healthy(kube, 5), within=60)
    machine: Any = await kube.get(Machine, "worker-4", namespace=NAMESPACE)
    node_name = machine["status"]["nodeRef"]["name"]
    node: Any = await kube.get(Node, node_name)
    began = asyncio.get_running_loop().time()
    await kube.delete(Node, node_name)
    try:
        await until(lambda: _present(kube, "worker-4"), within=GRACE + TIMEOUT)
        assert asyncio.get_running_loop().time() - began < GRACE, "not at once"
        machine = await kube.get(Machine, "worker-4", namespace=NAMESPACE)
        assert machine["status"]["nodeRef"]["name"] == node_name
    finally:
        # The lab's kubelet registers once per boot: give it its Node back.
        back = Node(
            metadata=ObjectMeta(name=node_name, labels=node.metadata.labels), spec=node.spec
        )
        await kube.create(back)
    await until(lambda: _absent(kube, "worker-4"), within=30)
