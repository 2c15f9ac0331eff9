"""Controllers, leader election, safe writes and events against the real API server."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Event
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost
from metalmend.clock import SYSTEM_CLOCK
from metalmend.kube.controller import DONE, Controller, Result
from metalmend.kube.events import EventRecorder
from metalmend.kube.leader import LeadershipLost, LeaseTiming
from metalmend.kube.manager import LeaderElection, Manager
from metalmend.kube.workqueue import Backoff
from metalmend.kube.writes import patch_annotations, patch_status
from metalmend_lab.controlplane import ControlPlane
from tests.support import until

TIMING = LeaseTiming(lease_duration=3.0, renew_deadline=2.0, retry_period=0.5)


@pytest.fixture
async def tasks() -> AsyncIterator[list[asyncio.Task[Any]]]:
    started: list[asyncio.Task[Any]] = []
    yield started
    for task in started:
        task.cancel()
    await asyncio.gather(*started, return_exceptions=True)


def counting_manager(
    client: AsyncClient,
    namespace: str,
    reconcile: Callable[[str], Awaitable[Result]],
    backoff: Backoff | None = None,
    election: LeaderElection | None = None,
) -> tuple[Manager, Controller]:
    manager = Manager(client, leader_election=election)
    controller = manager.add(Controller("test", reconcile, workers=2, backoff=backoff))
    controller.watch(manager.informer(ConfigMap, namespace=namespace))
    return manager, controller


async def test_a_failing_reconcile_backs_off_instead_of_hot_looping(
    aclient: AsyncClient, namespace: str, tasks: list[asyncio.Task[Any]]
) -> None:
    calls: list[float] = []

    async def broken(key: str) -> Result:
        if key.endswith("/broken"):
            calls.append(time.monotonic())
            raise RuntimeError("this object cannot be reconciled")
        return DONE

    manager, controller = counting_manager(aclient, namespace, broken, Backoff(0.005, 300))
    tasks.append(asyncio.create_task(manager.run()))
    await aclient.create(ConfigMap(metadata=ObjectMeta(name="broken")), namespace=namespace)
    await until(lambda: len(calls) >= 1)
    await asyncio.sleep(1.5)
    # 5 ms doubling: about nine attempts fit in 1.5 s; a hot loop would make thousands.
    assert 4 <= len(calls) <= 12, len(calls)
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert gaps[-1] > gaps[0], "the delay grows"
    assert controller.queue.failures(f"{namespace}/broken") == len(calls)


async def test_a_key_changed_100_times_while_busy_runs_at_most_twice_more(
    aclient: AsyncClient, namespace: str, tasks: list[asyncio.Task[Any]]
) -> None:
    release = asyncio.Event()
    runs: list[str] = []

    async def slow(key: str) -> Result:
        if key.endswith("/busy"):  # the namespace also holds kube-root-ca.crt
            runs.append(key)
            if len(runs) == 1:
                await release.wait()
        return DONE

    manager, _ = counting_manager(aclient, namespace, slow)
    tasks.append(asyncio.create_task(manager.run()))
    await aclient.create(ConfigMap(metadata=ObjectMeta(name="busy")), namespace=namespace)
    await until(lambda: len(runs) == 1)
    for i in range(100):
        await aclient.patch(ConfigMap, "busy", {"data": {"n": str(i)}}, namespace=namespace)
    await asyncio.sleep(0.5)  # let the watch deliver all 100 changes
    assert len(runs) == 1, "never two workers on one key"
    release.set()
    await asyncio.sleep(0.5)
    assert len(runs) == 2, "the 100 changes collapsed into one more run"


async def test_requeue_at_runs_the_key_again_at_its_deadline(
    aclient: AsyncClient, namespace: str, tasks: list[asyncio.Task[Any]]
) -> None:
    runs: list[dt.datetime] = []
    deadline = SYSTEM_CLOCK.now()

    async def timed(key: str) -> Result:
        nonlocal deadline
        if not key.endswith("/later"):
            return DONE
        runs.append(SYSTEM_CLOCK.now())
        if len(runs) == 1:
            deadline = runs[0] + dt.timedelta(seconds=0.4)
            return Result.at(deadline)
        return DONE

    manager, _ = counting_manager(aclient, namespace, timed)
    tasks.append(asyncio.create_task(manager.run()))
    await aclient.create(ConfigMap(metadata=ObjectMeta(name="later")), namespace=namespace)
    await until(lambda: len(runs) == 2, within=5)
    assert runs[1] >= deadline


async def test_with_leader_election_exactly_one_manager_reconciles_and_a_standby_takes_over(
    control_plane: ControlPlane, namespace: str, tasks: list[asyncio.Task[Any]]
) -> None:
    seen: dict[str, list[str]] = {"a": [], "b": []}
    managers: dict[str, Manager] = {}
    runs: dict[str, asyncio.Task[None]] = {}
    for identity in ("a", "b"):

        async def record(key: str, who: str = identity) -> Result:
            seen[who].append(key)
            return DONE

        client = AsyncClient(KubeConfig.from_file(control_plane.kubeconfig))
        election = LeaderElection(
            lease_name="test-manager",
            namespace=namespace,
            identity=identity,
            timing=TIMING,
            release_on_cancel=False,  # cancelling below stands for kill -9
        )
        managers[identity], _ = counting_manager(client, namespace, record, election=election)
        runs[identity] = asyncio.create_task(managers[identity].run())
        tasks.append(runs[identity])

    def leader() -> str | None:
        leading = [i for i, m in managers.items() if m.controllers_running]
        assert len(leading) <= 1, "two leaders"
        return leading[0] if leading else None

    await until(lambda: leader() is not None, within=15)
    first = leader()
    assert first is not None
    other = "b" if first == "a" else "a"
    kube = AsyncClient(KubeConfig.from_file(control_plane.kubeconfig))
    for i in range(5):
        await kube.create(ConfigMap(metadata=ObjectMeta(name=f"one-{i}")), namespace=namespace)
    await until(lambda: len({k for k in seen[first] if "/one-" in k}) == 5)
    assert not seen[other], "the standby reconciled nothing"

    runs[first].cancel()
    killed = time.monotonic()
    await asyncio.gather(runs[first], return_exceptions=True)
    await until(lambda: leader() == other, within=TIMING.lease_duration + 5)
    takeover = time.monotonic() - killed
    # The standby counts the lease duration from when it saw the last renewal (at most
    # one poll, 1.2 retry periods, late), then polls again.
    assert takeover <= TIMING.lease_duration + 2.5 * TIMING.retry_period, takeover
    await kube.create(ConfigMap(metadata=ObjectMeta(name="two")), namespace=namespace)
    await until(lambda: f"{namespace}/two" in seen[other])
    assert f"{namespace}/two" not in seen[first]
    lease = await kube.get(Lease, "test-manager", namespace=namespace)
    assert lease.spec is not None
    assert lease.spec.holderIdentity == other
    assert lease.spec.leaseTransitions == 1
    await kube.close()


async def test_losing_the_lease_stops_controllers_within_the_renew_deadline(
    control_plane: ControlPlane, aclient: AsyncClient, namespace: str
) -> None:
    async def noop(key: str) -> Result:
        return DONE

    election = LeaderElection("stolen", namespace, "victim", TIMING)
    manager, _ = counting_manager(aclient, namespace, noop, election=election)
    run = asyncio.create_task(manager.run())
    await until(lambda: manager.controllers_running, within=10)
    lease = await aclient.get(Lease, "stolen", namespace=namespace)
    assert lease.spec is not None
    lease.spec.holderIdentity = "thief"
    lease.spec.leaseDurationSeconds = 3600
    await aclient.replace(lease)  # someone else holds it now, for a long time
    stolen = time.monotonic()
    with pytest.raises(LeadershipLost):
        await asyncio.wait_for(run, TIMING.renew_deadline + 5)
    assert not manager.controllers_running
    assert time.monotonic() - stolen <= TIMING.renew_deadline + 2 * TIMING.retry_period


async def test_two_writers_racing_on_one_status_both_land(
    aclient: AsyncClient, namespace: str
) -> None:
    await aclient.create(
        BareMetalHost(metadata=ObjectMeta(name="raced"), spec={"online": True}),
        namespace=namespace,
    )
    conflicts = 0

    async def increment(times: int) -> None:
        nonlocal conflicts
        for _ in range(times):
            while True:
                host = await aclient.get(BareMetalHost, "raced", namespace=namespace)
                count = (host.get("status") or {}).get("errorCount", 0)
                try:
                    await patch_status(aclient, BareMetalHost, host, {"errorCount": count + 1})
                    break
                except ApiError as error:
                    if error.status.code != 409:
                        raise
                    conflicts += 1

    await asyncio.gather(increment(25), increment(25))
    host = await aclient.get(BareMetalHost, "raced", namespace=namespace)
    assert host["status"]["errorCount"] == 50, "no update lost"
    assert conflicts > 0, "the writers did collide"


async def test_status_write_is_skipped_when_nothing_changed(
    aclient: AsyncClient, namespace: str
) -> None:
    host = await aclient.create(
        BareMetalHost(metadata=ObjectMeta(name="calm"), spec={"online": True}),
        namespace=namespace,
    )
    host = await patch_status(aclient, BareMetalHost, host, {"poweredOn": True})
    assert await patch_status(aclient, BareMetalHost, host, {"poweredOn": True}) is None
    after = await aclient.get(BareMetalHost, "calm", namespace=namespace)
    assert after.metadata.resourceVersion == host.metadata.resourceVersion


async def test_annotation_patches_touch_only_the_named_keys(
    aclient: AsyncClient, namespace: str
) -> None:
    annotations = {"reboot.metal3.io/other-client": "", "mine": "1"}
    host = await aclient.create(
        BareMetalHost(metadata=ObjectMeta(name="shared", annotations=annotations), spec={}),
        namespace=namespace,
    )
    # Another client adds its key after we read the object...
    await aclient.patch(
        BareMetalHost,
        "shared",
        {"metadata": {"annotations": {"reboot.metal3.io/late": ""}}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    # ...and our stale copy removes only ours and adds one.
    await patch_annotations(aclient, BareMetalHost, host, {"mine": None, "ours": "2"})
    fresh = await aclient.get(BareMetalHost, "shared", namespace=namespace)
    final = fresh.metadata.annotations
    assert final == {"reboot.metal3.io/other-client": "", "reboot.metal3.io/late": "", "ours": "2"}
    assert await patch_annotations(aclient, BareMetalHost, fresh, {"mine": None}) is None


async def test_repeated_events_are_aggregated_even_across_restarts(
    aclient: AsyncClient, namespace: str
) -> None:
    host = await aclient.create(
        BareMetalHost(metadata=ObjectMeta(name="noisy"), spec={}), namespace=namespace
    )
    # (every occurrence written: the quiet interval is tested in test_hostpower_errors.py)
    recorder = EventRecorder(aclient, bump_interval=0)
    for _ in range(5):
        await recorder.warning(host, "PowerFailed", "BMC unreachable")
    await recorder.normal(host, "PoweredOn", "host powered on")
    restarted = EventRecorder(aclient, bump_interval=0)
    await restarted.warning(host, "PowerFailed", "BMC unreachable")
    events = [e async for e in aclient.list(Event, namespace=namespace)]
    by_reason = {e.reason: e for e in events}
    assert len(events) == 2
    assert by_reason["PowerFailed"].count == 6
    assert by_reason["PowerFailed"].type == "Warning"
    assert by_reason["PowerFailed"].involvedObject.name == "noisy"
    assert by_reason["PoweredOn"].count == 1


async def test_a_stop_releases_the_lease_even_after_a_renewal_it_did_not_see(
    aclient: AsyncClient, namespace: str
) -> None:
    """A stop that interrupts a renewal after the API server applied it leaves the elector
    with an older version of its Lease: the release (409) reads it again and still hands
    it back, so a standby (or, with sharding, the leader) need not wait for its expiry."""
    from lightkube.models.coordination_v1 import LeaseSpec

    from metalmend.kube.leader import LeaderElector

    elector = LeaderElector(aclient, "unseen", namespace, "me", TIMING)
    leading = asyncio.Event()

    async def lead() -> None:
        leading.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(elector.run(lead))
    try:
        await asyncio.wait_for(leading.wait(), 60)
        # The renewal that landed unseen: the same holder, a newer version.
        current = await aclient.get(Lease, "unseen", namespace=namespace)
        assert current.spec is not None
        current.spec = LeaseSpec(
            holderIdentity="me", leaseDurationSeconds=3, renewTime=dt.datetime.now(dt.UTC),
            acquireTime=current.spec.acquireTime, leaseTransitions=current.spec.leaseTransitions,
        )  # fmt: skip
        await aclient.replace(current)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    released = await aclient.get(Lease, "unseen", namespace=namespace)
    assert released.spec is not None
    assert not released.spec.holderIdentity, "released despite the version it had not seen"
