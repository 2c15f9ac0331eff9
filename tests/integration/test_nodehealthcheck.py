"""The NodeHealthCheck on the real API server, with no Machines at all: its CRD's validation,
and a Node remediated through metal3-remediation's fence-first flow with both controllers
killed and restarted mid-remediation. The test plays host-power (it writes the host's
power status), as tests/integration/test_remediation.py does."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, AsyncClient
from lightkube.codecs import from_dict
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.reboot import is_reboot_annotation
from metalmend.api.resources import (
    BareMetalHost,
    FenceRemediation,
    FenceRemediationTemplate,
    Metal3Remediation,
    Metal3RemediationTemplate,
    NodeHealthCheck,
)
from metalmend.api.stamps import stamp
from metalmend.controllers import fenceremediation, nodehealthcheck, remediation
from metalmend.controllers.powerreads import PowerReader
from metalmend.kube.manager import Manager
from metalmend.policy.fencing import POWERED_OFF_FOR
from metalmend.settings import FenceMethod, RemediationSettings, RuntimeSettings, Settings
from tests.support import reconciles, until

# the hosts' word on their Node counts only while its writers are guarded (api/links.node_host)
pytestmark = pytest.mark.usefixtures("node_names_guarded")

DURATION = 2  # seconds a Ready=False must last


class Run:
    """node-health-check and metal3-remediation, as `metalmend run` runs them (``namespace``
    None: every namespace)."""

    def __init__(self, client: AsyncClient, namespace: str | None) -> None:
        self.client, self.namespace = client, namespace
        self.task: asyncio.Task[None] | None = None

    async def start(
        self,
        fencing: RemediationSettings | None = None,
        reader: PowerReader | None = None,
        *,
        remediators: bool = True,
    ) -> None:
        """``remediators`` False: node-health-check alone (the test plays the rest)."""
        manager = await self.manager()
        settings = Settings(
            runtime=RuntimeSettings(namespace=self.namespace),
            remediation=fencing or RemediationSettings(),
        )
        nodehealthcheck.setup(manager, settings)
        if remediators:
            remediation.setup(manager, settings, reader=reader)
            fenceremediation.setup(manager, settings, reader=reader)
        self.task = asyncio.create_task(manager.run())
        await manager.wait_synced()

    async def manager(self) -> Manager:
        return Manager(self.client)

    async def kill(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None


HEARTBEAT = 5.0  # seconds between a Node's status reports (the lab's grace period is 20 s)


class World:
    def __init__(self, client: AsyncClient, namespace: str) -> None:
        self.client, self.ns = client, namespace
        self.nodes: list[str] = []
        self.checks: list[str] = []
        # What each Node's "kubelet" reports: Ready or not, and since when. Reported again
        # every HEARTBEAT seconds, as a kubelet does: a Node whose status goes unreported
        # for the controller manager's grace period turns Ready=Unknown, which no check of
        # this file counts as unhealthy, so a test slower than that on a busy machine
        # waited forever for a Node it had made NotReady to count as unhealthy.
        self.reported: dict[str, tuple[bool, str]] = {}
        self._heartbeat: asyncio.Task[None] | None = None

    def node_name(self, name: str) -> str:
        return f"{self.ns}-{name}"

    async def host(self, name: str, node: str | None = None) -> None:
        """A host that names its Node (names.HOST_NODE: the confirmation api/links.node_host
        needs): ``node`` (short name), by default its own name without ``host-``; "" none."""
        node = name.removeprefix("host-") if node is None else node
        annotations = {names.HOST_NODE: self.node_name(node)} if node else None
        await self.client.create(
            BareMetalHost(
                metadata=ObjectMeta(name=name, annotations=annotations), spec={"online": True}
            ),
            namespace=self.ns,
        )
        await self.power(name, on=True)

    async def node(
        self, name: str, provider: str | None, ready: bool = True, **annotations: str
    ) -> None:
        node = self.node_name(name)
        with contextlib.suppress(ApiError):
            await self.client.create(
                Node(
                    metadata=ObjectMeta(
                        name=node,
                        labels={"role": "worker", "suite": self.ns},
                        annotations=annotations or None,
                    ),
                    spec=NodeSpec(providerID=provider),
                )
            )
        if node not in self.nodes:
            self.nodes.append(node)
        await self.ready(name, ready)

    async def ready(self, name: str, ready: bool) -> None:
        now = dt.datetime.now(dt.UTC).isoformat()
        self.reported[name] = (ready, now)
        await self._report(name, ready, now, now)
        if self._heartbeat is None:
            self._heartbeat = asyncio.create_task(self._beat())

    async def _report(self, name: str, ready: bool, since: str, now: str) -> None:
        condition = {"type": "Ready", "status": "True" if ready else "False", "reason": "Test",
                     "lastHeartbeatTime": now, "lastTransitionTime": since}  # fmt: skip
        await self.client.patch(
            Node.Status, self.node_name(name), {"status": {"conditions": [condition]}}
        )

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT)
            now = dt.datetime.now(dt.UTC).isoformat()
            for name, (ready, since) in list(self.reported.items()):
                with contextlib.suppress(ApiError):  # a Node deleted (fenced) meanwhile
                    await self._report(name, ready, since, now)

    async def power(self, host: str, on: bool) -> None:
        """As host-power reports it: off for the reboot keys on the host now."""
        now = dt.datetime.now(dt.UTC)
        provisioning = {"state": "provisioned", "lastPoweredOn": stamp(now - dt.timedelta(hours=1))}
        listed = None
        if not on:
            provisioning["pendingRebootSince"] = stamp(now)
            found: Any = await self.client.get(BareMetalHost, host, namespace=self.ns)
            keys = [k for k in found.metadata.annotations or {} if is_reboot_annotation(k)]
            listed = sorted(k for k in keys if k != names.REBOOT)
        status = {"poweredOn": on, "operationalStatus": "OK", "provisioning": provisioning,
                  POWERED_OFF_FOR: listed or None}  # fmt: skip
        await self.client.patch(
            BareMetalHost.Status, host, {"status": status},
            namespace=self.ns, patch_type=PatchType.MERGE,
        )  # fmt: skip

    async def check(self, name: str, **spec: Any) -> Any:
        """A check of this test's Nodes; without a template named, one of this namespace
        (strategy reboot, metal3's default), as every check must name one."""
        if "remediationTemplate" not in spec and "escalatingRemediations" not in spec:
            await self.default_template()
            spec["remediationTemplate"] = {"namespace": self.ns, "name": "default"}
        body = {
            "selector": {"matchLabels": {"suite": self.ns}},
            "unhealthyConditions": [
                {"type": "Ready", "status": "False", "duration": f"{DURATION}s"}
            ],
            **spec,
        }
        created = await self.client.create(
            NodeHealthCheck(metadata=ObjectMeta(name=name), spec=body)
        )
        self.checks.append(name)
        return created

    async def default_template(self) -> None:
        template = {"template": {"spec": {"strategy": "reboot"}}}
        with contextlib.suppress(ApiError):  # made already
            await self.client.create(
                Metal3RemediationTemplate(metadata=ObjectMeta(name="default"), spec=template),
                namespace=self.ns,
            )

    async def remediation(self, node: str) -> Any | None:
        try:
            return await self.client.get(Metal3Remediation, self.node_name(node), namespace=self.ns)
        except ApiError:
            return None

    async def status(self, check: str) -> dict[str, Any]:
        obj: Any = await self.client.get(NodeHealthCheck, check)
        return dict(obj.get("status") or {})

    async def node_obj(self, name: str) -> Any | None:
        try:
            return await self.client.get(Node, self.node_name(name))
        except ApiError:
            return None

    async def reasons(self) -> set[str]:
        """This test's Events: in its namespace, and those of the (cluster-scoped) check and
        Nodes, in default, that name something of this namespace."""
        found = {e.reason async for e in self.client.list(Event, namespace=self.ns)}
        return found | {
            e.reason
            async for e in self.client.list(Event, namespace="default")
            if self.ns in (e.message or "")
        }

    async def cleanup(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        for check in self.checks:
            with contextlib.suppress(ApiError):
                await self.client.delete(NodeHealthCheck, check)
        for node in self.nodes:
            with contextlib.suppress(ApiError):
                await self.client.delete(Node, node)


@pytest.fixture
async def world(aclient: AsyncClient, namespace: str) -> AsyncIterator[World]:
    made = World(aclient, namespace)
    yield made
    await made.cleanup()


@pytest.fixture
async def run(aclient: AsyncClient, namespace: str) -> AsyncIterator[Run]:
    running = Run(aclient, namespace)
    yield running
    await running.kill()


def _step(kind: str, order: int, timeout: str = "60s", name: str = "t") -> dict[str, Any]:
    ref = {"kind": kind, "namespace": "n", "name": name}
    return {"remediationTemplate": ref, "order": order, "timeout": timeout}


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"minHealthy": 1, "maxUnhealthy": 1}, "mutually exclusive"),
        (
            {"unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "5"}]},
            "spec.unhealthyConditions[0].duration",
        ),
        (
            {"unhealthyConditions": [{"type": "Ready", "status": "Maybe", "duration": "5s"}]},
            "spec.unhealthyConditions[0].status",
        ),
        ({"minHealthy": "half"}, "spec.minHealthy"),
        ({"stormCooldownDuration": "10 minutes"}, "spec.stormCooldownDuration"),
        ({"remediationTemplate": {"name": "t"}}, "namespace"),
        (
            {
                "remediationTemplate": {"namespace": "n", "name": "t"},
                "escalatingRemediations": [_step("FenceRemediationTemplate", 1)],
            },
            "mutually exclusive",
        ),
        (
            {
                "escalatingRemediations": [
                    _step("FenceRemediationTemplate", 1),
                    _step("Metal3RemediationTemplate", 1),
                ]
            },
            "order must be unique",
        ),
        (
            {
                "escalatingRemediations": [
                    _step("FenceRemediationTemplate", 1),
                    _step("FenceRemediationTemplate", 2),
                ]
            },
            "one escalating remediation per template kind",
        ),
        (
            {"escalatingRemediations": [_step("FenceRemediationTemplate", 1, "59s")]},
            "at least one minute",
        ),
        (
            {
                "remediationTemplate": {
                    "apiVersion": "remediation.metal3.io/v1alpha1",
                    "kind": "FenceRemediationTemplate",
                    "namespace": "n",
                    "name": "t",
                }
            },
            "remediation.metalmend.dev/v1alpha1 for a FenceRemediationTemplate",
        ),
        ({"healthyDelay": "a while"}, "spec.healthyDelay"),
        (
            {
                "escalatingRemediations": [
                    _step("FenceRemediationTemplate", 1),
                    {
                        **_step("Metal3RemediationTemplate", 2),
                        "remediationTemplate": {"namespace": "m", "name": "t"},
                    },
                ]
            },
            "template must be of one namespace",
        ),
        (
            {
                "remediationTemplate": {
                    "kind": "SelfNodeRemediationTemplate",
                    "name": "t",
                    "namespace": "n",
                }
            },
            "spec.remediationTemplate.kind",
        ),
    ],
    ids=[
        "both-limits",
        "duration",
        "status",
        "min-healthy",
        "storm-cooldown",
        "template-namespace",
        "kind",
        "template-and-escalation",
        "duplicate-order",
        "duplicate-kind",
        "short-timeout",
        "api-version-of-kind",
        "healthy-delay",
        "templates-of-two-namespaces",
    ],
)
async def test_the_api_server_refuses_what_the_schema_does_not_admit(
    world: World, spec: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ApiError) as refused:
        await world.check("bad", **spec)
    assert refused.value.status.code == 422
    assert problem in (refused.value.status.message or "")


