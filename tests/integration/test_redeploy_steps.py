"""redeploy_server's destroy and deploy_server steps against the real API server and a real
task and design store (metalmend.siteactions.redeploy; docs/site-actions.md,
"redeploy_server"), each run by a worker that dies at every one of the step's saves (just
before it, then just after it) and is started again with the record last saved, as the
action worker does after a restart. The test plays the parts around them: Drydock's worker
completing the task, the provisioner and the kubelet bringing the host back.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from lightkube import AsyncClient, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost
from metalmend.clock import SYSTEM_CLOCK
from metalmend.db import Database
from metalmend.designs.documents import parse
from metalmend.designs.store import DesignStore
from metalmend.destroy.model import Task
from metalmend.destroy.policy.destroy import NodeState, Outcome, Step, TaskStatus
from metalmend.destroy.store import TaskStore
from metalmend.kube.events import EventRecorder
from metalmend.kube.impersonate import Who, impersonator
from metalmend.policy.interlock import TEARDOWN_ANNOTATION
from metalmend.siteactions import redeploy
from metalmend.siteactions.policy.redeploy import RedeploySettings
from metalmend.siteactions.steps import MissingPrecondition, StepContext, StepFailed
from metalmend.teardown.drain import Drainer
from metalmend.teardown.interlock import Interlock
from metalmend.teardown.policy.settings import TeardownSettings
from metalmend.teardown.shutdown import KubeletShutdown
from tests.support import kubelets

IMAGE = {"url": "http://images.lab/os.qcow2", "checksum": "http://images.lab/os.qcow2.sha256"}
# Who created the actions here: an operator allowed everything (the refusals are tested
# from narrow roles in test_site_apply_as_caller.py).
OPERATOR = Who("redeploy-operator", groups=("system:masters", "system:authenticated"))
SETTINGS = RedeploySettings(
    destroy_timeout=60, provision_timeout=60, node_ready_timeout=60, etcd_timeout=30,
    poll_interval=0.1,
)  # fmt: skip


@dataclass(frozen=True)
class Action:
    id: str
    parameters: dict[str, Any]
    revision: int
    name: str = "redeploy_server"
    user: str = "operator"
    context_marker: str | None = None
    allow_intermediate_commits: bool = False
    caller: Who | None = OPERATOR  # the design is applied as them (impersonation)


@dataclass
class Run:
    """One step run to its end by workers that die at each save; what they left."""

    record: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    incarnations: int = 0


class Killed(Exception):
    """The worker dies here (SIGKILL: nothing after this line runs)."""


async def run_with_kills(step: str, action: Action, services: Any) -> tuple[str, Run]:
    """Run ``step`` as the worker does; every incarnation dies at its first save, the odd
    ones just before it is stored, the even ones just after: every boundary of the step,
    and the work between two, is interrupted once."""
    run = Run()
    while True:
        run.incarnations += 1
        assert run.incarnations < 40, "the step never finished"
        before = run.incarnations % 2 == 1

        async def save(new: Mapping[str, Any], before: bool = before) -> None:
            if before:
                raise Killed
            run.record = dict(new)
            raise Killed

        async def note(text: str) -> None:
            run.notes.append(text)

        ctx = StepContext(action, step, dict(run.record), save, note, services)
        with contextlib.suppress(Killed):
            return await redeploy.STEPS[step](ctx), run


def design_yaml(namespace: str, name: str) -> str:
    return f"""
schema: metalmend/KubernetesObject/v1
metadata: {{schema: metadata/Document/v1, name: baremetalhost.{namespace}.{name}}}
data:
  apiVersion: metal3.io/v1alpha1
  kind: BareMetalHost
  metadata: {{name: {name}, namespace: {namespace}}}
  spec:
    online: true
    bmc: {{address: "redfish://bmc/1", credentialsName: x}}
    image: {{url: "{IMAGE["url"]}", checksum: "{IMAGE["checksum"]}"}}
    consumerRef: {{apiVersion: cluster.x-k8s.io/v1beta1, kind: Machine, name: {name},
                  namespace: {namespace}}}
