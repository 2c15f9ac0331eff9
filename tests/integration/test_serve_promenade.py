"""``metalmend serve``'s Promenade endpoints against the real API server, the service
running with the ServiceAccount and ClusterRole of deploy/rbac/serve.yaml and nothing
more; callers are real ServiceAccount tokens, authorized through the ClusterRoles shipped
in the same file."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import ApiError, AsyncClient, Client, KubeConfig, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import RoleRef, Subject
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding
from lightkube.types import PatchType

from metalmend.serve.app import create_app
from metalmend.serve.root import compose
from metalmend.teardown import drain as nodes
from metalmend.teardown.params import DrainRequest
from metalmend.teardown.policy.settings import TeardownSettings
from metalmend.web.conventions import status_line
from metalmend_lab.controlplane import ControlPlane
from tests.support import Deadline

SERVE_RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac" / "serve.yaml"
PROMENADE = "/promenade/api/v1.0"


# ---- the service and its callers -------------------------------------------------------


@pytest.fixture
def serve_kubeconfig(control_plane: ControlPlane, kube: Client) -> Path:
    for obj in codecs.load_all_yaml(SERVE_RBAC.read_text()):
        kube.apply(obj, force=True)
    return control_plane.service_account_kubeconfig("metalmend-system", "metalmend-serve")


@pytest.fixture
async def http(serve_kubeconfig: Path) -> AsyncIterator[httpx.AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(serve_kubeconfig))
    app = create_app(compose(client, TeardownSettings(eviction_retry=0.5)))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=60) as h:
        yield h
    await client.close()


def token(
    control_plane: ControlPlane, kube: Client, namespace: str, name: str, role: str | None
) -> str:
    """A real token of ServiceAccount ``namespace/name``, bound to ClusterRole ``role``."""
    path = control_plane.service_account_kubeconfig(namespace, name)
    if role is not None:
        kube.create(
            ClusterRoleBinding(
                metadata=ObjectMeta(name=f"{namespace}-{name}"),
                roleRef=RoleRef(
                    apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name=role
                ),
                subjects=[Subject(kind="ServiceAccount", name=name, namespace=namespace)],
            )
        )
    value: str = yaml.safe_load(path.read_text())["users"][0]["user"]["token"]
    return value


@pytest.fixture
def admin_token(control_plane: ControlPlane, kube: Client, namespace: str) -> str:
    return token(control_plane, kube, namespace, "teardown-admin", "metalmend-promenade-admin")


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


def status_of(answer: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    """The Status body of ``answer``: YAML on Deckhand's API, as Deckhand's errors; JSON on
    every other."""
    document: dict[str, Any]
    if answer.request.url.path.startswith("/deckhand/"):
        assert answer.headers["content-type"] == "application/x-yaml", answer.text
        document = yaml.safe_load(answer.text)
    else:
        document = answer.json()
    # Shipyard writes code as its status line ("409 Conflict"); every other API, a number.
    written = status_line(code) if answer.request.url.path.startswith("/shipyard/") else code
    assert (answer.status_code, document["code"], document["reason"]) == (code, written, reason), (
        document
    )
    assert document["kind"] == "Status"
    assert document["status"] == ("Success" if code < 400 else "Failure")
    return document


def lines(document: dict[str, Any]) -> list[str]:
    return [m["message"] for m in document["details"]["messageList"]]


# ---- the cluster: a Node and pods bound to it ------------------------------------------


@pytest.fixture
def node(kube: Client, namespace: str) -> Iterator[str]:
    name = f"{namespace}-node"
    kube.create(Node(metadata=ObjectMeta(name=name, labels={"drain-test": name})))
    yield name
    with contextlib.suppress(ApiError):  # removed by the test
        kube.delete(Node, name)


def make_pod(kube: Client, namespace: str, node: str, name: str, **extra: Any) -> Pod:
    spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}],
                            "terminationGracePeriodSeconds": 30}  # fmt: skip
    spec.update(extra.pop("spec", {}))
    document = {"apiVersion": "v1", "kind": "Pod", "spec": spec,
                "metadata": {"name": name, "namespace": namespace, **extra}}  # fmt: skip
    return kube.create(codecs.from_dict(document))


def set_status(kube: Client, namespace: str, name: str, phase: str, ready: bool = False) -> None:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    kube.patch(Pod.Status, name, {"status": {"phase": phase, "conditions": conditions}},
               namespace=namespace, patch_type=PatchType.MERGE)  # fmt: skip


def pods_on(kube: Client, node: str) -> set[str]:
    return {f"{p.metadata.namespace}/{p.metadata.name}"
            for p in kube.list(Pod, namespace="*", fields={"spec.nodeName": node})}  # fmt: skip


def wait_for(check: Any, within: float = 30.0) -> None:
    deadline = Deadline(within)
    while not check():
        assert not deadline.expired(), "timed out"
        time.sleep(0.1)


def budget_blocks(kube: Client, namespace: str, name: str) -> None:
    """A PodDisruptionBudget minAvailable 1 over the pods labelled app=web, once its status
    (the disruption controller's) allows no disruption."""
    document = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}}  # fmt: skip
    kube.create(codecs.from_dict(document))

    def settled() -> bool:
        status = kube.get(PodDisruptionBudget, name, namespace=namespace).status
        return bool(status and status.observedGeneration and status.expectedPods == 1
                    and status.disruptionsAllowed == 0)  # fmt: skip

    wait_for(settled)


