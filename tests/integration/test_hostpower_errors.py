"""Failing hosts against the real API server: tried on their backoff only, whatever the
watch says (issue: a malformed address made 80 reconciles a second, each status patch
waking the host again), and Events rate-limited as client-go's recorder does.

Counts, not timings: "no more attempts than the schedule allows" in the window."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Secret
from lightkube.types import PatchType

from metalmend.api.power import PowerState
from metalmend.api.resources import BareMetalHost
from metalmend.bmc import BmcPool, BmcTarget, Credentials, parse
from metalmend.bmc.credentials import EVERY_HOST, HOSTS_ANNOTATION, SECRET_LABEL
from metalmend.controllers import hostpower as hostpower_controller
from metalmend.controllers import metrics as hostpower_metrics
from metalmend.kube import metrics
from metalmend.kube.events import EventRecorder
from metalmend.kube.manager import Manager
from metalmend.policy.hostpower import RetrySettings, retry_delay
from metalmend.settings import BmcSettings, RuntimeSettings, Settings
from metalmend_lab.controlplane import ControlPlane, free_port
from tests.support import until

WINDOW = 20.0  # seconds the hosts fail for
NUDGES = 10  # unrelated updates (a label, someone else's status field) during the window


def settings(namespace: str) -> Settings:
    return Settings(runtime=RuntimeSettings(namespace=namespace), bmc=BmcSettings(timeout=5))


def allowed_attempts(seconds: float) -> int:
    """What the schedule allows in ``seconds`` with no jitter (jitter only delays)."""
    t, made = 0.0, 0
    while t <= seconds:
        made += 1
        t += retry_delay(made, 0, 0.0, RetrySettings())
    return made


def apiserver_writes(control_plane: ControlPlane, resource: str) -> int:
    """The API server's own count of writes to ``resource`` that succeeded (all clients)."""
    with control_plane.admin_http() as http:
        text = http.get("/metrics").text
    total = 0
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{") or f'resource="{resource}"' not in line:
            continue
        if 'code="2' not in line:  # (a conflict with this test's own nudges is no write)
            continue
        # (no DELETE: earlier tests' namespaces are still being emptied; we delete nothing)
        if any(f'verb="{v}"' in line for v in ("POST", "PATCH", "PUT", "APPLY")):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


class EventWrites:
    """Every write to an Event of ``namespace`` from ``start()`` on, as the API server's watch
    reports it (kind, involved object): this namespace's own, not the whole server's count,
    which other tests' components also write to. ``stop()`` writes a marker Event and waits
    for the watch to bring it, so every write before it has been seen (a watch is ordered)."""

    MARKER = "end-of-count"

    def __init__(self, client: AsyncClient, namespace: str) -> None:
        self.client, self.namespace = client, namespace
        self.seen: list[tuple[str, str]] = []
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        listing = self.client.list(Event, namespace=self.namespace)
        async for _ in listing:
            pass
        self.task = asyncio.create_task(self._follow(str(listing.resourceVersion)))

    async def _follow(self, version: str) -> None:
        async for kind, event in self.client.watch(
            Event, namespace=self.namespace, resource_version=version
        ):
            self.seen.append((kind, event.involvedObject.name or ""))

    async def stop(self) -> list[tuple[str, str]]:
        assert self.task is not None
        marker = Event(
            metadata=ObjectMeta(name=self.MARKER),
            involvedObject=ObjectReference(kind="ConfigMap", name=self.MARKER, namespace=self.namespace),
            reason="EndOfCount", message="the test's marker", type="Normal",
        )  # fmt: skip
        await self.client.create(marker, namespace=self.namespace)
        try:
            await until(
                lambda: ("ADDED", self.MARKER) in self.seen or self.task.done(),
                what="the watch of this namespace's Events to bring the test's marker",
            )
            if self.task.done():
                self.task.result()  # (the watch's own error, if it ended)
        finally:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        return [seen for seen in self.seen if seen[1] != self.MARKER]


def reconciles(outcome: str) -> float:
    return float(metrics.RECONCILE_TOTAL.labels("host-power", outcome)._value.get())


@pytest.fixture
async def failing_hosts(aclient: AsyncClient, namespace: str) -> list[str]:
    secret: Any = Secret(
        metadata=ObjectMeta(
            name="bmc",
            labels={SECRET_LABEL: "true"},
            annotations={HOSTS_ANNOTATION: EVERY_HOST},
        ),
        data={k: base64.b64encode(v.encode()).decode() for k, v in
              {"username": "admin", "password": "secret"}.items()},
    )  # fmt: skip
    await aclient.create(secret, namespace=namespace)
    addresses = {
        "malformed": "redfish://10.0.0.1:notaport/redfish/v1/Systems/1",
        "unreachable": f"redfish://127.0.0.1:{free_port()}/redfish/v1/Systems/1",
    }
    for name, address in addresses.items():
        host: Any = BareMetalHost(
            metadata=ObjectMeta(name=name),
            spec={"online": True, "bmc": {"address": address, "credentialsName": "bmc"}},
        )
        await aclient.create(host, namespace=namespace)
    return list(addresses)


async def test_failing_hosts_are_tried_on_their_backoff_only(
    aclient: AsyncClient, namespace: str, control_plane: ControlPlane, failing_hosts: list[str]
) -> None:
    manager = Manager(aclient)
    hostpower_controller.setup(manager, settings(namespace))
    errors_before, success_before = reconciles("bmc_error"), reconciles("success")
    host_writes_before = apiserver_writes(control_plane, "baremetalhosts")
    event_writes = EventWrites(aclient, namespace)
    await event_writes.start()
    running = asyncio.create_task(manager.run())
    try:
        await until(
            lambda: all(
                (manager.informers[(BareMetalHost, namespace, ())].store.get(f"{namespace}/{h}")
                 or {}).get("status", {}).get("errorCount")
                for h in failing_hosts
            ),
            within=30,
        )  # fmt: skip
        # Unrelated updates while the hosts fail: none may bring an attempt forward.
        for i in range(NUDGES):
            for name in failing_hosts:
                await aclient.patch(
                    BareMetalHost, name, {"metadata": {"labels": {"nudge": str(i)}}},
                    namespace=namespace, patch_type=PatchType.MERGE,
                )  # fmt: skip
                await aclient.patch(
                    BareMetalHost.Status, name, {"status": {"lastUpdated": None, "note": str(i)}},
                    namespace=namespace, patch_type=PatchType.MERGE,
                )  # fmt: skip
            await asyncio.sleep(WINDOW / NUDGES)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)

    bound = allowed_attempts(WINDOW + 10)  # the wait for the first failure counts too
    attempts = reconciles("bmc_error") - errors_before
    assert reconciles("success") == success_before, "a BMC error is not a success in /metrics"
    assert len(failing_hosts) * 3 <= attempts <= len(failing_hosts) * bound
    for name in failing_hosts:
        host: Any = await aclient.get(BareMetalHost, name, namespace=namespace)
        status = host["status"]
        assert status["operationalStatus"] == "error"
        assert 3 <= status["errorCount"] <= bound, "errorCount counts attempts, not reconciles"
    ours = 2 * NUDGES * len(failing_hosts)  # this test's own writes
    host_writes = apiserver_writes(control_plane, "baremetalhosts") - host_writes_before - ours
    assert host_writes <= attempts, "one status write per attempt, nothing else"
    # One Event per host: repeats within a minute are counted in memory, not written.
    written = await event_writes.stop()
    assert sorted(written) == [("ADDED", h) for h in failing_hosts], "one Event write per host"
    warnings = [e async for e in aclient.list(Event, namespace=namespace)]
    assert {e.involvedObject.name for e in warnings if e.reason == "BMCError"} == set(failing_hosts)


