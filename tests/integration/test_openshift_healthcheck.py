"""OpenShift's own MachineHealthCheck controller driving metalmend's remediation, on the
real API server: the real ``machine-healthcheck`` (github.com/openshift/machine-api-operator
``cmd/machine-healthcheck``, built by ``make openshift``, with the module's machine-api CRDs)
judges a ``machine.openshift.io/v1beta1`` Machine unhealthy once its Node stops
heartbeating (kube-controller-manager marks it Ready Unknown) and asks for remediation both
ways it can: the ``external-baremetal`` strategy (``host.metal3.io/external-remediation`` on
the Machine: metalmend's machine-remediation) and ``spec.remediationTemplate`` naming a
FenceRemediationTemplate (a FenceRemediation named after the Machine, owned by it:
metalmend's fence-remediation). metalmend holds the host off, is killed and restarted, and
deletes the Node only once the host is reported off (the test plays host-power, as
tests/integration/test_remediation.py does); the Node comes back, heartbeats, and OpenShift's
check counts the Machine healthy again (and deletes the FenceRemediation it made).

The lab's real BMCs and kubelets are not here (tests/e2e drives those)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.resources import (
    BareMetalHost,
    FenceRemediation,
    FenceRemediationTemplate,
    OpenShiftMachine,
)
from metalmend.controllers import fenceremediation, machineremediation, nodelink
from metalmend_lab import assets, openshift
from metalmend_lab.controlplane import Component, ControlPlane
from tests.integration.test_openshift_machines import Running, _get, openshift_machine, power
from tests.support import until

TEMPLATE_API = "remediation.metalmend.dev/v1alpha1"
SELECTOR = {"role": "worker"}


@pytest.fixture(scope="module")
def openshift_assets(control_plane: ControlPlane) -> assets.OpenShiftAssets:
    """The cached build (never built here, under a test's timeout) and its CRDs applied;
    the test fails naming ``make openshift`` when it is missing."""
    try:
        found = assets.openshift_assets()
    except assets.AssetsError as error:
        pytest.fail(f"OpenShift's machine-healthcheck is missing (make openshift): {error}")
    openshift.install_crds(Client(KubeConfig.from_file(control_plane.kubeconfig)), found)
    return found


@pytest.fixture
def checker(
    openshift_assets: assets.OpenShiftAssets,
    control_plane: ControlPlane,
    namespace: str,
    tmp_path: Path,
) -> Iterator[Component]:
    """OpenShift's machine-healthcheck, watching the test's namespace."""
    component = openshift.HealthCheck(
        openshift_assets, control_plane.kubeconfig, tmp_path / "mhc", namespace
    ).start()
    yield component
    component.stop()


@pytest.fixture
async def running(aclient: AsyncClient, namespace: str) -> AsyncIterator[Running]:
    made = Running(aclient, namespace)
    yield made
    await made.kill()


class Heartbeat:
    """A kubelet's status heartbeat for one Node (Ready True, every second) while on."""

    def __init__(self, client: AsyncClient, node: str) -> None:
        self.client, self.node = client, node
        self.task: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        while True:
            now = dt.datetime.now(dt.UTC).isoformat()
            ready = {"type": "Ready", "status": "True", "reason": "KubeletReady",
                     "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
            with contextlib.suppress(ApiError):  # the Node deleted: nothing to beat for
                node = await self.client.get(Node, self.node)
                kept = [c for c in (node.status.conditions or []) if c.type == "Ready"]
                if kept and kept[0].status == "True" and kept[0].lastTransitionTime:
                    ready["lastTransitionTime"] = kept[0].lastTransitionTime.isoformat()
                await self.client.patch(Node.Status, self.node, {"status": {"conditions": [ready]}})
            await asyncio.sleep(1.0)

    def start(self) -> None:
        self.task = asyncio.create_task(self._beat())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None


@pytest.fixture
async def heartbeats() -> AsyncIterator[list[Heartbeat]]:
    made: list[Heartbeat] = []
    yield made
    for beat in made:
        await beat.stop()


async def machine_health_check(
    client: AsyncClient, ns: str, *, template: bool, max_unhealthy: str = "100%"
) -> None:
    """OpenShift's MachineHealthCheck: Ready Unknown or False for 1 s; remediation by
    metalmend's FenceRemediationTemplate, or by the external-baremetal annotation."""
    spec: dict[str, Any] = {
        "selector": {"matchLabels": SELECTOR},
        "unhealthyConditions": [
            {"type": "Ready", "status": "Unknown", "timeout": "1s"},
            {"type": "Ready", "status": "False", "timeout": "1s"},
        ],
        "maxUnhealthy": max_unhealthy,
    }
    annotations = {}
    if template:
        spec["remediationTemplate"] = {
            "apiVersion": TEMPLATE_API, "kind": "FenceRemediationTemplate", "name": "fence",
        }  # fmt: skip
        body = {"strategy": "reboot", "powerOffTimeoutSeconds": 120, "powerOnTimeoutSeconds": 120}
        await client.create(
            FenceRemediationTemplate(
                metadata=ObjectMeta(name="fence"), spec={"template": {"spec": body}}
            ),
            namespace=ns,
        )
    else:
        annotations[openshift.REMEDIATION_STRATEGY] = openshift.EXTERNAL_BAREMETAL
    await client.create(
        openshift.MachineHealthCheck(
            metadata=ObjectMeta(name="workers", annotations=annotations), spec=spec
        ),
        namespace=ns,
    )


async def worker(
    client: AsyncClient, ns: str, name: str, host: str, heartbeats: list[Heartbeat]
) -> str:
    """An OpenShift Machine (labelled for the check), its host and its heartbeating Node."""
    _, _, node = await openshift_machine(client, ns, name, host)
    await client.patch(
        OpenShiftMachine, name, {"metadata": {"labels": SELECTOR}},
        namespace=ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    beat = Heartbeat(client, node)
    beat.start()
    heartbeats.append(beat)
    return node


async def _not(check: Any) -> bool:
    return not await check


async def check_counts(client: AsyncClient, ns: str) -> tuple[Any, Any]:
    found = await _get(client, openshift.MachineHealthCheck, "workers", ns)
    status = (found.get("status") or {}) if found else {}
    return status.get("expectedMachines"), status.get("currentHealthy")


def counts_are(client: AsyncClient, ns: str, wanted: tuple[int, int]) -> Any:
    async def check() -> bool:
        return await check_counts(client, ns) == wanted

    return check


async def ready_condition(client: AsyncClient, node: str) -> Any:
    """The Node's Ready condition (None: the Node or its condition missing)."""
    found = await _get(client, Node, node, None)
    conditions = (found.status.conditions if found and found.status else None) or []
    return next((c for c in conditions if c.type == "Ready"), None)


async def ready_is(client: AsyncClient, node: str, status: str) -> bool:
    condition = await ready_condition(client, node)
    return condition is not None and condition.status == status


async def node_ref(client: AsyncClient, ns: str, name: str) -> str | None:
    found = await _get(client, OpenShiftMachine, name, ns)
    return ((found.get("status") or {}).get("nodeRef") or {}).get("name") if found else None


async def back_again(
    client: AsyncClient, ns: str, name: str, node: str, heartbeats: list[Heartbeat]
) -> None:
    """The server powered on: its kubelet registers the Node again and heartbeats."""
    machine = await _get(client, OpenShiftMachine, name, ns)
    provider = machine["spec"]["providerID"]
    await client.create(Node(metadata=ObjectMeta(name=node), spec=NodeSpec(providerID=provider)))
    beat = Heartbeat(client, node)
    beat.start()
    heartbeats.append(beat)


@pytest.mark.timeout(600)
async def test_openshift_check_external_baremetal_strategy_is_fenced_by_metalmend(
    aclient: AsyncClient,
    namespace: str,
    running: Running,
    checker: Component,
    heartbeats: list[Heartbeat],
) -> None:
    ns = namespace
    await running.start(nodelink.setup, machineremediation.setup)
    await machine_health_check(aclient, ns, template=False)
    node = await worker(aclient, ns, "worker-0", "host-0", heartbeats)

    async def linked() -> bool:
        return await node_ref(aclient, ns, "worker-0") == node

    await until(linked)
    await until(counts_are(aclient, ns, (1, 1)))  # OpenShift's check: healthy

    await heartbeats[0].stop()  # the server hangs: its kubelet goes silent

    async def asked() -> bool:
        found = await _get(aclient, OpenShiftMachine, "worker-0", ns)
        return names.EXTERNAL_REMEDIATION in (found.metadata.annotations or {})

    await until(asked)  # by OpenShift's check, not by the test

    async def held_off() -> bool:
        host = await _get(aclient, BareMetalHost, "host-0", ns)
        return names.MACHINE_REMEDIATION_REBOOT in (host.metadata.annotations or {})

    await until(held_off)
    # OpenShift's check is stopped until the Node is back: it reads a Machine whose Node
    # is missing as unhealthy and asks again at once (it does not read metalmend's
    # metalmend.dev/remediation-ended-at, as metalmend's own check does), and the server
    # is power-cycled again as soon as it reads on (docs/install.md, OpenShift). Stopped
    # and started again, it resumes from the objects, as metalmend does.
    checker.stop()
    await running.kill()  # metalmend dies with the request made: resumes from the objects
    await running.start(nodelink.setup, machineremediation.setup)
    assert await _get(aclient, Node, node, None) is not None, "the Node outlived the server"
    await power(aclient, ns, "host-0", on=False)

    async def node_gone() -> bool:
        return await _get(aclient, Node, node, None) is None

    await until(node_gone)

    async def request_removed() -> bool:
        found = await _get(aclient, OpenShiftMachine, "worker-0", ns)
        return names.EXTERNAL_REMEDIATION not in (found.metadata.annotations or {})

    await until(request_removed)
    await until(lambda: _not(held_off()))  # the reboot key withdrawn: the server powers on
    await power(aclient, ns, "host-0", on=True)
    await back_again(aclient, ns, "worker-0", node, heartbeats)
    checker.start()
    await until(counts_are(aclient, ns, (1, 1)))  # healthy again, by OpenShift's check
    assert not await asked()


@pytest.mark.timeout(600)
async def test_openshift_check_remediation_template_is_fenced_by_metalmend(
    aclient: AsyncClient,
    namespace: str,
    running: Running,
    checker: Component,
    heartbeats: list[Heartbeat],
) -> None:
    ns = namespace
    await running.start(nodelink.setup, fenceremediation.setup)
    await machine_health_check(aclient, ns, template=True)
    node = await worker(aclient, ns, "worker-0", "host-0", heartbeats)

    async def linked() -> bool:
        return await node_ref(aclient, ns, "worker-0") == node

    await until(linked)
    await until(counts_are(aclient, ns, (1, 1)))
    machine = await _get(aclient, OpenShiftMachine, "worker-0", ns)

    await heartbeats[0].stop()

    async def requested() -> bool:
        return await _get(aclient, FenceRemediation, "worker-0", ns) is not None

    await until(requested)  # made by OpenShift's check from the template
    request = await _get(aclient, FenceRemediation, "worker-0", ns)
    (owner,) = request.metadata.ownerReferences
    assert (owner.apiVersion, owner.kind, owner.uid) == (
        "machine.openshift.io/v1beta1", "Machine", machine.metadata.uid,
    )  # fmt: skip
    key = f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}{request.metadata.uid}"

    async def held_off() -> bool:
        host = await _get(aclient, BareMetalHost, "host-0", ns)
        return key in (host.metadata.annotations or {})

    await until(held_off)
    await running.kill()
    await running.start(nodelink.setup, fenceremediation.setup)
    assert await _get(aclient, Node, node, None) is not None, "the Node outlived the server"
    await power(aclient, ns, "host-0", on=False)

    async def node_gone() -> bool:
        return await _get(aclient, Node, node, None) is None

    await until(node_gone)

    async def released() -> bool:
        return not await held_off()

    await until(released)
    await power(aclient, ns, "host-0", on=True)
    await back_again(aclient, ns, "worker-0", node, heartbeats)
    await until(counts_are(aclient, ns, (1, 1)))

    async def request_deleted() -> bool:  # by OpenShift's check, the Machine healthy again
        return await _get(aclient, FenceRemediation, "worker-0", ns) is None

    await until(request_deleted)


@pytest.mark.timeout(600)
async def test_openshift_check_short_circuits_and_metalmend_does_nothing(
    aclient: AsyncClient,
    namespace: str,
    running: Running,
    checker: Component,
    heartbeats: list[Heartbeat],
) -> None:
    """2 of 3 hung with ``maxUnhealthy: 1``: OpenShift's check asks for nothing (its
    RemediationAllowed condition False), so no host is touched."""
    ns = namespace
    await running.start(nodelink.setup, fenceremediation.setup)
    await machine_health_check(aclient, ns, template=True, max_unhealthy="1")
    nodes = [await worker(aclient, ns, f"worker-{i}", f"host-{i}", heartbeats) for i in range(3)]

    async def all_linked() -> bool:
        refs = [await node_ref(aclient, ns, f"worker-{i}") for i in range(3)]
        return refs == nodes

    await until(all_linked)
    await until(counts_are(aclient, ns, (3, 3)))
    # Both servers hang while OpenShift's check is stopped, and it starts again once both
    # Nodes are Ready Unknown: its first look (its caches listed afresh) sees 2 of 3
    # unhealthy at once. Left running, it could look between the two Nodes' turns (the
    # Node lifecycle controller marks each after its own grace period, seconds apart on a
    # busy machine), find 1 unhealthy (within maxUnhealthy) and rightly remediate it.
    checker.stop()
    await heartbeats[0].stop()
    await heartbeats[1].stop()
    for hung in nodes[:2]:
        await until(
            lambda hung=hung: ready_is(aclient, hung, "Unknown"),
            what=f"Node {hung} Ready Unknown (its heartbeats stopped)",
            state=lambda hung=hung: ready_condition(aclient, hung),
        )
    checker.start()

    async def short_circuited() -> bool:
        found = await _get(aclient, openshift.MachineHealthCheck, "workers", ns)
        conditions = ((found.get("status") or {}) if found else {}).get("conditions") or []
        allowed = next((c for c in conditions if c.get("type") == "RemediationAllowed"), {})
        return allowed.get("status") == "False"

    await until(short_circuited, what="OpenShift's check: RemediationAllowed False")
    await until(counts_are(aclient, ns, (3, 1)), what="OpenShift's check counting 3, 1 healthy",
                state=lambda: check_counts(aclient, ns))  # fmt: skip
    for i in range(3):
        assert await _get(aclient, FenceRemediation, f"worker-{i}", ns) is None
        host = await _get(aclient, BareMetalHost, f"host-{i}", ns)
        assert not [k for k in (host.metadata.annotations or {}) if k.startswith("reboot.")]
        assert await _get(aclient, Node, nodes[i], None) is not None