async def kubelet(
    aclient: AsyncClient,
    node: str,
    delay: float,
    seen: dict[str, int | None],
    stamps: dict[str, Any] | None = None,
) -> None:
    """What a kubelet does with an evicted pod, in short: ``delay`` seconds after its
    deletion began, stop it and remove it; ``seen`` records each grace period asked,
    ``stamps`` each deletionTimestamp (eviction time + grace period)."""
    while True:
        async for pod in aclient.list(Pod, namespace="*", fields={"spec.nodeName": node}):
            meta = pod.metadata
            if meta.deletionTimestamp is None:
                continue
            key = f"{meta.namespace}/{meta.name}"
            if key not in seen:
                seen[key] = meta.deletionGracePeriodSeconds
                if stamps is not None:
                    stamps[key] = meta.deletionTimestamp
                asyncio.get_running_loop().call_later(
                    delay, lambda n=meta.name, ns=meta.namespace: asyncio.ensure_future(
                        aclient.delete(Pod, n, namespace=ns, grace_period=0)))  # fmt: skip
        await asyncio.sleep(0.1)


# ---- authentication and authorization ---------------------------------------------------


async def test_a_token_the_api_server_does_not_know_is_refused_401(
    http: httpx.AsyncClient, node: str
) -> None:
    answer = await http.post(f"{PROMENADE}/nodes/{node}/drain", headers=bearer("not-a-token"))
    document = status_of(answer, 401, "Unauthorized")
    assert "the token is not valid" in document["message"]


async def test_a_caller_without_a_binding_is_refused_403_naming_the_permission(
    http: httpx.AsyncClient, control_plane: ControlPlane, kube: Client, namespace: str, node: str
) -> None:
    nobody = token(control_plane, kube, namespace, "nobody", None)
    answer = await http.post(f"{PROMENADE}/nodes/{node}/drain", headers=bearer(nobody))
    document = status_of(answer, 403, "Forbidden")
    assert document["message"] == (
        f"Credentials do not permit access: system:serviceaccount:{namespace}:nobody may not"
        f" create nodes/drain (promenade.metalmend.dev) on {node}"
    )
    assert kube.get(Node, node).spec.unschedulable is None  # nothing was done


async def test_the_drain_role_may_drain_but_not_remove_nodes(
    http: httpx.AsyncClient, control_plane: ControlPlane, kube: Client, namespace: str, node: str
) -> None:
    drainer = token(control_plane, kube, namespace, "drainer", "metalmend-promenade-drain")
    drained = await http.post(
        f"{PROMENADE}/nodes/{node}/drain?grace-period=0&timeout=30", headers=bearer(drainer)
    )
    status_of(drained, 200, "Success")
    removal = await http.post(
        f"{PROMENADE}/nodes/{node}/remove-from-cluster", headers=bearer(drainer)
    )
    assert "remove-from-cluster" in status_of(removal, 403, "Forbidden")["message"]
    kube.get(Node, node)  # still there


async def test_a_binding_limited_to_some_nodes_by_resource_names_holds(
    http: httpx.AsyncClient, control_plane: ControlPlane, kube: Client, namespace: str, node: str
) -> None:
    document = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": f"{namespace}-one-node"},
                "rules": [{"apiGroups": ["promenade.metalmend.dev"], "resources": ["nodes/drain"],
                           "verbs": ["create"], "resourceNames": [node]}]}  # fmt: skip
    kube.create(codecs.from_dict(document))
    caller = token(control_plane, kube, namespace, "one-node", f"{namespace}-one-node")
    other = await http.post(f"{PROMENADE}/nodes/{namespace}-other/drain", headers=bearer(caller))
    status_of(other, 403, "Forbidden")
    mine = await http.post(
        f"{PROMENADE}/nodes/{node}/drain?grace-period=0&timeout=30", headers=bearer(caller)
    )
    status_of(mine, 200, "Success")