async def test_a_real_change_retries_at_once_and_reset_backoff_too(
    aclient: AsyncClient, namespace: str, failing_hosts: list[str]
) -> None:
    manager = Manager(aclient)
    controller = hostpower_controller.HostPowerController(manager, settings(namespace))
    running = asyncio.create_task(manager.run())
    key = f"{namespace}/malformed"
    try:
        await manager.wait_synced()
        await controller.reconcile(key)
        first = controller.next_attempt(key)
        assert first is not None
        # Before the next attempt: nothing read, nothing written.
        waiting = await controller.reconcile(key)
        assert waiting.outcome == "backoff"
        assert waiting.requeue_at == first
        # A user's real change (spec.online) is tried at once.
        await aclient.patch(
            BareMetalHost, "malformed", {"spec": {"online": False}},
            namespace=namespace, patch_type=PatchType.MERGE,
        )  # fmt: skip
        store = manager.informers[(BareMetalHost, namespace, ())].store
        await until(lambda: store.get(key)["spec"]["online"] is False, within=10)
        assert (await controller.reconcile(key)).outcome == "bmc_error"
        await until(lambda: store.get(key)["status"].get("errorCount") == 2, within=10)
        # The credentials Secret's hook: the next reconcile is an attempt.
        controller.reset_backoff(key)
        assert controller.next_attempt(key) is None
        assert (await controller.reconcile(key)).outcome == "bmc_error"
        host: Any = await aclient.get(BareMetalHost, "malformed", namespace=namespace)
        assert host["status"]["errorCount"] == 3
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