async def test_a_node_is_fenced_through_its_host_and_a_hostless_node_only_reported(
    world: World, run: Run
) -> None:
    ns = world.ns
    for name in ("a", "b", "c"):
        await world.host(f"host-{name}")
    await world.node("a", f"metal3://{ns}/host-a")
    await world.node("b", None, **{names.NODE_HOST: f"{ns}/host-b"})  # host-b names it
    await world.node("c", f"metal3://{ns}/host-c/m3m-c")  # CAPM3's longer form
    await world.node("d", "k3s://d")  # no host at all
    check = await world.check("workers", maxUnhealthy=2)
    await run.start()
    await until(lambda: _status_is(world, "workers", observedNodes=4, healthyNodes=4))
    assert (await world.status("workers"))["phase"] == "Enabled"

    await world.ready("a", False)
    await world.ready("d", False)
    await until(lambda: _exists(world.remediation("a")), within=DURATION + 20)
    made = await world.remediation("a")
    assert made.metadata.annotations[names.REMEDIATED_NODE] == world.node_name("a")
    assert made.metadata.labels[names.NODE_HEALTH_CHECK_LABEL] == "workers"
    (owner,) = made.metadata.ownerReferences
    assert (owner.kind, owner.name, owner.uid) == ("NodeHealthCheck", "workers", check.metadata.uid)
    key = f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}{made.metadata.uid}"
    # fence first: metal3-remediation holds the Node's host off before anything else
    await until(lambda: _annotated(world, "host-a", key))
    await until(lambda: _status_is(world, "workers", phase="Remediating", healthyNodes=2))
    status = await world.status("workers")
    assert sorted(u["name"] for u in status["unhealthyNodes"]) == [
        world.node_name("a"),
        world.node_name("d"),
    ]
    assert list(status["inFlightRemediations"]) == [world.node_name("a")]
    assert await world.remediation("d") is None, "a Node without a host is never remediated"
    await until(lambda: _recorded(world, "NoBareMetalHost"))
    assert await world.node_obj("a") is not None, "not fenced before the host is off"

    await run.kill()  # mid-remediation: the host goes off while nobody watches
    await world.power("host-a", on=False)
    await run.start()
    await until(lambda: _gone(world.node_obj("a")))  # fenced (Node deleted), after the off
    again = await world.remediation("a")
    assert again is not None
    assert again.metadata.uid == made.metadata.uid, "one remediation, never a second"
    # the Node is gone, its remediation still in flight (the server is booting)
    status = await world.status("workers")
    assert world.node_name("a") in status["inFlightRemediations"]

    await run.kill()
    await world.power("host-a", on=True)
    await world.node("a", f"metal3://{ns}/host-a")  # its kubelet registers again, Ready
    await run.start()
    await until(lambda: _gone(world.remediation("a")), within=30)  # healthy: deleted
    await until(lambda: _lacks(world, "host-a", key))
    await until(lambda: _status_is(world, "workers", phase="Enabled", healthyNodes=3))
    assert {"RemediationCreated", "RemediationRemoved", "PowerOffRequested"} <= (
        await world.reasons()
    )

    # At rest: a restart reads everything again and writes nothing (read once the first run
    # is stopped: a status write of its last reconcile may land after the wait above).
    await run.kill()
    before: Any = await world.client.get(NodeHealthCheck, "workers")
    count = reconciles("node-health-check")
    await run.start()
    await until(lambda: reconciles("node-health-check") > count)
    await run.kill()
    after: Any = await world.client.get(NodeHealthCheck, "workers")
    assert after.metadata.resourceVersion == before.metadata.resourceVersion


