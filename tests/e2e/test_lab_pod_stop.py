"""In the lab, a deleted pod takes as long to stop as it would on a real server: its
kubelet keeps it Running, not Ready, for the seconds its slow-stop annotation asks, then
reports its containers terminated and removes it; without the annotation it goes at once;
a grace period shorter than the annotation wins (the containers are killed)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod

from metalmend_lab import lab
from metalmend_lab.kubeletsim import SLOW_STOP_ANNOTATION
from tests.support import until


@pytest.fixture
async def kube(hosts_lab: lab.RunningLab) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(hosts_lab.kubeconfig))
    yield client
    await client.close()


@pytest.fixture
async def namespace(kube: AsyncClient) -> AsyncIterator[str]:
    name = f"pod-stop-{secrets.token_hex(3)}"
    await kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    left: list[Any] = [p async for p in kube.list(Pod, namespace=name)]
    for each in left:  # a failed test's: no kubelet is waited for
        with contextlib.suppress(ApiError):
            await kube.delete(Pod, each.metadata.name, namespace=name, grace_period=0)
    await kube.delete(Namespace, name)


def pod(name: str, node: str, slow_stop: str | None = None) -> Any:
    annotations = {SLOW_STOP_ANNOTATION: slow_stop} if slow_stop is not None else {}
    return Pod.from_dict(
        {
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "app", "image": "registry.invalid/metalmend/app:1"}],
            },
        }
    )


def ready(obj: Any) -> str:
    conditions = (obj.status.conditions if obj.status else None) or []
    return next((c.status for c in conditions if c.type == "Ready"), "-")


@dataclass
class Seen:
    """What a watch saw of one pod after its deletion: when it was first seen Running
    and not Ready, and when it was removed, with its last status."""

    stopping_at: float | None = None
    removed_at: float | None = None
    last: Any = None


@dataclass
class Watcher:
    seen: dict[str, Seen] = field(default_factory=dict)

    def removed(self) -> set[str]:
        return {name for name, seen in self.seen.items() if seen.removed_at is not None}

    async def run(self, kube: AsyncClient, namespace: str) -> None:
        async for kind, obj in kube.watch(Pod, namespace=namespace):
            entry: Any = obj
            mine = self.seen.setdefault(entry.metadata.name, Seen())
            now = time.monotonic()
            if kind == "DELETED":
                mine.removed_at, mine.last = now, entry
            elif (
                entry.metadata.deletionTimestamp is not None
                and entry.status.phase == "Running"
                and ready(entry) == "False"
                and mine.stopping_at is None
            ):
                mine.stopping_at = now


def terminated(obj: Any) -> tuple[int, str]:
    (container,) = obj.status.containerStatuses
    state = container.state.terminated
    return state.exitCode, state.reason


async def test_a_slow_pod_stays_running_not_ready_then_goes_and_the_grace_period_wins(
    hosts_lab: lab.RunningLab, kube: AsyncClient, namespace: str
) -> None:
    assert hosts_lab.hardware is not None
    node = hosts_lab.hardware.hosts[0].name
    await kube.create(pod("prompt", node), namespace=namespace)
    await kube.create(pod("slow", node, slow_stop="4"), namespace=namespace)
    await kube.create(pod("stubborn", node, slow_stop="60"), namespace=namespace)

    async def all_ready() -> bool:
        found = [p async for p in kube.list(Pod, namespace=namespace)]
        return len(found) == 3 and all(ready(p) == "True" for p in found)

    await until(all_ready, within=60)
    watcher = Watcher()
    watching = asyncio.create_task(watcher.run(kube, namespace))
    try:
        await asyncio.sleep(0.5)  # the watch is established
        began = time.monotonic()
        await asyncio.gather(
            kube.delete(Pod, "prompt", namespace=namespace),  # grace 30, the pod's own
            kube.delete(Pod, "slow", namespace=namespace),
            kube.delete(Pod, "stubborn", namespace=namespace, grace_period=3),
        )
        await asyncio.sleep(2.5)
        slow: Any = await kube.get(Pod, "slow", namespace=namespace)
        assert slow.status.phase == "Running"
        assert ready(slow) == "False"

        await until(lambda: watcher.removed() == {"prompt", "slow", "stubborn"}, within=30)
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching

    took = {name: s.removed_at - began for name, s in watcher.seen.items() if s.removed_at}
    print("removed after " + ", ".join(f"{n} {t:.1f} s" for n, t in sorted(took.items())))
    # At its kubelet's next sync (every second): exited on SIGTERM.
    assert took["prompt"] < 3.5
    assert terminated(watcher.seen["prompt"].last) == (0, "Completed")
    assert watcher.seen["prompt"].last.status.phase == "Succeeded"
    # 4 s after the deletion began (never early; the 1 s sync and the stamp's whole
    # seconds may add a little).
    assert 3.9 < took["slow"] < 7.0
    assert watcher.seen["slow"].stopping_at is not None
    assert terminated(watcher.seen["slow"].last) == (0, "Completed")
    # Asked for 60 s, given 3: killed when the grace period ran out.
    assert 2.9 < took["stubborn"] < 6.0
    assert terminated(watcher.seen["stubborn"].last) == (137, "Error")
    assert watcher.seen["stubborn"].last.status.phase == "Failed"