class FrozenClock:
    def __init__(self) -> None:
        self.at = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)

    def now(self) -> dt.datetime:
        return self.at


async def test_events_are_rate_limited_like_client_go(aclient: AsyncClient, namespace: str) -> None:
    host = await aclient.create(
        BareMetalHost(metadata=ObjectMeta(name="chatty"), spec={}), namespace=namespace
    )
    clock = FrozenClock()
    recorder = EventRecorder(aclient, clock=clock)
    # The same Event again within a minute: counted, not written.
    for _ in range(10):
        await recorder.warning(host, "BMCError", "unreachable")
    clock.at += dt.timedelta(seconds=61)
    await recorder.warning(host, "BMCError", "unreachable")
    (event,) = [e async for e in aclient.list(Event, namespace=namespace)]
    assert event.count == 11
    # The spam filter: 25 distinct Events (one token spent above), then one per 5 minutes.
    for i in range(30):
        await recorder.warning(host, "BMCError", f"message {i}")
    assert recorder.dropped == 30 - 23
    clock.at += dt.timedelta(minutes=5)
    await recorder.warning(host, "BMCError", "after five minutes")
    events = [e async for e in aclient.list(Event, namespace=namespace)]
    assert len(events) == 1 + 23 + 1


class StuckDriver:
    """A BMC call that does not end until ``gate`` opens; ``started`` once it is under way."""

    def __init__(self, gate: asyncio.Event, started: asyncio.Event) -> None:
        self.gate, self.started = gate, started

    async def power_state(self) -> PowerState:
        self.started.set()
        await self.gate.wait()
        return PowerState.ON

    async def act(self, action: object) -> None:
        await self.power_state()

    async def close(self) -> None:
        return None

    def hang_up(self) -> None:
        return None


async def test_a_host_waiting_for_an_endpoint_busy_with_other_namespaces_says_so(
    aclient: AsyncClient, namespace: str
) -> None:
    """Another namespace's call holds the host's BMC endpoint: the host's reconcile is
    turned away (nothing sent), says so in an Event, and its namespace is counted in
    metalmend_bmc_waiting_calls; it is handed out again the moment the endpoint frees."""
    address = f"ipmi://127.0.0.1:{free_port()}"
    await aclient.create(
        Secret(
            metadata=ObjectMeta(
                name="bmc", labels={SECRET_LABEL: "true"}, annotations={HOSTS_ANNOTATION: "w1"}
            ),
            stringData={"username": "admin", "password": "secret"},
        ),
        namespace=namespace,
    )
    await aclient.create(
        BareMetalHost(
            metadata=ObjectMeta(name="w1"),
            spec={"online": True, "bmc": {"address": address, "credentialsName": "bmc"}},
        ),
        namespace=namespace,
    )
    manager = Manager(aclient)
    gate, started = asyncio.Event(), asyncio.Event()
    pool = BmcPool(
        BmcSettings(timeout=30), driver_factory=lambda target, ip: StuckDriver(gate, started)
    )
    controller = hostpower_controller.HostPowerController(manager, settings(namespace), bmcs=pool)
    woken: list[str] = []
    pool.wake = woken.append
    running = asyncio.create_task(manager.run())
    other = BmcTarget(parse(address), Credentials("x", "y"), namespace="t2", waiter="t2/h")
    holding = asyncio.create_task(pool.power_state(other))
    key = f"{namespace}/w1"
    try:
        await manager.wait_synced()
        await asyncio.wait_for(started.wait(), 10)  # t2's call is under way
        assert (await controller.reconcile(key)).outcome == "busy"

        async def told() -> list[str]:
            return [
                str(e.message)
                async for e in aclient.list(Event, namespace=namespace)
                if e.reason == "WaitingForBMC" and e.involvedObject.name == "w1"
            ]

        await until(told, within=10)
        (message,) = await told()
        assert "busy with 1 call of other namespaces" in message, message
        samples = hostpower_metrics.bmc_waiting_samples(pool.waiting_samples())
        assert (hostpower_metrics.BMC_WAITING.name, (namespace,), 1) in samples
        gate.set()
        assert await holding == PowerState.ON
        assert woken == [key], "handed out again as the endpoint frees"
    finally:
        gate.set()
        running.cancel()
        await asyncio.gather(running, holding, return_exceptions=True)
        await pool.close()