async def test_a_remediation_naming_a_node_that_does_not_name_its_host_fences_nothing(
    world: World, run: Run
) -> None:
    """Whoever may create a Metal3Remediation in a namespace may annotate it with any Node's
    name: metal3-remediation believes only the Node."""
    ns = world.ns
    await world.host("host-a")
    await world.node("x", "metal3://elsewhere/host-z")  # another tenant's Node
    await run.start()
    body = Metal3Remediation(
        metadata=ObjectMeta(
            name="forged", annotations={names.REMEDIATED_NODE: world.node_name("x")}
        ),
        spec={"strategy": "reboot"},
    )
    await world.client.create(body, namespace=ns)

    async def failed() -> bool:
        obj: Any = await world.client.get(Metal3Remediation, "forged", namespace=ns)
        return (obj.get("status") or {}).get("phase") == "failed"

    await until(failed)
    host: Any = await world.client.get(BareMetalHost, "host-a", namespace=ns)
    assert not any(is_reboot_annotation(k) for k in host.metadata.annotations or {})
    assert await world.node_obj("x") is not None


async def _status_is(world: World, check: str, **expected: Any) -> bool:
    try:
        current = await world.status(check)
    except ApiError:
        return False
    return all(current.get(k) == v for k, v in expected.items())


async def _exists(found: Any) -> bool:
    return await found is not None


