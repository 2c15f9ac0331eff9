"""OpenShift's machine-api Machines (``machine.openshift.io/v1beta1``, the CRD of the
machine-api-operator module ``make openshift`` builds from) on the real API server, read by
the same controllers as Cluster API's through controllers/machines.py: the Machine and Node
as OpenShift's metal3 provider makes them (the host annotation, the providerID
``baremetalhost:///<ns>/<host>/<uid>``, the host's consumerRef naming the Machine), node-link
setting ``status.nodeRef``, and the reboot.metal3.io/machine-remediation flow across a
restart: confirm off, fence (the Node deleted), power on, the request removed."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import secrets
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.reboot import is_reboot_annotation
from metalmend.api.resources import MACHINE_KINDS, BareMetalHost, OpenShiftMachine
from metalmend.api.stamps import stamp
from metalmend.controllers import Setup, machineremediation, nodelink
from metalmend.controllers import machines as machine_kinds
from metalmend.kube.crds import install_crds
from metalmend.kube.manager import Manager
from metalmend.policy.fencing import POWERED_OFF_FOR
from metalmend.settings import FenceMethod, RemediationSettings, RuntimeSettings, Settings
from metalmend_lab import assets
from metalmend_lab.controlplane import ControlPlane
from tests.support import until


@pytest.fixture(scope="module")
def openshift_crds(kube_module: Client, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OpenShift's Machine CRD, unmodified, from the `make openshift` cache (never built
    here, under a test's timeout): the test fails naming the target when it is missing."""
    try:
        found = assets.openshift_assets()
    except assets.AssetsError as error:
        pytest.fail(f"OpenShift's machine-api CRDs are missing (make openshift): {error}")
    directory = tmp_path_factory.mktemp("openshift-crds")
    shutil.copy(found.machine_crd, directory)
    install_crds(kube_module, directory)
    return directory


@pytest.fixture(scope="module")
def kube_module(control_plane: ControlPlane) -> Client:
    return Client(KubeConfig.from_file(control_plane.kubeconfig), field_manager="metalmend-tests")