---
schema: metalmend/KubernetesObject/v1
metadata: {{schema: metadata/Document/v1, name: machine.{namespace}.{name}}}
data:
  apiVersion: cluster.x-k8s.io/v1beta1
  kind: Machine
  metadata: {{name: {name}, namespace: {namespace}}}
  spec: {{clusterName: lab, providerID: "metal3://{namespace}/{name}"}}
---
schema: metalmend/KubernetesObject/v1
metadata: {{schema: metadata/Document/v1, name: node..{name}}}
data:
  apiVersion: v1
  kind: Node
  metadata: {{name: {name}, labels: {{role: worker, rack: r1}}}}
"""


@pytest.fixture
def database(tmp_path: Any) -> Iterator[Database]:
    db = Database.open(f"sqlite:///{tmp_path / 'metalmend.sqlite'}")
    db.upgrade()
    yield db
    db.dispose()


@dataclass
class Site:
    namespace: str
    name: str
    services: Any
    tasks: TaskStore
    revision: int


@pytest.fixture
async def site(
    kube: Client, aclient: AsyncClient, namespace: str, database: Database
) -> AsyncIterator[Site]:
    name = f"w-{secrets.token_hex(3)}"
    # The host as destroy leaves it: deprovisioned, off, its teardown claim still on it.
    kube.create(
        BareMetalHost(
            metadata=ObjectMeta(
                name=name, namespace=namespace, annotations={TEARDOWN_ANNOTATION: "{}"}
            ),
            spec={"online": False, "bmc": {"address": "redfish://bmc/1", "credentialsName": "x"}},
        )
    )
    host_status(kube, namespace, name, "available", False)
    store = DesignStore(database)
    revision = store.put("site", parse(design_yaml(namespace, name))).revision
    tasks = TaskStore(database)
    services = SimpleNamespace(
        client=aclient, design_store=store, task_store=tasks, interlock=Interlock(aclient),
        events=EventRecorder(aclient, "metalmend-shipyard"), clock=SYSTEM_CLOCK,
        redeploy=SETTINGS, impersonate=impersonator(aclient, redeploy.FIELD_MANAGER),
        site_namespaces=(namespace,),
    )  # fmt: skip
    yield Site(namespace, name, services, tasks, revision)
    with contextlib.suppress(Exception):
        kube.delete(Node, name)


def host_status(kube: Client, namespace: str, name: str, state: str, on: bool) -> None:
    status = {"provisioning": {"state": state}, "poweredOn": on}
    kube.patch(
        BareMetalHost.Status, name, {"status": status}, namespace=namespace,
        patch_type=PatchType.MERGE,
    )  # fmt: skip


async def hardware(kube: Client, site: Site) -> None:
    """The provisioner and the kubelet, as the lab plays them: a host given an image and
    online: true is provisioned and powered on; then its kubelet registers the Node."""
    while True:
        host = await asyncio.to_thread(kube.get, BareMetalHost, site.name, namespace=site.namespace)
        spec, status = host.spec or {}, host.status or {}
        state = (status.get("provisioning") or {}).get("state")
        if spec.get("online") and spec.get("image") and state != "provisioned":
            await asyncio.to_thread(
                host_status, kube, site.namespace, site.name, "provisioned", True
            )
        elif state == "provisioned" and not list(
            kube.list(Node, fields={"metadata.name": site.name})
        ):
            node = Node(
                metadata=ObjectMeta(name=site.name, labels={"kubernetes.io/hostname": site.name})
            )
            await asyncio.to_thread(kube.create, node)
            ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
            await asyncio.to_thread(
                kube.patch, Node.Status, site.name, {"status": {"conditions": [ready]}},
                patch_type=PatchType.MERGE,
            )  # fmt: skip
        await asyncio.sleep(0.05)


async def drydock(store: TaskStore) -> None:
    """Drydock's worker, reduced to its outcome: every task taken destroys its nodes."""
    while True:
        now = dt.datetime.now(dt.UTC)
        for task_id in await asyncio.to_thread(store.runnable, now):
            until = now + dt.timedelta(seconds=30)
            if await asyncio.to_thread(store.take, task_id, "test", now, until):
                task = await asyncio.to_thread(store.get, task_id)
                assert task is not None
                for node in task.nodes:
                    state = NodeState(step=Step.DONE, outcome=Outcome.SUCCESS)
                    await asyncio.to_thread(store.save_node, task_id, "test", node, state, now)
                await asyncio.to_thread(store.set_status, task_id, "test", TaskStatus.COMPLETE, now)
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running(*parts: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(part()) for part in parts]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_destroy_killed_at_every_save_creates_one_task_with_preserve_local_storage(
    site: Site,
) -> None:
    action = Action(
        "01JREDEPLOYDESTROY0000000", {"target_nodes": [site.name],
                                      "preserve-local-storage": "true"}, site.revision,
    )  # fmt: skip
    async with running(lambda: drydock(site.tasks)):
        note, run = await asyncio.wait_for(run_with_kills("destroy", action, site.services), 60)
    created = [t for t in site.tasks.newest() if site.name in t.nodes]
    assert len(created) == 1, "a restart must find the recorded task, never create a second"
    [task] = created
    assert task.task_id == run.record["task_id"]
    assert task.preserve_local_storage is True
    assert task.node_filter["filter_set"][0]["node_names"] == [site.name]
    assert task.task_id in note
    assert run.incarnations >= 3