async def _gone(found: Any) -> bool:
    return await found is None


async def _annotated(world: World, host: str, key: str) -> bool:
    obj: Any = await world.client.get(BareMetalHost, host, namespace=world.ns)
    return key in (obj.metadata.annotations or {})


async def _lacks(world: World, host: str, key: str) -> bool:
    return not await _annotated(world, host, key)


async def _recorded(world: World, reason: str) -> bool:
    return reason in await world.reasons()


async def test_a_template_is_copied_and_escalate_disables_the_check(world: World, run: Run) -> None:
    ns = world.ns
    template = {"template": {"spec": {"strategy": "reboot", "powerOffTimeoutSeconds": 45}}}
    await world.client.create(
        Metal3RemediationTemplate(metadata=ObjectMeta(name="fence"), spec=template), namespace=ns
    )
    await world.host("host-a")
    await world.node("a", f"metal3://{ns}/host-a", ready=False)
    await world.node("b", f"metal3://{ns}/host-b")
    await world.check("workers", maxUnhealthy=1,
                      remediationTemplate={"namespace": ns, "name": "fence"})  # fmt: skip
    await run.start()
    await until(lambda: _exists(world.remediation("a")), within=DURATION + 20)
    made = await world.remediation("a")
    assert made.spec["powerOffTimeoutSeconds"] == 45

    await world.client.patch(
        Metal3RemediationTemplate, "fence",
        {"spec": {"template": {"spec": {"strategy": "escalate"}}}},
        namespace=ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    await until(lambda: _status_is(world, "workers", phase="Disabled"))
    status = await world.status("workers")
    (condition,) = status["conditions"]
    assert (condition["type"], condition["status"]) == ("Disabled", "True")
    assert "escalate" in condition["message"]
    await until(lambda: _recorded(world, "Disabled"))


class OffBmc:
    """The hosts' BMCs as metal3-remediation reads them (read-only): off once told so."""

    def __init__(self) -> None:
        self.off: set[str] = set()

    async def is_off(self, host: Any) -> bool:
        return str(host.metadata.name) in self.off


async def _tainted(world: World, node: str) -> bool:
    found = await world.node_obj(node)
    taints = (found.spec.taints if found is not None and found.spec else None) or []
    return names.OUT_OF_SERVICE_TAINT in [t.key for t in taints]


async def _untainted(world: World, node: str) -> bool:
    return not await _tainted(world, node)


async def test_the_out_of_service_taint_strategy_fences_a_node_without_a_machine(
    world: World, run: Run
) -> None:
    ns = world.ns
    taint = RemediationSettings(
        fence=FenceMethod.OUT_OF_SERVICE_TAINT, confirm_window=1.0, confirm_reads=2,
        evacuation_poll=0.2,
    )  # fmt: skip
    bmc = OffBmc()
    await world.host("host-a")
    await world.node("a", f"metal3://{ns}/host-a")
    await world.node("b", f"metal3://{ns}/host-b")
    await world.check("workers", maxUnhealthy=1)
    await run.start(taint, bmc)
    await world.ready("a", False)
    await until(lambda: _exists(world.remediation("a")), within=DURATION + 20)
    made = await world.remediation("a")
    key = f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}{made.metadata.uid}"
    await until(lambda: _annotated(world, "host-a", key))
    assert await _untainted(world, "a"), "no taint before the host is confirmed off"

    await run.kill()  # killed mid-remediation; the host goes off meanwhile
    bmc.off.add("host-a")
    await world.power("host-a", on=False)
    await run.start(taint, bmc)
    await until(lambda: _tainted(world, "a"))  # confirmed off by our reads, then tainted
    assert await world.node_obj("a") is not None, "the taint strategy keeps the Node"
    # nothing left on the Node: the host is released (host-power powers it on)
    await until(lambda: _lacks(world, "host-a", key))
    assert await _tainted(world, "a"), "the taint stays until the Node is Ready"

    await run.kill()
    bmc.off.discard("host-a")
    await world.power("host-a", on=True)
    await run.start(taint, bmc)
    await asyncio.sleep(1.1)  # Ready's transition time has whole seconds
    await world.ready("a", True)
    await until(lambda: _untainted(world, "a"))
    await until(lambda: _gone(world.remediation("a")), within=30)
    # The check's status is written by its own reconcile, woken by the remediation's
    # deletion: it follows, it is not there yet when the remediation is gone.
    await until(lambda: _phase(world, "workers", "Enabled"), what="the check Enabled again")


