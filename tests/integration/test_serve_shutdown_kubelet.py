"""shutdown-kubelet against the real API server, with the DaemonSet of
deploy/teardown/shutdown-kubelet.yaml run by the real DaemonSet controller and scheduler,
and the lab's kubelet simulator as the kubelet (it stops when that DaemonSet's pod lands on
its Node, as the pod makes a real kubelet stop). The service runs as the ServiceAccount of
deploy/rbac/serve.yaml; callers are real tokens."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from lightkube import ApiError, AsyncClient, Client, KubeConfig, codecs
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node

from metalmend.serve.app import create_app
from metalmend.serve.root import compose
from metalmend.teardown.policy.settings import TeardownSettings
from metalmend_lab.controlplane import ControlPlane
from metalmend_lab.inventory import HostSpec
from metalmend_lab.kubeletsim import KubeletSim
from tests.integration.test_serve_promenade import (
    PROMENADE,
    bearer,
    lines,
    serve_kubeconfig,
    status_of,
    token,
)

SHUTDOWN_DAEMONSET = (
    Path(__file__).resolve().parents[2] / "deploy" / "teardown" / "shutdown-kubelet.yaml"
)
SETTINGS = TeardownSettings(kubelet_stopped_after=2.0, shutdown_kubelet_timeout=20.0)

__all__ = ["serve_kubeconfig"]  # a fixture, used by name


@pytest.fixture
async def http(serve_kubeconfig: Path) -> AsyncIterator[httpx.AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(serve_kubeconfig))
    app = create_app(compose(client, SETTINGS))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=60) as h:
        yield h
    await client.close()


@pytest.fixture
def admin(control_plane: ControlPlane, kube: Client, namespace: str) -> str:
    return token(control_plane, kube, namespace, "teardown-admin", "metalmend-promenade-admin")


@pytest.fixture
def daemonset(kube: Client) -> None:
    for obj in codecs.load_all_yaml(SHUTDOWN_DAEMONSET.read_text()):
        kube.apply(obj, force=True)


def delete_node(kube: Client, name: str) -> None:
    with contextlib.suppress(ApiError):
        kube.delete(Node, name)


@pytest.fixture
async def kubelet(
    control_plane: ControlPlane, kube: Client, namespace: str, daemonset: None
) -> AsyncIterator[KubeletSim]:
    """The lab's kubelet on a powered-on host: registers its Node, renews its Lease."""
    name = f"{namespace}-host"
    spec = HostSpec(
        name=name, namespace=namespace, bmc="ipmi", bmc_port=0, internal_port=0,
        username="", password="", provider_id=f"metal3://{namespace}/{name}",
        kubeconfig=str(control_plane.user_kubeconfig(f"system:node:{name}", ["system:nodes"])),
        boot_delay=0.0,
    )  # fmt: skip

    async def powered() -> int:
        return 1

    sim = KubeletSim(spec, powered)
    task = asyncio.create_task(sim.run())
    try:
        for _ in range(100):
            if sim.state == "running":
                break
            await asyncio.sleep(0.1)
        yield sim
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        delete_node(kube, name)


async def renew_lease(aclient: AsyncClient, node: str) -> None:
    """A kubelet that keeps renewing its Lease whatever runs on its Node."""
    meta = ObjectMeta(name=node, namespace="kube-node-lease")
    while True:
        spec = LeaseSpec(holderIdentity=node, renewTime=dt.datetime.now(dt.UTC))
        try:
            lease = await aclient.get(Lease, node, namespace="kube-node-lease")
            lease.spec = spec
            await aclient.replace(lease)
        except ApiError:
            await aclient.create(Lease(metadata=meta, spec=spec))
        await asyncio.sleep(0.3)


@pytest.fixture
def bare_node(kube: Client, namespace: str) -> Iterator[str]:
    name = f"{namespace}-node"
    kube.create(Node(metadata=ObjectMeta(name=name)))
    yield name
    delete_node(kube, name)


