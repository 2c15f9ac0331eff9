"""The lab's kubelet simulator stops deleted pods as a kubelet does, against the real API
server: many at once, counted from the deletion's start across a restart of the
simulator, not at all while its host is off, and never held by a hostile annotation."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, Client
from lightkube.resources.core_v1 import Node, Pod

from metalmend_lab.controlplane import ControlPlane
from metalmend_lab.inventory import HostSpec
from metalmend_lab.kubeletsim import SLOW_STOP_ANNOTATION, KubeletSim
from tests.support import until


class Host:
    """A lab host for one test: its power (a boot number, None while off) and the
    kubelet simulators run on it, one at a time (``start`` after ``stop``: a restart)."""

    def __init__(self, control_plane: ControlPlane, namespace: str) -> None:
        self.name = f"{namespace}-host"
        self.spec = HostSpec(
            name=self.name, namespace=namespace, bmc="ipmi", bmc_port=0, internal_port=0,
            username="", password="", provider_id=f"metal3://{namespace}/{self.name}",
            kubeconfig=str(
                control_plane.user_kubeconfig(f"system:node:{self.name}", ["system:nodes"])
            ),
            boot_delay=0.0,
        )  # fmt: skip
        self.boot: int | None = 1
        self.sim: KubeletSim | None = None
        self._task: asyncio.Task[None] | None = None

    async def powered(self) -> int | None:
        return self.boot

    async def start(self) -> KubeletSim:
        self.sim = KubeletSim(self.spec, self.powered)
        self._task = asyncio.create_task(self.sim.run())
        await until(lambda: self.sim is not None and self.sim.state == "running", within=10)
        return self.sim

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


@pytest.fixture
async def host(control_plane: ControlPlane, kube: Client, namespace: str) -> AsyncIterator[Host]:
    running = Host(control_plane, namespace)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()
        with contextlib.suppress(ApiError):
            kube.delete(Node, running.name)


@pytest.fixture
def pods_deleted_at_once(kube: Client, namespace: str) -> Iterator[None]:
    """Whatever a test leaves is force-deleted: no kubelet runs after it."""
    yield
    left: list[Any] = list(kube.list(Pod, namespace=namespace))
    for each in left:
        with contextlib.suppress(ApiError):
            kube.delete(Pod, each.metadata.name, namespace=namespace, grace_period=0)


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


async def running_and_ready(aclient: AsyncClient, namespace: str, names: set[str]) -> bool:
    listed: list[Any] = [p async for p in aclient.list(Pod, namespace=namespace)]
    found = {p.metadata.name: p for p in listed}
    return set(found) == names and all(
        p.status.phase == "Running"
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        for p in found.values()
    )


async def gone(aclient: AsyncClient, namespace: str, name: str) -> bool:
    try:
        await aclient.get(Pod, name, namespace=namespace)
    except ApiError as error:
        return error.status.code == 404
    return False


async def all_gone(aclient: AsyncClient, namespace: str) -> bool:
    return not [p async for p in aclient.list(Pod, namespace=namespace)]


async def test_many_slow_pods_stop_together_not_one_after_another(
    host: Host, kube: Client, aclient: AsyncClient, namespace: str, pods_deleted_at_once: None
) -> None:
    names = {f"slow-{i}" for i in range(60)}
    for name in names:
        kube.create(pod(name, host.name, slow_stop="3"), namespace=namespace)
    await until(lambda: running_and_ready(aclient, namespace, names), within=60)

    began = time.monotonic()
    await asyncio.gather(*(aclient.delete(Pod, n, namespace=namespace) for n in names))
    await until(lambda: all_gone(aclient, namespace), within=180)
    took = time.monotonic() - began
    # Counted, not timed (a busy machine stretches any time): one after another, a single
    # pod would be stopping at any moment; together, all those whose deletion began within
    # the same 3 s (all 60 on an idle machine, 10 or more even on a busy one).
    assert host.sim is not None
    assert host.sim.most_stopping >= 10, host.sim.most_stopping
    print(f"60 pods of 3 s each stopped in {took:.1f} s, {host.sim.most_stopping} at once")


async def test_a_restarted_simulator_stops_a_pod_when_it_would_have_anyway(
    host: Host, kube: Client, aclient: AsyncClient, namespace: str, pods_deleted_at_once: None
) -> None:
    kube.create(pod("slow", host.name, slow_stop="8"), namespace=namespace)
    await until(lambda: running_and_ready(aclient, namespace, {"slow"}), within=30)

    await host.stop()
    began = time.monotonic()
    kube.delete(Pod, "slow", namespace=namespace)  # grace 30, as the pod asks by default
    await asyncio.sleep(5)
    await host.start()  # a new simulator: knows nothing of the pod's termination
    await until(lambda: gone(aclient, namespace, "slow"), within=20)
    took = time.monotonic() - began
    # 8 s from the deletion (the stamp's whole seconds: up to 1 s late), not 5 + 8.
    assert 7.9 < took < 11.5, took


async def test_a_host_powered_off_leaves_its_stopping_pod_until_it_boots_again(
    host: Host, kube: Client, aclient: AsyncClient, namespace: str, pods_deleted_at_once: None
) -> None:
    # Longer than a heartbeat: the stop is under way when the power goes.
    kube.create(pod("slow", host.name, slow_stop="4"), namespace=namespace)
    await until(lambda: running_and_ready(aclient, namespace, {"slow"}), within=30)

    kube.delete(Pod, "slow", namespace=namespace)
    host.boot = None  # off: nothing runs there to stop it
    await asyncio.sleep(5)
    left: Any = kube.get(Pod, "slow", namespace=namespace)
    assert left.metadata.deletionTimestamp is not None
    host.boot = 2  # the containers died with the power: removed once the host is back
    began = time.monotonic()
    await until(lambda: gone(aclient, namespace, "slow"), within=10)
    assert time.monotonic() - began < 4.0


@pytest.mark.parametrize("value", ["five", "-3", "1e12", "nan", ""])
async def test_a_hostile_annotation_stops_the_pod_promptly(
    host: Host,
    kube: Client,
    aclient: AsyncClient,
    namespace: str,
    pods_deleted_at_once: None,
    value: str,
) -> None:
    kube.create(pod("odd", host.name, slow_stop=value), namespace=namespace)
    await until(lambda: running_and_ready(aclient, namespace, {"odd"}), within=30)
    began = time.monotonic()
    kube.delete(Pod, "odd", namespace=namespace)
    await until(lambda: gone(aclient, namespace, "odd"), within=10)
    assert time.monotonic() - began < 4.0
    assert host.sim is not None
    assert host.sim.state == "running"