async def _phase(world: World, check: str, phase: str) -> bool:
    return (await world.status(check)).get("phase") == phase


async def _reasons(world: World, wanted: set[str]) -> bool:
    return wanted <= await world.reasons()  # Events are recorded after the writes they tell of


async def test_a_hosts_report_wakes_the_remediation_of_a_silent_node(
    world: World, run: Run
) -> None:
    """A hung Node writes nothing: its Machine-less remediation must be woken by its host's
    report (off for our key), not by the Node or powerOffTimeoutSeconds (600 s here; the lab
    saw the fence wait that long for a silent Node after a restart)."""
    ns = world.ns
    taint = RemediationSettings(
        fence=FenceMethod.OUT_OF_SERVICE_TAINT, confirm_window=1.0, confirm_reads=2,
        evacuation_poll=0.2,
    )  # fmt: skip
    template = {"template": {"spec": {"strategy": "reboot", "powerOffTimeoutSeconds": 600}}}
    await world.client.create(
        Metal3RemediationTemplate(metadata=ObjectMeta(name="slow"), spec=template), namespace=ns
    )
    bmc = OffBmc()
    await world.host("host-a")
    await world.node("a", f"metal3://{ns}/host-a")
    await world.node("b", f"metal3://{ns}/host-b")
    await world.check("workers", maxUnhealthy=1,
                      remediationTemplate={"namespace": ns, "name": "slow"})  # fmt: skip
    await run.start(taint, bmc)
    await world.ready("a", False)  # the Node's last write
    await until(lambda: _exists(world.remediation("a")), within=DURATION + 20)
    made = await world.remediation("a")
    key = f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}{made.metadata.uid}"
    await until(lambda: _annotated(world, "host-a", key))
    bmc.off.add("host-a")
    await world.power("host-a", on=False)  # only the host changes
    await until(lambda: _tainted(world, "a"), within=60)