async def test_bad_requests_are_400_after_authentication(
    http: httpx.AsyncClient, admin_token: str, node: str
) -> None:
    answer = await http.post(
        f"{PROMENADE}/nodes/{node}/drain?timeout=10&grace-period=10", headers=bearer(admin_token)
    )
    document = status_of(answer, 400, "BadRequest")
    assert document["message"].startswith("grace-period (10 s) must be less than timeout (10 s)")
    assert document["details"]["errorCount"] == 1
    anonymous = await http.post(f"{PROMENADE}/nodes/{node}/drain?timeout=x")
    status_of(anonymous, 401, "Unauthorized")  # nothing about the request before the token


@pytest.mark.parametrize("step", ["drain", "remove-from-cluster"])
async def test_an_unknown_node_is_404(
    http: httpx.AsyncClient, admin_token: str, namespace: str, step: str
) -> None:
    answer = await http.post(
        f"{PROMENADE}/nodes/{namespace}-nowhere/{step}", headers=bearer(admin_token)
    )
    assert (
        status_of(answer, 404, "NotFound")["message"]
        == f"Node {namespace}-nowhere is not discoverable: no such Node"
    )


# ---- drain ------------------------------------------------------------------------------


async def test_drain_evicts_what_kubectl_drain_would_and_leaves_daemonset_and_mirror_pods(
    http: httpx.AsyncClient, admin_token: str, kube: Client, namespace: str, node: str
) -> None:
    daemonset = kube.create(codecs.from_dict({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent", "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "updateStrategy": {"type": "OnDelete"},
                 "template": {"metadata": {"labels": {"app": "agent"}},
                              "spec": {"nodeSelector": {"drain-test": node},
                                       "containers": [{"name": "c", "image": "busybox"}]}}},
    }))  # fmt: skip
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
             "uid": daemonset.metadata.uid, "controller": True}  # fmt: skip
    make_pod(kube, namespace, node, "agent-x", labels={"app": "agent"}, ownerReferences=[owner])
    make_pod(kube, namespace, node, "static", annotations={"kubernetes.io/config.mirror": "x"})
    make_pod(kube, namespace, node, "bare")
    make_pod(kube, namespace, node, "scratch", spec={"volumes": [{"name": "tmp", "emptyDir": {}}]})
    make_pod(kube, namespace, node, "done")
    set_status(kube, namespace, "done", "Succeeded")

    answer = await http.post(
        f"{PROMENADE}/nodes/{node}/drain?grace-period=0&timeout=60", headers=bearer(admin_token)
    )

    document = status_of(answer, 200, "Success")
    assert document["message"] == f"Node {node} drained"
    assert kube.get(Node, node).spec.unschedulable is True
    assert pods_on(kube, node) == {f"{namespace}/agent-x", f"{namespace}/static"}
    said = lines(document)
    assert f"node/{node} cordoned" in said
    assert f"pod {namespace}/bare evicted (deleting Pods that declare no controller)" in said
    assert f"pod {namespace}/scratch evicted (deleting Pods with local storage)" in said
    assert f"pod {namespace}/done evicted" in said
    assert f"pod {namespace}/agent-x left running: DaemonSet-managed" in said
    assert f"pod {namespace}/static left running: a mirror (static) pod" in said
    assert said[-1] == f"node/{node} drained"
    assert document["details"]["errorCount"] == 0


