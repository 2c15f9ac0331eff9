"""The lab's hosts behave like servers: a hung kernel or a powered-off host goes silent and
the real node-lifecycle controller marks its Node Unknown; power restored, it is Ready."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Node

from metalmend.api.resources import BareMetalHost, Machine
from metalmend.bmc import BmcError, BmcPool, PowerState
from metalmend.bmc.settings import BmcSettings
from metalmend_lab import lab
from metalmend_lab.hosts import NAMESPACE
from tests.e2e.conftest import LAB_GRACE, host, target
from tests.support import until

SILENCE = LAB_GRACE + 20  # grace period plus the controller's monitor period and slack
COMEBACK = 30  # power change (1-11 s for Redfish) + boot delay + a status post


async def ready_status(client: AsyncClient, name: str) -> str:
    try:
        node: Any = await client.get(Node, name)
    except ApiError as error:
        if error.status.code == 404:
            return "absent"
        raise
    conditions = (node.status.conditions if node.status else None) or []
    return next((c.status for c in conditions if c.type == "Ready"), "-")


@pytest.fixture
async def kube(hosts_lab: lab.RunningLab) -> Any:
    client = AsyncClient(KubeConfig.from_file(hosts_lab.kubeconfig))
    yield client
    await client.close()


async def test_every_host_has_its_objects_and_a_ready_node(
    hosts_lab: lab.RunningLab, kube: AsyncClient
) -> None:
    assert hosts_lab.hardware is not None
    for spec in hosts_lab.hardware.hosts:
        bmh: Any = await kube.get(BareMetalHost, spec.name, namespace=NAMESPACE)
        assert bmh["spec"]["bmc"]["address"] == spec.address
        assert bmh["spec"]["consumerRef"]["name"] == spec.name
        assert bmh["status"]["provisioning"]["state"] == "provisioned"
        machine: Any = await kube.get(Machine, spec.name, namespace=NAMESPACE)
        assert machine.metadata.annotations["metal3.io/BareMetalHost"] == f"{NAMESPACE}/{spec.name}"

        async def linked(name: str = spec.name) -> bool:
            m: Any = await kube.get(Machine, name, namespace=NAMESPACE)
            return ((m.get("status") or {}).get("nodeRef") or {}).get("name") == name

        await until(linked, within=30)  # node-link, running as `metalmend run`

        async def ready(name: str = spec.name) -> bool:
            return await _is(kube, name, "True")

        await until(ready, within=30)


async def _is(kube: AsyncClient, name: str, status: str) -> bool:
    return await ready_status(kube, name) == status


@pytest.mark.parametrize("kind", ["ipmi", "redfish"])
async def test_a_hung_host_goes_unknown_and_recovers(
    hosts_lab: lab.RunningLab, kube: AsyncClient, kind: str
) -> None:
    name = host(hosts_lab, kind).name
    await until(lambda: _is(kube, name, "True"), within=COMEBACK)
    lab.inject_fault(hosts_lab.plane.workdir.parent, name, "hang")
    await until(lambda: _is(kube, name, "Unknown"), within=SILENCE)
    lab.inject_fault(hosts_lab.plane.workdir.parent, name, "recover")
    await until(lambda: _is(kube, name, "True"), within=COMEBACK)


@pytest.mark.parametrize("kind", ["ipmi", "redfish"])
async def test_power_off_silences_the_node_and_power_on_brings_it_back(
    hosts_lab: lab.RunningLab, kube: AsyncClient, kind: str
) -> None:
    spec = host(hosts_lab, kind)
    bmcs = BmcPool(BmcSettings(timeout=10, ca_bundle=str(hosts_lab.plane.ca.pair.cert)))
    bmc = target(spec)
    try:
        await until(lambda: _is(kube, spec.name, "True"), within=COMEBACK)
        await bmcs.power_off(bmc, hard=True)
        await until(lambda: _is(kube, spec.name, "Unknown"), within=SILENCE + 11)
        assert await bmcs.power_state(bmc) == PowerState.OFF
        await kube.delete(Node, spec.name)  # as remediation would: it registers again
        await bmcs.power_on(bmc)
        await until(lambda: _is(kube, spec.name, "True"), within=COMEBACK)
    finally:
        if await bmcs.power_state(bmc) == PowerState.OFF:
            await bmcs.power_on(bmc)
        await bmcs.close()


async def test_bmc_down_is_reported_and_unreachable_to_the_driver(
    hosts_lab: lab.RunningLab,
) -> None:
    spec = host(hosts_lab, "redfish")
    lab_dir = hosts_lab.plane.workdir.parent
    bmcs = BmcPool(BmcSettings(timeout=3, ca_bundle=str(hosts_lab.plane.ca.pair.cert)))
    try:
        lab.inject_fault(lab_dir, spec.name, "bmc-down")
        await asyncio.sleep(0.5)
        report = {h.name: h for h in lab.status(lab_dir).hosts}
        assert report[spec.name].bmc_reachable is False
        with pytest.raises(BmcError, match=r"cannot reach|did not answer"):
            await bmcs.power_state(target(spec))
        lab.inject_fault(lab_dir, spec.name, "bmc-up")
        await asyncio.sleep(0.5)
        assert await bmcs.power_state(target(spec)) == PowerState.ON
        assert {h.name: h for h in lab.status(lab_dir).hosts}[spec.name].bmc_reachable
    finally:
        lab.inject_fault(lab_dir, spec.name, "bmc-up")
        await bmcs.close()


async def test_even_a_brief_power_cycle_cures_a_hang(
    hosts_lab: lab.RunningLab, kube: AsyncClient
) -> None:
    """The kubelet must see a new boot however short the power was off (a regression:
    an off shorter than one heartbeat used to leave the host hung)."""
    spec = host(hosts_lab, "ipmi")
    lab_dir = hosts_lab.plane.workdir.parent
    bmcs = BmcPool(BmcSettings(timeout=10))
    bmc = target(spec)
    try:
        await until(lambda: _is(kube, spec.name, "True"), within=COMEBACK)
        lab.inject_fault(lab_dir, spec.name, "hang")
        await until(lambda: _is(kube, spec.name, "Unknown"), within=SILENCE)
        await bmcs.power_off(bmc, hard=True)
        await bmcs.power_on(bmc)  # at once: off for milliseconds
        await until(lambda: _is(kube, spec.name, "True"), within=COMEBACK)
    finally:
        lab.inject_fault(lab_dir, spec.name, "recover")
        await bmcs.close()