EXAMPLE = Path(__file__).resolve().parents[2] / "deploy/examples/node-health-check.yaml"


async def test_the_example_applies(world: World) -> None:
    for body in yaml.safe_load_all(EXAMPLE.read_text()):
        if body["kind"] == "NodeHealthCheck":
            body["metadata"]["name"] = f"{world.ns}-example"
            body["spec"]["remediationTemplate"]["namespace"] = world.ns
            world.checks.append(body["metadata"]["name"])
            created: Any = await world.client.create(from_dict(body))
            assert created["spec"]["remediationTemplate"]["kind"] == "Metal3RemediationTemplate"
        else:
            body["metadata"]["namespace"] = world.ns
            await world.client.create(from_dict(body))


async def test_a_machineless_remediation_with_strategy_escalate_fails_at_once(
    world: World, run: Run
) -> None:
    ns = world.ns
    await world.host("host-a")
    await world.node("a", f"metal3://{ns}/host-a")
    await run.start()
    body = Metal3Remediation(
        metadata=ObjectMeta(name="esc", annotations={names.REMEDIATED_NODE: world.node_name("a")}),
        spec={"strategy": "escalate"},
    )
    await world.client.create(body, namespace=ns)

    async def failed() -> bool:
        obj: Any = await world.client.get(Metal3Remediation, "esc", namespace=ns)
        status = obj.get("status") or {}
        return status.get("phase") == "failed" and "escalate" in status.get("message", "")

    await until(failed)
    host: Any = await world.client.get(BareMetalHost, "host-a", namespace=ns)
    assert not any(is_reboot_annotation(k) for k in host.metadata.annotations or {})


# ---- escalatingRemediations and healthyDelay -------------------------------------------------


async def _fence(world: World, node: str) -> Any | None:
    try:
        return await world.client.get(FenceRemediation, world.node_name(node), namespace=world.ns)
    except ApiError:
        return None


async def _rows(world: World, check: str, node: str) -> list[dict[str, Any]]:
    status = await world.status(check)
    for entry in status.get("unhealthyNodes") or []:
        if entry.get("name") == world.node_name(node):
            return list(entry.get("remediations") or [])
    return []


async def _timed_out(world: World, check: str, node: str, kind: str) -> bool:
    rows = await _rows(world, check, node)
    return any(r["resource"]["kind"] == kind and r.get("timedOut") for r in rows)