async def test_shutdown_kubelet_labels_the_node_and_succeeds_once_the_kubelet_stopped(
    http: httpx.AsyncClient, kube: Client, admin: str, kubelet: KubeletSim
) -> None:
    name = kubelet.spec.name
    assert kubelet.state == "running"
    answer = await http.post(f"{PROMENADE}/nodes/{name}/shutdown-kubelet", headers=bearer(admin))
    document = status_of(answer, 200, "Success")
    said = lines(document)
    assert said[0] == f"node/{name} labelled promenade-decomission=enabled"
    assert said[1].startswith(f"node/{name} kubelet stopped: its Lease has not been renewed")
    assert kubelet.disabled  # the DaemonSet's pod did it
    assert kubelet.state == "disabled"
    labels = kube.get(Node, name).metadata.labels
    assert labels["promenade-decomission"] == "enabled"

    again = await http.post(f"{PROMENADE}/nodes/{name}/shutdown-kubelet", headers=bearer(admin))
    assert lines(status_of(again, 200, "Success"))[0].startswith(f"node/{name} kubelet stopped")


async def test_a_kubelet_that_keeps_running_fails_naming_what_the_cluster_shows(
    http: httpx.AsyncClient,
    aclient: AsyncClient,
    kube: Client,
    admin: str,
    bare_node: str,
    daemonset: None,
) -> None:
    beating = asyncio.create_task(renew_lease(aclient, bare_node))
    try:
        answer = await http.post(
            f"{PROMENADE}/nodes/{bare_node}/shutdown-kubelet", headers=bearer(admin)
        )
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
    document = status_of(answer, 500, "ShutdownKubeletError")
    assert document["message"] == (
        f"the kubelet of Node {bare_node} was not seen stopped within 20 s"
    )
    errors = [m["message"] for m in document["details"]["messageList"] if m["error"]]
    assert errors[0].startswith(f"the kubelet of Node {bare_node} still renews its Lease")
    # The DaemonSet made a pod for the Node, which cannot take it (it offers no capacity).
    assert errors[1].startswith("shutdown-kubelet pod metalmend-system/metalmend-shutdown-kubelet-")
    assert "is Pending, not scheduled: 0/" in errors[1]


async def test_a_node_whose_kubelet_never_ran_is_stopped_at_once(
    http: httpx.AsyncClient, admin: str, bare_node: str
) -> None:
    answer = await http.post(
        f"{PROMENADE}/nodes/{bare_node}/shutdown-kubelet", headers=bearer(admin)
    )
    assert lines(status_of(answer, 200, "Success"))[1] == (
        f"node/{bare_node} kubelet stopped: the Node has no Lease and never reported status"
    )


async def test_the_drain_role_may_not_shut_a_kubelet_down(
    http: httpx.AsyncClient, control_plane: ControlPlane, kube: Client, namespace: str,
    bare_node: str,
) -> None:  # fmt: skip
    drainer = token(control_plane, kube, namespace, "drainer", "metalmend-promenade-drain")
    answer = await http.post(
        f"{PROMENADE}/nodes/{bare_node}/shutdown-kubelet", headers=bearer(drainer)
    )
    assert "create nodes/shutdown-kubelet" in status_of(answer, 403, "Forbidden")["message"]
    assert kube.get(Node, bare_node).metadata.labels is None  # nothing was done


async def test_shutdown_kubelet_of_an_unknown_node_is_404_and_takes_no_parameters(
    http: httpx.AsyncClient, admin: str, namespace: str, bare_node: str
) -> None:
    answer = await http.post(
        f"{PROMENADE}/nodes/{namespace}-nowhere/shutdown-kubelet", headers=bearer(admin)
    )
    status_of(answer, 404, "NotFound")
    typo = await http.post(
        f"{PROMENADE}/nodes/{bare_node}/shutdown-kubelet?timeout=5", headers=bearer(admin)
    )
    assert "unknown query parameter 'timeout'" in status_of(typo, 400, "BadRequest")["message"]