async def test_deploy_server_killed_at_every_save_brings_the_server_back(
    kube: Client, aclient: AsyncClient, site: Site
) -> None:
    action = Action("01JREDEPLOYDEPLOY00000000", {"target_nodes": [site.name]}, site.revision)
    async with running(lambda: hardware(kube, site)), kubelets(aclient, [site.name]):
        note, run = await asyncio.wait_for(
            run_with_kills("deploy_server", action, site.services), 90
        )
    assert "redeployed" in note
    # Five phases recorded, each interrupted just before and just after: eleven workers.
    assert run.incarnations == 11, run.notes
    host = kube.get(BareMetalHost, site.name, namespace=site.namespace)
    assert host.spec["online"] is True
    assert host.spec["image"] == IMAGE
    assert host.spec["consumerRef"]["name"] == site.name
    assert TEARDOWN_ANNOTATION not in (host.metadata.annotations or {})  # back in service
    node = kube.get(Node, site.name)
    assert node.metadata.labels["role"] == "worker"
    assert node.metadata.labels["rack"] == "r1"
    reasons = {
        e.reason for e in kube.list(Event, namespace="*", fields={"involvedObject.name": site.name})
    }
    assert "ShipyardDeployServer" in reasons
    assert run.record["nodes"][site.name]["phase"] == "done"


async def test_a_target_revision_that_names_nothing_fails_design_lookup_as_a_missing_precondition(
    site: Site,
) -> None:
    # The store holds a revision, but no site action ever succeeded: nothing to redeploy
    # from, and the action must stop before it touches anything.
    action = Action("01JREDEPLOYLOOKUP00000000", {"target_nodes": [site.name]}, 0)
    saved: list[Mapping[str, Any]] = []

    async def save(new: Mapping[str, Any]) -> None:
        saved.append(new)

    async def note(text: str) -> None:
        del text

    ctx = StepContext(action, "design_lookup", {}, save, note, site.services)
    with pytest.raises(MissingPrecondition, match="successful-site-action names no revision"):
        await redeploy.STEPS["design_lookup"](ctx)
    assert saved == []
    committed = Action("01JREDEPLOYLOOKUP00000001", {**action.parameters,
                       "target-revision": "committed"}, 0)  # fmt: skip
    site.services.design_store.tag(site.revision, "committed", {})
    ctx = StepContext(committed, "design_lookup", {}, save, note, site.services)
    assert str(site.revision) in await redeploy.STEPS["design_lookup"](ctx)
    assert saved == [{"revision": site.revision}]
    # Run again after a restart, with a newer commit since: the revision found first stays.
    newer = site.services.design_store.put("other", parse(design_yaml("elsewhere", "w9")))
    site.services.design_store.tag(newer.revision, "committed", {})
    ctx = StepContext(
        committed, "design_lookup", {"revision": site.revision}, save, note, site.services
    )
    assert str(site.revision) in await redeploy.STEPS["design_lookup"](ctx)
    assert saved == [{"revision": site.revision}]  # not saved again