class Running:
    """Managers as `metalmend run` makes them: the Machine kinds, and CAPM3's Metal3Machines,
    read where served."""

    def __init__(self, client: AsyncClient, namespace: str) -> None:
        self.client, self.namespace = client, namespace
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self, *setups: Setup) -> None:
        manager = Manager(self.client)
        machine_kinds.use_kinds(manager, await machine_kinds.served_machine_kinds(self.client))
        machine_kinds.use_metal3machines(
            manager, await machine_kinds.served_metal3machines(self.client)
        )
        settings = Settings(
            runtime=RuntimeSettings(namespace=self.namespace),
            remediation=RemediationSettings(fence=FenceMethod.DELETE_NODE),
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
async def running(
    aclient: AsyncClient, namespace: str, openshift_crds: Path
) -> AsyncIterator[Running]:
    made = Running(aclient, namespace)
    yield made
    await made.kill()


async def _get(client: AsyncClient, resource: Any, name: str, namespace: str | None) -> Any:
    try:
        return await client.get(resource, name, namespace=namespace)
    except ApiError as error:
        if error.status.code == 404:
            return None
        raise


async def openshift_machine(
    client: AsyncClient, ns: str, name: str, host: str, *, consumer_uid: str | None = None
) -> tuple[Any, Any, str]:
    """A host, its OpenShift Machine and the Node, as OpenShift's metal3 provider makes them:
    the providerID names the host by namespace, name and uid."""
    made: Any = await client.create(
        BareMetalHost(metadata=ObjectMeta(name=host), spec={"online": True}), namespace=ns
    )
    provider = f"baremetalhost:///{ns}/{host}/{made.metadata.uid}"
    machine: Any = await client.create(
        OpenShiftMachine(
            metadata=ObjectMeta(name=name, annotations={names.MACHINE_HOST: f"{ns}/{host}"}),
            spec={"providerID": provider},
        ),
        namespace=ns,
    )
    consumer = {"apiVersion": "machine.openshift.io/v1beta1", "kind": "Machine", "name": name,
                "namespace": ns, "uid": consumer_uid or machine.metadata.uid}  # fmt: skip
    await client.patch(BareMetalHost, host, {"spec": {"consumerRef": consumer}}, namespace=ns,
                       patch_type=PatchType.MERGE)  # fmt: skip
    await power(client, ns, host, on=True)
    node_name = f"{ns}-{name}"
    await client.create(
        Node(metadata=ObjectMeta(name=node_name), spec=NodeSpec(providerID=provider))
    )
    return machine, made, node_name


async def power(client: AsyncClient, ns: str, host: str, on: bool) -> None:
    """Report the host's power as host-power would (off: for the reboot keys on it now)."""
    now = dt.datetime.now(dt.UTC)
    provisioning: dict[str, Any] = {"state": "provisioned",
                                    "lastPoweredOn": stamp(now - dt.timedelta(hours=1))}  # fmt: skip
    listed = None
    if not on:
        provisioning["pendingRebootSince"] = stamp(now)
        found = await _get(client, BareMetalHost, host, ns)
        keys = [k for k in (found.metadata.annotations or {}) if is_reboot_annotation(k)]
        listed = sorted(k for k in keys if k != names.REBOOT) or None
    status = {"poweredOn": on, "operationalStatus": "OK", "provisioning": provisioning,
              POWERED_OFF_FOR: listed}  # fmt: skip
    await client.patch(BareMetalHost.Status, host, {"status": status}, namespace=ns,
                       patch_type=PatchType.MERGE)  # fmt: skip


async def test_both_machine_kinds_are_read_where_both_are_served(
    aclient: AsyncClient, openshift_crds: Path
) -> None:
    assert await machine_kinds.served_machine_kinds(aclient) == MACHINE_KINDS


async def test_openshift_machine_is_linked_and_remediated_by_annotation_across_a_restart(
    aclient: AsyncClient, namespace: str, running: Running
) -> None:
    ns = namespace
    await running.start(nodelink.setup, machineremediation.setup)
    _, _, node_name = await openshift_machine(aclient, ns, "worker-0", "host-0")

    async def node_ref() -> str | None:
        found = await _get(aclient, OpenShiftMachine, "worker-0", ns)
        return ((found.get("status") or {}).get("nodeRef") or {}).get("name")

    async def linked() -> bool:
        return await node_ref() == node_name

    await until(linked)
    # OpenShift's MachineHealthCheck (external-baremetal strategy) asks by this annotation
    await aclient.patch(
        OpenShiftMachine, "worker-0",
        {"metadata": {"annotations": {names.EXTERNAL_REMEDIATION: ""}}},
        namespace=ns, patch_type=PatchType.MERGE,
    )  # fmt: skip

    async def host_has_reboot_key() -> bool:
        host = await _get(aclient, BareMetalHost, "host-0", ns)
        return names.MACHINE_REMEDIATION_REBOOT in (host.metadata.annotations or {})

    await until(host_has_reboot_key)
    await running.kill()  # resumes from the annotations alone
    await running.start(nodelink.setup, machineremediation.setup)
    assert await _get(aclient, Node, node_name, None) is not None  # not before it is off
    await power(aclient, ns, "host-0", on=False)

    async def node_gone() -> bool:
        return await _get(aclient, Node, node_name, None) is None

    await until(node_gone)

    async def request_removed() -> bool:
        found = await _get(aclient, OpenShiftMachine, "worker-0", ns)
        return names.EXTERNAL_REMEDIATION not in (found.metadata.annotations or {})

    async def host_released() -> bool:
        return not await host_has_reboot_key()

    await until(request_removed)
    await until(host_released)


async def test_a_providerid_of_a_host_made_again_under_that_name_links_nothing(
    aclient: AsyncClient, namespace: str, running: Running
) -> None:
    """The uid in ``baremetalhost:///<ns>/<host>/<uid>`` must be the host's: a Machine
    whose providerID names an older host of that name gets no nodeRef, and is told why."""
    ns = namespace
    await running.start(nodelink.setup)
    host: Any = await aclient.create(
        BareMetalHost(metadata=ObjectMeta(name="host-1"), spec={"online": True}), namespace=ns
    )
    stale = f"baremetalhost:///{ns}/host-1/{uuid.uuid4()}"  # an older host's uid
    machine: Any = await aclient.create(
        OpenShiftMachine(
            metadata=ObjectMeta(name="worker-1", annotations={names.MACHINE_HOST: f"{ns}/host-1"}),
            spec={"providerID": stale},
        ),
        namespace=ns,
    )
    consumer = {"apiVersion": "machine.openshift.io/v1beta1", "kind": "Machine",
                "name": "worker-1", "namespace": ns, "uid": machine.metadata.uid}  # fmt: skip
    await aclient.patch(BareMetalHost, "host-1", {"spec": {"consumerRef": consumer}},
                        namespace=ns, patch_type=PatchType.MERGE)  # fmt: skip
    node_name = f"{ns}-worker-1"
    await aclient.create(Node(metadata=ObjectMeta(name=node_name), spec=NodeSpec(providerID=stale)))
    try:

        async def refused() -> bool:
            found = await _get(aclient, OpenShiftMachine, "worker-1", ns)
            conditions = (found.get("status") or {}).get("conditions") or []
            return any(c.get("status") == "False" for c in conditions)

        await until(refused)
        found = await _get(aclient, OpenShiftMachine, "worker-1", ns)
        assert not (found.get("status") or {}).get("nodeRef")
        assert host.metadata.uid not in stale
    finally:
        await aclient.delete(Node, node_name)


@pytest.fixture
def tenant(kube: Client) -> Iterator[str]:
    """Another namespace, where a tenant may make OpenShift Machines."""
    name = f"tenant-{secrets.token_hex(3)}"
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    kube.delete(Namespace, name)


async def test_an_openshift_machine_never_acts_on_a_host_of_another_namespace(
    aclient: AsyncClient, namespace: str, tenant: str, openshift_crds: Path
) -> None:
    """A tenant's Machine in its own namespace names the victim's host (annotation and the
    providerID with that host's very uid), and asks for remediation as OpenShift's check
    does; the controllers run cluster-wide, as deployed. The host is never touched; the
    Machine is told why (docs/security.md, "Kubernetes objects")."""
    running = Running(aclient, None)  # every namespace
    _, victim_host, victim_node = await openshift_machine(aclient, namespace, "worker-0", "host-0")
    provider = f"baremetalhost:///{namespace}/host-0/{victim_host.metadata.uid}"
    await aclient.create(
        OpenShiftMachine(
            metadata=ObjectMeta(
                name="thief",
                annotations={names.MACHINE_HOST: f"{namespace}/host-0",
                             names.EXTERNAL_REMEDIATION: ""},
            ),
            spec={"providerID": provider},
        ),
        namespace=tenant,
    )  # fmt: skip
    try:
        await running.start(nodelink.setup, machineremediation.setup)

        async def refused() -> bool:
            found = await _get(aclient, OpenShiftMachine, "thief", tenant)
            conditions = (found.get("status") or {}).get("conditions") or []
            return any(
                c.get("type") == names.CONDITION_HOST_LINK
                and c.get("status") == "False"
                and c.get("reason") == "HostInOtherNamespace"
                for c in conditions
            )

        await until(refused)
        thief = await _get(aclient, OpenShiftMachine, "thief", tenant)
        assert not (thief.get("status") or {}).get("nodeRef")
        host = await _get(aclient, BareMetalHost, "host-0", namespace)
        assert not any(is_reboot_annotation(k) for k in host.metadata.annotations or {})
        assert await _get(aclient, Node, victim_node, None) is not None
    finally:
        await running.kill()
        with contextlib.suppress(ApiError):
            await aclient.delete(Node, victim_node)
