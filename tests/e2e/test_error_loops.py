"""Failing hosts in the lab, with `metalmend run --controllers host-power` as a process: a
wrong password at the real Redfish emulator, a malformed address, an unreachable BMC
(issue: 258 failed logins in 40 s, 80 reconciles a second); and a write of ours refused by
the shipped reboot-writers admission policy (issue: the host stayed off with status OK and
only tracebacks in the log).

Counts, not timings: no more attempts than the schedule allows in the window
(benchmarks/error_loops.py prints the same numbers for a minute each)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from benchmarks.error_loops import apiserver_writes, cases, measure
from lightkube import ApiError, AsyncClient, Client, KubeConfig, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import Subject
from lightkube.resources.admissionregistration_v1 import (
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
)
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding
from lightkube.types import PatchType

from metalmend.api.names import REBOOT
from metalmend.api.resources import BareMetalHost
from metalmend.policy.hostpower import RetrySettings, retry_delay
from metalmend_lab import lab
from metalmend_lab.hosts import NAMESPACE
from tests.e2e.conftest import Metalmend, host
from tests.support import grant, until

WINDOW = 20.0
POLICY = (
    Path(__file__).resolve().parents[2] / "deploy" / "policies" / "reboot-annotation-writers.yaml"
)


def allowed_attempts(seconds: float) -> int:
    t, made = 0.0, 0
    while t <= seconds:
        made += 1
        t += retry_delay(made, 0, 0.0, RetrySettings())
    return made


@pytest.fixture
def controller(hosts_lab: lab.RunningLab) -> Iterator[Metalmend]:
    power = Metalmend(hosts_lab, "host-power", 3.0)
    power.start()
    yield power
    power.stop()


@pytest.fixture
async def kube(hosts_lab: lab.RunningLab) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(hosts_lab.kubeconfig))
    yield client
    await client.close()


def metrics_port(controller: Metalmend) -> int:
    assert controller.process is not None
    argv: list[str] = list(controller.process.args)  # type: ignore[arg-type]
    return int(argv[argv.index("--health-bind") + 1].rsplit(":", 1)[1])


async def settled_lab(running: lab.RunningLab) -> None:
    """Wait until the lab's own hosts stop writing (their power settles after start-up or
    an earlier test), so that the API server's write counts are ours alone."""
    before = apiserver_writes(running.plane)
    for _ in range(12):
        await asyncio.sleep(5)
        now = apiserver_writes(running.plane)
        if now["baremetalhosts"] == before["baremetalhosts"]:
            return
        before = now
    raise AssertionError("the lab's hosts never settled")


async def test_failing_hosts_cost_no_more_than_their_backoff(
    hosts_lab: lab.RunningLab, controller: Metalmend, kube: AsyncClient
) -> None:
    emulator_log = hosts_lab.plane.workdir.parent / "hardware" / "redfish-emulator.log"
    port = metrics_port(controller)
    bound = allowed_attempts(WINDOW)
    for case, address, password in cases(hosts_lab):
        await settled_lab(hosts_lab)
        counts = await measure(
            kube, hosts_lab.plane, port, emulator_log, case, address, password, WINDOW
        )
        attempts = counts.reconciles.get("bmc_error", 0)
        if case == "wrong-password":
            # One attempt, then 5 minutes: a login or two (session, then basic auth).
            assert counts.logins_refused is not None
            assert 1 <= counts.logins_refused <= 2, counts
            assert attempts == 1, counts
        else:
            assert 3 <= attempts <= bound, counts
        assert counts.error_count == attempts, "errorCount counts attempts"
        assert counts.host_writes <= attempts + 1, counts  # a status write per attempt (+delete)
        assert counts.event_writes <= 2, counts  # one Event, bumped at most once a minute