async def test_validation_names_a_target_the_revision_has_no_host_for(site: Site) -> None:
    action = Action(
        "01JREDEPLOYVALID000000000", {"target_nodes": [site.name, "absent-1"]}, site.revision
    )

    async def ignore(_: Any) -> None:
        return None

    ctx = StepContext(action, "validation", {}, ignore, ignore, site.services)
    with pytest.raises(StepFailed, match="the design has no BareMetalHost 'absent-1'"):
        await redeploy.STEPS["validation"](ctx)


async def test_decommission_and_remove_from_cluster_killed_at_their_saves_finish_once(
    kube: Client, aclient: AsyncClient, site: Site
) -> None:
    # A registered Node of the host, no pods, no Lease: its kubelet reads as stopped once
    # kubelet_stopped_after has passed without a heartbeat.
    kube.create(Node(metadata=ObjectMeta(name=site.name, labels={"role": "worker"})))
    teardown = TeardownSettings(kubelet_stopped_after=1, shutdown_kubelet_timeout=30)
    services = SimpleNamespace(
        **vars(site.services), teardown=teardown, drainer=Drainer(aclient, teardown),
        kubelet=KubeletShutdown(aclient, teardown),
    )  # fmt: skip
    action = Action("01JREDEPLOYDECOM000000000", {"target_nodes": [site.name]}, site.revision)
    note, run = await asyncio.wait_for(run_with_kills("decommission", action, services), 60)
    assert run.record == {"done": [site.name]}
    assert run.incarnations == 3  # died before its one save, after it, then found it done
    assert sum("drain:" in n for n in run.notes) == 2  # the first death came after the work
    node = kube.get(Node, site.name)
    assert node.spec.unschedulable is True
    assert "role" not in (node.metadata.labels or {})

    note, run = await asyncio.wait_for(run_with_kills("remove_from_cluster", action, services), 30)
    assert "removed" in note
    assert not list(kube.list(Node, fields={"metadata.name": site.name}))

    # Asked again (a restart after the Node went): nothing left to do, nothing fails.
    async def ignore(_: Any) -> None:
        return None

    ctx = StepContext(action, "remove_from_cluster", {}, ignore, ignore, services)
    assert "removed" in await redeploy.STEPS["remove_from_cluster"](ctx)


async def test_destroy_fails_naming_the_drydock_task_that_took_a_target_node_since_preflight(
    site: Site,
) -> None:
    # A Drydock task for the node stored between preflight and this step: the claim in
    # the task store lets one destroy of the node run, never two.
    now = dt.datetime.now(dt.UTC)
    other = Task(
        task_id="5c0f0000-0000-4000-8000-0000000000aa", action="destroy_nodes",
        design_ref="deckhand+https://deckhand/api/v1.0/revisions/1/rendered-documents",
        node_filter=None, preserve_local_storage=False, status=TaskStatus.REQUESTED,
        created=now, created_by="alice", updated=now, context_marker=None,
        nodes={site.name: NodeState()},
    )  # fmt: skip
    site.tasks.create(other)
    action = Action("01JREDEPLOYRACE000000000", {"target_nodes": [site.name]}, site.revision)
    saved: list[Mapping[str, Any]] = []

    async def save(new: Mapping[str, Any]) -> None:
        saved.append(new)

    async def note(text: str) -> None:
        del text

    ctx = StepContext(action, "destroy", {}, save, note, site.services)
    expected = f"Node {site.name} is being destroyed by Drydock task {other.task_id}"
    with pytest.raises(StepFailed, match=expected):
        await redeploy.STEPS["destroy"](ctx)
    assert [t.task_id for t in site.tasks.newest()] == [other.task_id]