async def test_an_escalation_times_out_its_first_remediation_and_survives_restarts(
    world: World, run: Run
) -> None:
    """A FenceRemediation first (60 s, NHC's minimum), then a Metal3Remediation: the host is
    held off by the first, never powered off (the BMC does not answer), so the first times
    out; it gets NHC's timed-out annotation, fence-remediation releases the host, and the
    second is made and takes the host. The controllers are killed while the first runs and
    again once it timed out: the stored state (the objects' creation time and annotation,
    the status's timedOut) says where the escalation was."""
    ns = world.ns
    body = {"template": {"spec": {"strategy": "reboot"}}}
    await world.client.create(
        FenceRemediationTemplate(metadata=ObjectMeta(name="first"), spec=body), namespace=ns
    )
    await world.client.create(
        Metal3RemediationTemplate(metadata=ObjectMeta(name="second"), spec=body), namespace=ns
    )
    await world.host("host-a")
    await world.node("a", f"metal3://{ns}/host-a")
    await world.node("b", f"metal3://{ns}/host-b")
    steps = [
        {"remediationTemplate": {"kind": "Metal3RemediationTemplate", "namespace": ns,
                                 "name": "second"}, "order": 2, "timeout": "10m"},
        {"remediationTemplate": {"apiVersion": "remediation.metalmend.dev/v1alpha1",
                                 "kind": "FenceRemediationTemplate", "namespace": ns,
                                 "name": "first"}, "order": 1, "timeout": "60s"},
    ]  # fmt: skip
    await world.check("workers", maxUnhealthy=1, escalatingRemediations=steps)
    await run.start()
    await world.ready("a", False)
    # Longer than the node lifecycle controller's grace period: the Nodes' "kubelets" post
    # their status, or it would set Ready=Unknown (a new condition, its duration anew).
    beats = asyncio.create_task(_heartbeats(world, ["a", "b"]))
    try:
        second_key = await _escalation(world, run)
    finally:
        beats.cancel()
        await asyncio.gather(beats, return_exceptions=True)
    # the Node comes back: both objects are deleted, the host released, the check at rest
    await world.ready("a", True)
    await until(lambda: _gone(world.remediation("a")), within=30)
    await until(lambda: _gone(_fence(world, "a")), within=30)
    await until(lambda: _lacks(world, "host-a", second_key))
    await until(lambda: _status_is(world, "workers", phase="Enabled", healthyNodes=2))
    assert "unhealthyNodes" not in await world.status("workers")


async def _heartbeats(world: World, nodes: list[str]) -> None:
    """Post each Node's Ready condition as it is, with a fresh heartbeat, every 5 s."""
    while True:
        await asyncio.sleep(5)
        for name in nodes:
            node = await world.node_obj(name)
            conditions = node.status.conditions if node is not None and node.status else None
            for condition in conditions or []:
                if condition.type == "Ready":
                    beat = {"type": "Ready", "status": condition.status, "reason": "Test",
                            "lastHeartbeatTime": dt.datetime.now(dt.UTC).isoformat(),
                            "lastTransitionTime": condition.lastTransitionTime.isoformat()}  # fmt: skip
                    with contextlib.suppress(ApiError):
                        await world.client.patch(
                            Node.Status, world.node_name(name), {"status": {"conditions": [beat]}}
                        )


async def _escalation(world: World, run: Run) -> str:
    await until(lambda: _exists(_fence(world, "a")), within=DURATION + 20)
    first = await _fence(world, "a")
    assert first.metadata.annotations[names.NHC_TEMPLATE_NAME] == "first"
    assert first.metadata.annotations[names.NHC_NODE_NAME] == world.node_name("a")
    first_key = f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}{first.metadata.uid}"
    await until(lambda: _annotated(world, "host-a", first_key))  # fence first: held off
    assert await world.remediation("a") is None, "the second step waits for the timeout"

    await run.kill()  # in the middle of step 1: nothing of the escalation is in memory
    await run.start()
    await until(lambda: _timed_out(world, "workers", "a", "FenceRemediation"), within=180)
    await until(lambda: _exists(world.remediation("a")))
    await run.kill()  # in the middle of the escalation: step 1 timed out, step 2 made
    second = await world.remediation("a")
    await run.start()
    timed: Any = await _fence(world, "a")
    assert timed.metadata.uid == first.metadata.uid, "step 1 is never made again"
    assert names.NHC_TIMED_OUT in timed.metadata.annotations
    # fence-remediation stopped and released the host; metal3-remediation took it
    await until(lambda: _lacks(world, "host-a", first_key))
    second_key = f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}{second.metadata.uid}"
    await until(lambda: _annotated(world, "host-a", second_key))
    again = await world.remediation("a")
    assert again.metadata.uid == second.metadata.uid, "step 2 is made once"
    assert names.NHC_TIMED_OUT not in (again.metadata.annotations or {})
    rows = await _rows(world, "workers", "a")
    assert [(r["resource"]["kind"], r.get("templateName"), bool(r.get("timedOut")))
            for r in rows] == [("FenceRemediation", "first", True),
                               ("Metal3Remediation", "second", False)]  # fmt: skip
    # the check's status follows the remediations it made, in its own later write
    await until(lambda: _phase(world, "workers", "Remediating"), what="the check Remediating")
    await until(lambda: _reasons(world, {"RemediationCreated", "RemediationTimedOut"}))

    return second_key


