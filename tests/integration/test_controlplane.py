"""The lab control plane itself: RBAC, restarts, and the controllers of kube-controller-manager
that metalmend relies on (garbage collection, disruption budgets, node lifecycle)."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.core_v1 import NodeCondition, NodeStatus
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta, OwnerReference
from lightkube.models.policy_v1 import PodDisruptionBudgetSpec
from lightkube.models.rbac_v1 import Subject
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Node
from lightkube.resources.policy_v1 import PodDisruptionBudget

from metalmend_lab.controlplane import ControlPlane
from tests.support import Deadline, grant


def eventually(check: Callable[[], bool], timeout: float, interval: float = 0.2) -> None:
    deadline = Deadline(timeout)
    while not check():
        if deadline.expired():
            raise AssertionError(f"not true after {timeout}s")
        time.sleep(interval)


def grant_configmap_reader(kube: Client, namespace: str, subject: Subject) -> None:
    grant(
        kube, namespace, "read-configmaps", subject, resources=["configmaps"], verbs=["get", "list"]
    )


def forbidden(client: Client, namespace: str) -> bool:
    try:
        client.list(ConfigMap, namespace=namespace).__iter__().__next__()
    except ApiError as error:
        if error.status.code == 403:
            return True
        raise
    except StopIteration:
        pass
    return False


def test_minted_user_without_rights_is_forbidden_until_granted(
    control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    alice = Client(KubeConfig.from_file(control_plane.user_kubeconfig("alice", ["team-a"])))
    assert forbidden(alice, namespace)
    grant_configmap_reader(kube, namespace, Subject(kind="Group", name="team-a"))
    eventually(lambda: not forbidden(alice, namespace), timeout=10)


def test_minted_service_account_token_is_subject_to_rbac(
    control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    robot = Client(
        KubeConfig.from_file(control_plane.service_account_kubeconfig(namespace, "robot"))
    )
    assert forbidden(robot, namespace)
    grant_configmap_reader(
        kube, namespace, Subject(kind="ServiceAccount", name="robot", namespace=namespace)
    )
    eventually(lambda: not forbidden(robot, namespace), timeout=10)


async def test_watch_resumes_across_an_apiserver_restart(
    control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    """The fixture restarts kube-apiserver on the same port with the same certificates and
    data. A client that reconnects, and re-lists when the new watch cache answers 410 Gone
    (as client-go's reflector does), ends with exactly what the server holds."""
    client = AsyncClient(KubeConfig.from_file(control_plane.kubeconfig))
    store: dict[str, str] = {}
    kube.create(ConfigMap(metadata=ObjectMeta(name="before")), namespace=namespace)

    async def relist() -> str:
        listing = client.list(ConfigMap, namespace=namespace)
        store.clear()
        async for obj in listing:
            store[obj.metadata.name] = obj.metadata.resourceVersion
        return str(listing.resourceVersion)

    async def follow() -> None:
        version: str | None = None
        while "after" not in store:
            try:
                version = version or await relist()
                async for kind, obj in client.watch(
                    ConfigMap, namespace=namespace, resource_version=version
                ):
                    version = obj.metadata.resourceVersion
                    if kind == "DELETED":
                        store.pop(obj.metadata.name, None)
                    else:
                        store[obj.metadata.name] = version
                    if "after" in store:
                        return
            except ApiError as error:
                if error.status.code != 410:
                    raise
                version = None  # history gone: list again
            except httpx2.HTTPError:  # the server is restarting
                await asyncio.sleep(0.2)

    follower = asyncio.create_task(follow())
    kube.create(ConfigMap(metadata=ObjectMeta(name="during")), namespace=namespace)
    await asyncio.sleep(0.5)
    await asyncio.to_thread(control_plane.restart_apiserver)
    kube = Client(KubeConfig.from_file(control_plane.kubeconfig))  # fresh connections
    kube.create(ConfigMap(metadata=ObjectMeta(name="after")), namespace=namespace)
    await asyncio.wait_for(follower, timeout=30)
    await client.close()
    truth = {
        c.metadata.name: c.metadata.resourceVersion
        for c in kube.list(ConfigMap, namespace=namespace)
    }
    assert store == truth
    assert {"before", "during", "after"} <= set(store)


def test_garbage_collector_deletes_dependents(kube: Client, namespace: str) -> None:
    owner = kube.create(ConfigMap(metadata=ObjectMeta(name="owner")), namespace=namespace)
    reference = OwnerReference(
        apiVersion="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
    )
    kube.create(
        ConfigMap(metadata=ObjectMeta(name="dependent", ownerReferences=[reference])),
        namespace=namespace,
    )
    kube.delete(ConfigMap, "owner", namespace=namespace)

    def collected() -> bool:
        try:
            kube.get(ConfigMap, "dependent", namespace=namespace)
        except ApiError as error:
            return error.status.code == 404
        return False

    eventually(collected, timeout=30)


def test_disruption_controller_computes_budgets(kube: Client, namespace: str) -> None:
    kube.create(
        PodDisruptionBudget(
            metadata=ObjectMeta(name="db"),
            spec=PodDisruptionBudgetSpec(
                minAvailable=1, selector=LabelSelector(matchLabels={"app": "db"})
            ),
        ),
        namespace=namespace,
    )

    def observed() -> bool:
        status = kube.get(PodDisruptionBudget, "db", namespace=namespace).status
        return status is not None and status.observedGeneration == 1

    eventually(observed, timeout=30)


def test_node_lifecycle_marks_a_silent_node_unknown(
    control_plane: ControlPlane, kube: Client
) -> None:
    grace = control_plane.config.node_monitor_grace_period
    name = f"silent-{int(time.time() * 1000)}"
    now = dt.datetime.now(dt.UTC)
    kube.create(Node(metadata=ObjectMeta(name=name)))
    kube.create(
        Lease(
            metadata=ObjectMeta(name=name),
            spec=LeaseSpec(holderIdentity=name, leaseDurationSeconds=40, renewTime=now),
        ),
        namespace="kube-node-lease",
    )
    ready = NodeCondition(
        type="Ready",
        status="True",
        reason="KubeletReady",
        lastHeartbeatTime=now,
        lastTransitionTime=now,
    )
    kube.patch(Node.Status, name, {"status": NodeStatus(conditions=[ready]).to_dict()})

    def ready_status() -> str:
        conditions = kube.get(Node, name).status.conditions or []
        return next(c.status for c in conditions if c.type == "Ready")

    began = time.monotonic()
    eventually(lambda: ready_status() == "Unknown", timeout=grace + 30)
    assert time.monotonic() - began >= grace - 1.0
    kube.delete(Node, name)


@pytest.mark.parametrize(
    "component", ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]
)
def test_components_listen_on_loopback_only(control_plane: ControlPlane, component: str) -> None:
    pid = control_plane.components[component].pid
    assert pid is not None
    inodes = {
        line.split()[9]: line.split()[1]
        for path in ("/proc/net/tcp", "/proc/net/tcp6")
        for line in Path(path).read_text().splitlines()[1:]
        if line.split()[3] == "0A"  # LISTEN
    }
    sockets = {
        os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1]
        for fd in os.listdir(f"/proc/{pid}/fd")
        if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")
    }
    listening = [inodes[i] for i in sockets if i in inodes]
    assert listening
    assert all(address.startswith("0100007F:") for address in listening), listening