async def test_a_drain_of_an_empty_node_listed_while_it_cordoned_ends_at_once(
    aclient: AsyncClient, node: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drain looks (pods not listed yet), cordons, and the listing of a Node with no
    pods completes during the cordon: no pod event will ever come, and the drain must not
    wait for one until its deadline (a lab redeploy hung there for its whole 600 s)."""
    opened: list[nodes.NodePods] = []

    class Recorded(nodes.NodePods):
        async def __aenter__(self) -> nodes.NodePods:
            opened.append(self)
            return await super().__aenter__()

    class ListedDuringCordon(nodes.KubeTeardownWriter):
        async def cordon(self, node: str) -> None:
            await super().cordon(node)
            await opened[0].listed(60)  # the listing lands while the cordon is awaited

    monkeypatch.setattr(nodes, "NodePods", Recorded)
    drainer = nodes.Drainer(aclient, TeardownSettings(), ListedDuringCordon(aclient))
    said = await asyncio.wait_for(drainer.drain(node, DrainRequest(timeout=3600)), 60)
    assert [m.message for m in said][-1] == f"node/{node} drained"


async def test_drain_waits_for_evicted_pods_to_stop_and_passes_the_grace_period_on(
    http: httpx.AsyncClient,
    admin_token: str,
    kube: Client,
    aclient: AsyncClient,
    namespace: str,
    node: str,
) -> None:
    for name in ("a", "b", "c"):
        make_pod(kube, namespace, node, name)
        set_status(kube, namespace, name, "Running", ready=True)
    seen: dict[str, int | None] = {}
    stamps: dict[str, Any] = {}
    stopping = asyncio.create_task(kubelet(aclient, node, 1.0, seen, stamps))
    try:
        began = time.monotonic()
        answer = await http.post(
            f"{PROMENADE}/nodes/{node}/drain?grace-period=7&timeout=60", headers=bearer(admin_token)
        )
        took = time.monotonic() - began
    finally:
        stopping.cancel()
    status_of(answer, 200, "Success")
    assert pods_on(kube, node) == set()
    assert seen == {f"{namespace}/{n}": 7 for n in ("a", "b", "c")}
    assert took >= 1.0  # waited for the pods to stop
    # All evicted at once: one after the other, each waited for, they would be a second apart.
    assert (max(stamps.values()) - min(stamps.values())).total_seconds() <= 1


async def test_a_drain_interrupted_midway_is_finished_by_asking_again(
    http: httpx.AsyncClient,
    admin_token: str,
    kube: Client,
    aclient: AsyncClient,
    namespace: str,
    node: str,
) -> None:
    """The client gone, or the service restarted: nothing was kept but the cluster."""
    for name in ("a", "b"):
        make_pod(kube, namespace, node, name)
        set_status(kube, namespace, name, "Running", ready=True)
    drain = f"{PROMENADE}/nodes/{node}/drain?grace-period=5&timeout=60"
    first = asyncio.create_task(http.post(drain, headers=bearer(admin_token)))
    await asyncio.to_thread(wait_for, lambda: all(
        kube.get(Pod, n, namespace=namespace).metadata.deletionTimestamp for n in ("a", "b")))  # fmt: skip
    first.cancel()  # evicted, not yet gone: the request dies here
    with contextlib.suppress(asyncio.CancelledError):
        await first
    seen: dict[str, int | None] = {}
    stopping = asyncio.create_task(kubelet(aclient, node, 0.5, seen))
    try:
        again = status_of(await http.post(drain, headers=bearer(admin_token)), 200, "Success")
    finally:
        stopping.cancel()
    assert pods_on(kube, node) == set()
    assert lines(again)[-1] == f"node/{node} drained"


async def test_a_budget_holds_the_drain_until_its_timeout_then_asking_again_finishes_it(
    http: httpx.AsyncClient, admin_token: str, kube: Client, namespace: str, node: str
) -> None:
    make_pod(kube, namespace, node, "web-0", labels={"app": "web"})
    set_status(kube, namespace, "web-0", "Running", ready=True)
    make_pod(kube, namespace, node, "free")
    budget_blocks(kube, namespace, "web-budget")

    began = time.monotonic()
    answer = await http.post(
        f"{PROMENADE}/nodes/{node}/drain?grace-period=0&timeout=3", headers=bearer(admin_token)
    )
    assert time.monotonic() - began >= 3

    document = status_of(answer, 500, "DrainNodeError")
    assert document["message"] == f"Node {node} is not drained: 1 pod(s) left"
    (problem,) = lines(document)
    assert problem.startswith(
        f"pod {namespace}/web-0: eviction refused: Cannot evict pod as it would violate the pod's disruption budget."
    )
    assert "The disruption budget web-budget needs 1 healthy pods" in problem
    assert document["details"]["errorCount"] == 1
    assert pods_on(kube, node) == {f"{namespace}/web-0"}  # the other pod went meanwhile

    kube.delete(PodDisruptionBudget, "web-budget", namespace=namespace)
    again = await http.post(
        f"{PROMENADE}/nodes/{node}/drain?grace-period=0&timeout=30", headers=bearer(admin_token)
    )
    status_of(again, 200, "Success")
    assert pods_on(kube, node) == set()


async def test_a_pod_that_does_not_stop_in_time_is_named_as_still_terminating(
    http: httpx.AsyncClient, admin_token: str, kube: Client, namespace: str, node: str
) -> None:
    make_pod(kube, namespace, node, "slow")
    set_status(kube, namespace, "slow", "Running", ready=True)
    # No kubelet on this Node: the evicted pod is never seen stopped.
    answer = await http.post(
        f"{PROMENADE}/nodes/{node}/drain?grace-period=1&timeout=2", headers=bearer(admin_token)
    )
    document = status_of(answer, 500, "DrainNodeError")
    assert lines(document) == [
        f"pod {namespace}/slow: evicted, still terminating (its grace period has not run out)"
    ]
    assert kube.get(Pod, "slow", namespace=namespace).metadata.deletionTimestamp is not None


# ---- clear labels ----------------------------------------------------------------------


async def test_clear_labels_waits_for_daemonset_pods_to_leave_and_asking_again_finishes(
    http: httpx.AsyncClient,
    admin_token: str,
    kube: Client,
    aclient: AsyncClient,
    namespace: str,
    node: str,
) -> None:
    kube.patch(Node, node, {"metadata": {"labels": {"role": "storage", "promenade-decomission": "enabled"}}},
               patch_type=PatchType.MERGE)  # fmt: skip
    daemonset = kube.create(codecs.from_dict({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent", "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "updateStrategy": {"type": "OnDelete"},
                 "template": {"metadata": {"labels": {"app": "agent"}},
                              "spec": {"nodeSelector": {"drain-test": node},
                                       "containers": [{"name": "c", "image": "busybox"}]}}},
    }))  # fmt: skip
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
             "uid": daemonset.metadata.uid, "controller": True}  # fmt: skip
    make_pod(kube, namespace, node, "agent-x", labels={"app": "agent"}, ownerReferences=[owner],
             spec={"nodeSelector": {"drain-test": node}})  # fmt: skip
    set_status(kube, namespace, "agent-x", "Running", ready=True)
    clear = f"{PROMENADE}/nodes/{node}/clear-labels"

    # No kubelet yet: the DaemonSet controller deletes its pod, which never stops.
    first = status_of(
        await http.post(f"{clear}?timeout=3", headers=bearer(admin_token)), 500, "ClearLabelsError"
    )
    assert kube.get(Node, node).metadata.labels == {"promenade-decomission": "enabled"}
    assert (
        f"pod {namespace}/agent-x (DaemonSet agent) no longer fits the Node's labels and is being removed"
        in lines(first)
    )
    assert first["details"]["errorCount"] == 1

    seen: dict[str, int | None] = {}
    stopping = asyncio.create_task(kubelet(aclient, node, 0.2, seen))
    try:
        again = status_of(
            await http.post(f"{clear}?timeout=30", headers=bearer(admin_token)), 200, "Success"
        )
    finally:
        stopping.cancel()
    assert lines(again) == [f"node/{node} labels cleared"]  # the labels went the first time
    assert pods_on(kube, node) == set()


async def test_clear_labels_names_each_label_removed(
    http: httpx.AsyncClient, admin_token: str, kube: Client, node: str
) -> None:
    answer = await http.post(
        f"{PROMENADE}/nodes/{node}/clear-labels?timeout=0", headers=bearer(admin_token)
    )
    assert lines(status_of(answer, 200, "Success")) == [
        "label drain-test removed",
        f"node/{node} labels cleared",
    ]
    assert not kube.get(Node, node).metadata.labels


# ---- remove from cluster ----------------------------------------------------------------


async def test_remove_from_cluster_refuses_until_cordoned_drained_and_unlabelled(
    http: httpx.AsyncClient, admin_token: str, kube: Client, namespace: str, node: str
) -> None:
    make_pod(kube, namespace, node, "web")
    remove = f"{PROMENADE}/nodes/{node}/remove-from-cluster"

    first = status_of(await http.post(remove, headers=bearer(admin_token)), 409, "Conflict")
    assert first["message"] == f"Node {node} cannot be removed yet"
    assert lines(first) == [
        f"Node {node} is not cordoned: drain it first",
        f"Node {node} is not drained: pod {namespace}/web is still on it",
        f"Node {node} still has the label drain-test: clear its labels first",
    ]
    assert first["details"]["errorCount"] == 3

    drained = await http.post(
        f"{PROMENADE}/nodes/{node}/drain?grace-period=0&timeout=30", headers=bearer(admin_token)
    )
    status_of(drained, 200, "Success")
    second = status_of(await http.post(remove, headers=bearer(admin_token)), 409, "Conflict")
    assert lines(second) == [f"Node {node} still has the label drain-test: clear its labels first"]

    labels = {"metadata": {"labels": {"drain-test": None, "promenade-decomission": "enabled"}}}
    kube.patch(Node, node, labels, patch_type=PatchType.MERGE)
    removed = status_of(await http.post(remove, headers=bearer(admin_token)), 200, "Success")
    assert lines(removed) == [f"node/{node} deleted"]
    with pytest.raises(ApiError):
        kube.get(Node, node)
    status_of(await http.post(remove, headers=bearer(admin_token)), 404, "NotFound")