@pytest.fixture
def reboot_writers_policy(hosts_lab: lab.RunningLab) -> Iterator[Path]:
    """The shipped policy, bound to the lab's namespace only, with metalmend's identity (the
    lab admin) *not* listed: only the user "rebooter" may touch reboot annotations."""
    kube = hosts_lab.client()
    objects = codecs.load_all_yaml(POLICY.read_text())
    try:
        kube.create(Namespace(metadata=ObjectMeta(name="metalmend-system")))
    except ApiError as error:
        if error.status.code != 409:
            raise
    rebooter = hosts_lab.plane.user_kubeconfig("rebooter")
    grant(kube, NAMESPACE, "rebooter", Subject(kind="User", name="rebooter",
          apiGroup="rbac.authorization.k8s.io"), resources=["baremetalhosts"],
          verbs=["get", "patch"], group="metal3.io")  # fmt: skip
    for obj in objects:
        if isinstance(obj, ConfigMap):
            obj.data = {"users": "rebooter", "groups": "nobody:at-all"}
        if isinstance(obj, ValidatingAdmissionPolicyBinding):
            assert obj.spec is not None
            obj.spec.matchResources = {  # type: ignore[assignment]
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
            }
        kube.apply(obj, field_manager="metalmend-tests", force=True)
    try:
        yield rebooter
    finally:
        for kind, name, namespace in [
            (ValidatingAdmissionPolicyBinding, "metalmend-reboot-annotation-writers", None),
            (ValidatingAdmissionPolicy, "metalmend-reboot-annotation-writers", None),
            (RoleBinding, "rebooter", NAMESPACE),
            (Role, "rebooter", NAMESPACE),
        ]:
            try:
                kube.delete(kind, name, namespace=namespace)
            except ApiError as error:
                if error.status.code != 404:
                    raise


async def test_a_refused_write_shows_on_the_host_and_in_the_start_up_check(
    hosts_lab: lab.RunningLab,
    controller: Metalmend,
    kube: AsyncClient,
    reboot_writers_policy: Path,
) -> None:
    spec = host(hosts_lab, "ipmi")
    sync: Client = hosts_lab.client()

    def refused_for_admin() -> bool:  # the policy takes a moment to be enforced
        try:
            sync.patch(BareMetalHost, spec.name,
                       {"metadata": {"annotations": {"reboot.metal3.io/probe": ""}}},
                       namespace=NAMESPACE, patch_type=PatchType.MERGE, dry_run=True)  # fmt: skip
        except ApiError as error:
            return error.status.code in (403, 422)
        return False

    await until(lambda: refused_for_admin(), within=30)
    controller.stop()
    controller.start()  # the start-up check runs with the policy in force
    assert "start-up check failed" in controller.log.read_text()
    assert "refuses metalmend's changes to reboot annotations" in controller.log.read_text()

    rebooter = AsyncClient(KubeConfig.from_file(reboot_writers_policy))
    try:
        await rebooter.patch(BareMetalHost, spec.name,
                             {"metadata": {"annotations": {REBOOT: ""}}},
                             namespace=NAMESPACE, patch_type=PatchType.MERGE)  # fmt: skip
    finally:
        await rebooter.close()

    async def condition() -> dict[str, Any] | None:
        status = (await kube.get(BareMetalHost, spec.name, namespace=NAMESPACE))["status"]
        found = [c for c in status.get("conditions") or [] if c["type"] == "WritesAccepted"]
        return found[0] if found else None

    async def refused() -> bool:
        return await condition() is not None

    try:
        await until(refused, within=30)
        found = await condition()
        assert found is not None
        assert found["status"] == "False"
        assert "removal of reboot.metal3.io" in found["message"]
        status = (await kube.get(BareMetalHost, spec.name, namespace=NAMESPACE))["status"]
        assert status["operationalStatus"] == "error"
        events = [e async for e in kube.list(Event, namespace=NAMESPACE)]
        assert any(e.reason == "WriteRefused" and e.involvedObject.name == spec.name
                   for e in events)  # fmt: skip
        assert "Traceback" not in controller.log.read_text()
    finally:
        sync.delete(ValidatingAdmissionPolicyBinding, "metalmend-reboot-annotation-writers")

    async def recovered() -> bool:
        current = await kube.get(BareMetalHost, spec.name, namespace=NAMESPACE)
        annotations = current.metadata.annotations or {}
        return await condition() is None and REBOOT not in annotations

    await until(recovered, within=90)  # the next attempt on the host's schedule
    await asyncio.sleep(0)