async def _annotation_of(world: World, node: str, key: str) -> str | None:
    found = await world.remediation(node)
    return (found.metadata.annotations or {}).get(key) if found is not None else None


async def _node_annotated(world: World, node: str, key: str) -> bool:
    found = await world.node_obj(node)
    return found is not None and key in (found.metadata.annotations or {})


async def test_healthy_delay_keeps_the_remediation_then_deletes_it(world: World, run: Run) -> None:
    """healthyDelay 3s: the healthy Node's remediation is annotated with when it was seen
    healthy, kept (the Node counts as not healthy), then deleted; -1s: kept until an
    operator annotates the Node manually-confirmed-healthy, which is then removed."""
    ns = world.ns
    await world.host("host-a")
    await world.node("a", f"metal3://{ns}/host-a")
    await world.node("b", f"metal3://{ns}/host-b")
    await world.check("workers", maxUnhealthy=1, healthyDelay="3s")
    await run.start(remediators=False)  # the objects are only made and deleted here
    await world.ready("a", False)
    await until(lambda: _exists(world.remediation("a")), within=DURATION + 20)
    await world.ready("a", True)
    await until(lambda: _annotation_of(world, "a", names.NHC_HEALTHY_DELAY))
    rows = (await world.status("workers")).get("unhealthyNodes") or []
    await until(lambda: _status_is(world, "workers", healthyNodes=1))
    (entry,) = (await world.status("workers"))["unhealthyNodes"] or rows
    assert entry["healthyDelayed"] is True
    assert entry["conditionsHealthyTimestamp"]
    await until(lambda: _gone(world.remediation("a")), within=30)
    await until(lambda: _status_is(world, "workers", phase="Enabled", healthyNodes=2))

    await world.client.patch(
        NodeHealthCheck, "workers", {"spec": {"healthyDelay": "-1s"}},
        patch_type=PatchType.MERGE,
    )  # fmt: skip
    await world.ready("a", False)
    await until(lambda: _exists(world.remediation("a")), within=DURATION + 20)
    made = await world.remediation("a")
    await world.ready("a", True)

    async def seen_healthy() -> bool:
        rows = await world.status("workers")
        return any(u.get("conditionsHealthyTimestamp") for u in rows.get("unhealthyNodes") or [])

    await until(seen_healthy)
    kept = await world.remediation("a")
    assert kept is not None
    assert kept.metadata.uid == made.metadata.uid, "never deleted automatically"
    assert names.NHC_HEALTHY_DELAY not in (kept.metadata.annotations or {})
    await world.client.patch(
        Node, world.node_name("a"),
        {"metadata": {"annotations": {names.NHC_CONFIRMED_HEALTHY: ""}}},
    )  # fmt: skip
    await until(lambda: _gone(world.remediation("a")))
    await until(lambda: _status_is(world, "workers", phase="Enabled", healthyNodes=2))
    await until(lambda: not_(_node_annotated(world, "a", names.NHC_CONFIRMED_HEALTHY)))


async def not_(found: Any) -> bool:
    return not await found


async def test_a_timed_out_metal3_remediation_stops_and_releases_its_host(
    world: World, run: Run
) -> None:
    """NHC's timed-out annotation on a Metal3Remediation (the escalation's step before
    another): metal3-remediation stops as on deletion, the host released, the object kept."""
    ns = world.ns
    await world.host("host-a")
    await world.node("a", f"metal3://{ns}/host-a", ready=False)
    await run.start()
    body = Metal3Remediation(
        metadata=ObjectMeta(name="step", annotations={names.REMEDIATED_NODE: world.node_name("a")}),
        spec={"strategy": "reboot"},
    )
    made: Any = await world.client.create(body, namespace=ns)
    key = f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}{made.metadata.uid}"
    await until(lambda: _annotated(world, "host-a", key))
    await world.client.patch(
        Metal3Remediation, "step",
        {"metadata": {"annotations": {names.NHC_TIMED_OUT: stamp(dt.datetime.now(dt.UTC))}}},
        namespace=ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    await until(lambda: _lacks(world, "host-a", key))

    async def released() -> bool:
        obj: Any = await world.client.get(Metal3Remediation, "step", namespace=ns)
        return not obj.metadata.finalizers

    await until(released)
    assert await world.node_obj("a") is not None, "nothing fenced after the timeout"
