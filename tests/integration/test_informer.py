"""Informers on the real API server: a store that stays true through churn, compaction
(410 Gone), partitions and missing permissions."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import Subject
from lightkube.resources.core_v1 import ConfigMap, PodTemplate

from metalmend.kube.informer import Informer, without_managed_fields
from metalmend.kube.workqueue import Backoff
from metalmend_lab.controlplane import ControlPlane
from metalmend_lab.proxies import TcpProxy
from tests.support import grant, until


async def truth(client: AsyncClient, resource: Any, namespace: str) -> dict[str, str]:
    return {
        f"{namespace}/{o.metadata.name}": o.metadata.resourceVersion
        async for o in client.list(resource, namespace=namespace)
    }


def snapshot(informer: Informer) -> dict[str, str]:
    return {
        k: o.metadata.resourceVersion
        for k, o in zip(informer.store.keys(), informer.store.values(), strict=True)
    }


@pytest.fixture
async def running() -> AsyncIterator[Callable[[Informer], Informer]]:
    tasks: list[asyncio.Task[None]] = []

    def start(informer: Informer) -> Informer:
        tasks.append(asyncio.create_task(informer.run()))
        return informer

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def random_churn(client: AsyncClient, namespace: str, operations: int, seed: int) -> None:
    rng = random.Random(seed)
    alive: set[str] = set()
    for step in range(operations):
        name = f"cm-{rng.randrange(60)}"
        if name in alive and rng.random() < 0.3:
            await client.delete(ConfigMap, name, namespace=namespace)
            alive.discard(name)
        elif name in alive:
            await client.patch(ConfigMap, name, {"data": {"step": str(step)}}, namespace=namespace)
        else:
            await client.create(
                ConfigMap(metadata=ObjectMeta(name=name), data={"step": str(step)}),
                namespace=namespace,
            )
            alive.add(name)


async def test_store_equals_a_fresh_list_after_1000_random_changes(
    aclient: AsyncClient, namespace: str, running: Callable[[Informer], Informer]
) -> None:
    informer = running(Informer(aclient, ConfigMap, namespace=namespace))
    await asyncio.wait_for(informer.synced.wait(), 10)
    handled: list[tuple[bool, bool]] = []
    informer.add_handler(lambda old, new: handled.append((old is None, new is None)))
    await random_churn(aclient, namespace, 1000, seed=7)
    expected = await truth(aclient, ConfigMap, namespace)
    await until(lambda: snapshot(informer) == expected)
    assert informer.lists == 1, "no re-list was needed"
    assert (True, False) in handled, "saw additions"
    assert (False, True) in handled, "saw deletions"


async def test_compaction_while_partitioned_leads_to_a_relist_and_a_true_store(
    control_plane: ControlPlane,
    aclient: AsyncClient,
    namespace: str,
    tmp_path: Path,
    running: Callable[[Informer], Informer],
) -> None:
    proxy = TcpProxy("127.0.0.1", control_plane.ports.apiserver)
    port = await proxy.start()
    via = control_plane.kubeconfig_via(f"https://127.0.0.1:{port}", tmp_path / "via-proxy")
    watcher = AsyncClient(KubeConfig.from_file(via))
    informer = running(
        Informer(watcher, PodTemplate, namespace=namespace, backoff=Backoff(0.05, 0.5))
    )
    await asyncio.wait_for(informer.synced.wait(), 10)
    deleted: list[str] = []
    informer.add_handler(
        lambda old, new: deleted.append(old.metadata.name) if new is None else None
    )

    def template(name: str) -> PodTemplate:
        spec = PodSpec(containers=[Container(name="c", image="busybox")])
        return PodTemplate(metadata=ObjectMeta(name=name), template=PodTemplateSpec(spec=spec))

    await aclient.create(template("stays"), namespace=namespace)
    await aclient.create(template("goes"), namespace=namespace)
    await until(lambda: len(informer.store) == 2)

    proxy.cut()  # the informer cannot see what happens next
    await aclient.delete(PodTemplate, "goes", namespace=namespace)
    await aclient.create(template("arrives"), namespace=namespace)
    for i in range(2):  # move etcd's revision past our last event, then drop history
        await aclient.create(ConfigMap(metadata=ObjectMeta(name=f"bump-{i}")), namespace=namespace)
    await asyncio.to_thread(control_plane.compact_etcd)
    proxy.restore()

    expected = await truth(aclient, PodTemplate, namespace)
    await until(lambda: snapshot(informer) == expected)
    assert informer.lists == 2, "410 Gone led to exactly one re-list"
    assert "goes" in deleted, "handlers heard of the deletion missed during the partition"
    await watcher.close()
    await proxy.stop()


async def test_forbidden_watch_keeps_the_informer_unsynced_until_granted(
    control_plane: ControlPlane,
    kube: Client,
    namespace: str,
    running: Callable[[Informer], Informer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    user = Client(KubeConfig.from_file(control_plane.user_kubeconfig("watcher", ["watchers"])))
    with pytest.raises(ApiError):
        user.get(ConfigMap, "x", namespace=namespace)
    watcher = AsyncClient(
        KubeConfig.from_file(control_plane.user_kubeconfig("watcher", ["watchers"]))
    )
    informer = running(
        Informer(watcher, ConfigMap, namespace=namespace, backoff=Backoff(0.05, 0.5))
    )
    await until(lambda: informer.last_error is not None, within=10)
    assert not informer.synced.is_set()
    assert informer.last_error is not None
    assert informer.last_error.startswith("list configmaps: 403")
    assert any("cannot list configmaps" in r.getMessage() for r in caplog.records)

    watchers = Subject(kind="Group", name="watchers")
    grant(
        kube,
        namespace,
        "watch-configmaps",
        watchers,
        resources=["configmaps"],
        verbs=["list", "watch"],
    )
    await asyncio.wait_for(informer.synced.wait(), 20)
    assert informer.last_error is None
    await watcher.close()


async def test_label_selector_limits_what_the_store_holds(
    aclient: AsyncClient, namespace: str, running: Callable[[Informer], Informer]
) -> None:
    informer = running(
        Informer(aclient, ConfigMap, namespace=namespace, labels={"metalmend.dev/lab": "yes"})
    )
    await asyncio.wait_for(informer.synced.wait(), 10)
    for name, labels in (("in", {"metalmend.dev/lab": "yes"}), ("out", {})):
        await aclient.create(
            ConfigMap(metadata=ObjectMeta(name=name, labels=labels)), namespace=namespace
        )
    await until(lambda: len(informer.store) == 1)
    await aclient.patch(
        ConfigMap, "in", {"metadata": {"labels": {"metalmend.dev/lab": "no"}}}, namespace=namespace
    )
    await until(lambda: len(informer.store) == 0)  # leaving the selection is a deletion
    assert informer.store.get(f"{namespace}/out") is None


async def test_cached_objects_carry_no_managed_fields(
    aclient: AsyncClient, namespace: str, running: Callable[[Informer], Informer]
) -> None:
    """informer.without_managed_fields: the API server keeps them; the cache does not,
    listed or watched, typed (a ConfigMap) or generic (a dict)."""
    await aclient.create(ConfigMap(metadata=ObjectMeta(name="listed"), data={"a": "1"}),
                         namespace=namespace)  # fmt: skip
    informer = running(Informer(aclient, ConfigMap, namespace=namespace))
    await asyncio.wait_for(informer.synced.wait(), 10)
    await aclient.create(ConfigMap(metadata=ObjectMeta(name="watched"), data={"a": "1"}),
                         namespace=namespace)  # fmt: skip
    await until(lambda: informer.store.get(f"{namespace}/watched") is not None, 10)
    stored = await aclient.get(ConfigMap, "watched", namespace=namespace)
    assert stored.metadata.managedFields, "the API server has them"
    for name in ("listed", "watched"):
        cached = informer.store.get(f"{namespace}/{name}")
        assert cached is not None
        assert cached.metadata.managedFields is None
        assert cached.metadata.name == name
        assert cached.data == {"a": "1"}
    generic = without_managed_fields(
        {"metadata": {"name": "g", "managedFields": [{"manager": "x"}]}, "spec": {}}
    )
    assert generic == {"metadata": {"name": "g"}, "spec": {}}
