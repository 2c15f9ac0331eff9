"""The declarative reboot API on lab hosts, with `metalmend run --controllers host-power`
as a real process (so that it can be killed at any moment)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.admissionregistration_v1 import ValidatingAdmissionPolicyBinding
from lightkube.resources.core_v1 import Event
from lightkube.types import PatchType

from metalmend.api.names import REBOOT
from metalmend.api.resources import BareMetalHost
from metalmend.api.stamps import parse_stamp, stamp
from metalmend.bmc import BmcPool, PowerState
from metalmend.bmc.settings import BmcSettings
from metalmend_lab import lab
from metalmend_lab import policies as lab_policies
from metalmend_lab.hosts import NAMESPACE
from metalmend_lab.inventory import HostSpec
from tests.e2e.conftest import Metalmend, host, target
from tests.support import until

SOFT_TIMEOUT = 3.0  # the test controller's soft power-off timeout
REDFISH_CHANGE = 15.0  # sushy-tools' fake driver lands changes in 1-11 s


@pytest.fixture
def controller(hosts_lab: lab.RunningLab) -> Iterator[Metalmend]:
    power = Metalmend(hosts_lab, "host-power", SOFT_TIMEOUT)
    power.start()
    yield power
    power.stop()


@pytest.fixture
async def kube(hosts_lab: lab.RunningLab) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(hosts_lab.kubeconfig))
    yield client
    await client.close()


@pytest.fixture
async def bmcs(hosts_lab: lab.RunningLab) -> AsyncIterator[BmcPool]:
    pool = BmcPool(BmcSettings(timeout=10, ca_bundle=str(hosts_lab.plane.ca.pair.cert)))
    yield pool
    await pool.close()


async def bmh(kube: AsyncClient, name: str) -> Any:
    return await kube.get(BareMetalHost, name, namespace=NAMESPACE)


async def annotate(kube: AsyncClient, name: str, changes: dict[str, str | None]) -> None:
    await kube.patch(
        BareMetalHost, name, {"metadata": {"annotations": changes}},
        namespace=NAMESPACE, patch_type=PatchType.MERGE,
    )  # fmt: skip


def times(host_obj: Any) -> tuple[dt.datetime | None, dt.datetime | None]:
    provisioning = (host_obj.get("status") or {}).get("provisioning") or {}
    return (
        parse_stamp(provisioning.get("pendingRebootSince")),
        parse_stamp(provisioning.get("lastPoweredOn")),
    )


async def rebooted_after(kube: AsyncClient, name: str, asked: dt.datetime) -> bool:
    """What a user checks with kubectl: lastPoweredOn later than their request."""
    pending, last = times(await bmh(kube, name))
    return pending is not None and last is not None and asked <= pending < last


async def settled(kube: AsyncClient, spec: HostSpec, bmcs: BmcPool) -> dt.datetime:
    """Wait for a quiet, powered-on host; return the time of the request to follow."""

    async def quiet() -> bool:
        h = await bmh(kube, spec.name)
        pending, last = times(h)
        calm = pending is None or (last is not None and pending < last)
        return bool(h["status"].get("poweredOn")) and calm and last is not None

    await until(quiet, within=REDFISH_CHANGE * 3)
    assert await bmcs.power_state(target(spec)) == PowerState.ON
    return dt.datetime.now(dt.UTC)


async def has_reason(kube: AsyncClient, name: str, reason: str) -> bool:
    return reason in await reasons(kube, name)


async def reasons(kube: AsyncClient, name: str) -> list[str]:
    return [
        e.reason
        async for e in kube.list(Event, namespace=NAMESPACE)
        if e.involvedObject.name == name
    ]


@pytest.mark.parametrize("kind", ["ipmi", "redfish"])
async def test_basic_reboot(
    hosts_lab: lab.RunningLab, controller: Metalmend, kube: AsyncClient, bmcs: BmcPool, kind: str
) -> None:
    spec = host(hosts_lab, kind)
    asked = await settled(kube, spec, bmcs)
    await annotate(kube, spec.name, {REBOOT: ""})
    await until(lambda: rebooted_after(kube, spec.name, asked), within=REDFISH_CHANGE * 3)
    assert REBOOT not in ((await bmh(kube, spec.name)).metadata.annotations or {})
    assert await bmcs.power_state(target(spec)) == PowerState.ON

    async def told() -> bool:  # the Events are recorded after the status, on their own
        said = set(await reasons(kube, spec.name))
        return {"RebootRequested", "PowerOff", "PowerOn", "RebootCompleted"} <= said

    await until(told)


async def test_two_clients_hold_the_host_off_until_both_are_done(
    hosts_lab: lab.RunningLab, controller: Metalmend, kube: AsyncClient, bmcs: BmcPool
) -> None:
    spec = host(hosts_lab, "ipmi")
    asked = await settled(kube, spec, bmcs)
    first, second = "reboot.metal3.io/first-client", "reboot.metal3.io/second-client"
    await annotate(kube, spec.name, {first: "", second: '{"mode":"hard"}'})

    async def off() -> bool:
        return await bmcs.power_state(target(spec)) == PowerState.OFF

    await until(off, within=10)
    await annotate(kube, spec.name, {first: None})
    await asyncio.sleep(3)  # several reconciles: the second key still holds it
    assert await off()
    annotations = (await bmh(kube, spec.name)).metadata.annotations or {}
    assert second in annotations, "the controller never removes a keyed annotation"
    await annotate(kube, spec.name, {second: None})
    await until(lambda: rebooted_after(kube, spec.name, asked), within=15)


async def test_hard_beats_soft_even_when_the_bmc_ignores_soft(
    hosts_lab: lab.RunningLab, controller: Metalmend, kube: AsyncClient, bmcs: BmcPool
) -> None:
    spec = host(hosts_lab, "ipmi")
    lab_dir = hosts_lab.plane.workdir.parent
    asked = await settled(kube, spec, bmcs)
    lab.inject_fault(lab_dir, spec.name, "ignore-soft")
    try:
        began = time.monotonic()
        await annotate(kube, spec.name, {"reboot.metal3.io/gentle": "{'mode':'soft'}",
                                         "reboot.metal3.io/urgent": '{"mode":"hard"}'})  # fmt: skip
        await until(lambda: _power_is(bmcs, spec, PowerState.OFF), within=10)
        assert time.monotonic() - began < SOFT_TIMEOUT, "hard at once, no soft timeout waited"
        await annotate(
            kube, spec.name, {"reboot.metal3.io/gentle": None, "reboot.metal3.io/urgent": None}
        )
        await until(lambda: rebooted_after(kube, spec.name, asked), within=15)
    finally:
        lab.inject_fault(lab_dir, spec.name, "honour-soft")


async def test_soft_falls_back_to_hard_when_the_bmc_ignores_graceful_shutdown(
    hosts_lab: lab.RunningLab, controller: Metalmend, kube: AsyncClient, bmcs: BmcPool
) -> None:
    spec = host(hosts_lab, "ipmi")
    lab_dir = hosts_lab.plane.workdir.parent
    asked = await settled(kube, spec, bmcs)
    lab.inject_fault(lab_dir, spec.name, "ignore-soft")
    try:
        await annotate(kube, spec.name, {REBOOT: ""})
        # An instant lab BMC is off for milliseconds: judge by the record, not by polling.
        await until(lambda: rebooted_after(kube, spec.name, asked), within=SOFT_TIMEOUT + 15)
        pending, last = times(await bmh(kube, spec.name))
        assert pending is not None
        assert last is not None
        assert (last - pending).total_seconds() >= SOFT_TIMEOUT - 0.5, "soft was given its time"
        await until(lambda: has_reason(kube, spec.name, "SoftPowerOffTimedOut"), within=10)
    finally:
        lab.inject_fault(lab_dir, spec.name, "honour-soft")


async def _power_is(bmcs: BmcPool, spec: HostSpec, state: PowerState) -> bool:
    return await bmcs.power_state(target(spec)) == state


@pytest.mark.parametrize("phase", ["requested", "held off", "released"])
async def test_killed_in_any_phase_the_reboot_still_completes(
    hosts_lab: lab.RunningLab, controller: Metalmend, kube: AsyncClient, bmcs: BmcPool, phase: str
) -> None:
    spec = host(hosts_lab, "ipmi")
    asked = await settled(kube, spec, bmcs)
    hold = "reboot.metal3.io/maintenance"
    await annotate(kube, spec.name, {hold: ""})
    if phase == "requested":  # killed as soon as the request is on record
        await until(lambda: _pending(kube, spec.name, asked), within=10)
        controller.kill()
        controller.start()
    await until(lambda: _power_is(bmcs, spec, PowerState.OFF), within=10)
    if phase == "held off":
        controller.kill()
        controller.start()
        await asyncio.sleep(2)
        assert await _power_is(bmcs, spec, PowerState.OFF), "a restart does not un-fence"
    await annotate(kube, spec.name, {hold: None})
    if phase == "released":
        controller.kill()
        await asyncio.sleep(1)
        controller.start()
    await until(lambda: rebooted_after(kube, spec.name, asked), within=20)
    assert await _power_is(bmcs, spec, PowerState.ON), "never left off"


async def _pending(kube: AsyncClient, name: str, asked: dt.datetime) -> bool:
    pending, _ = times(await bmh(kube, name))
    return pending is not None and pending >= asked


async def test_malformed_values_warn_and_still_reboot(
    hosts_lab: lab.RunningLab, controller: Metalmend, kube: AsyncClient, bmcs: BmcPool
) -> None:
    """The lab installs the chart's admission policies, which refuse a malformed value;
    host-power still copes with one stored where they are not installed (here: the
    binding removed for the test)."""
    spec = host(hosts_lab, "ipmi")
    asked = await settled(kube, spec, bmcs)
    with pytest.raises(ApiError, match="malformed reboot annotation value"):
        await annotate(kube, spec.name, {REBOOT: "{mode: hard"})
    binding = "metalmend-reboot-annotation-values"
    admin = hosts_lab.client()
    admin.delete(ValidatingAdmissionPolicyBinding, binding)
    try:

        async def stored() -> bool:
            with contextlib.suppress(ApiError):  # the removal takes a moment to be seen
                await annotate(kube, spec.name, {REBOOT: "{mode: hard"})
                return True
            return False

        await until(stored, within=30)
        await until(lambda: rebooted_after(kube, spec.name, asked), within=15)
        await until(lambda: has_reason(kube, spec.name, "InvalidRebootAnnotation"), within=10)
    finally:
        lab_policies.install(admin)


async def test_bmc_failure_is_reported_in_status_and_cleared_when_it_answers(
    hosts_lab: lab.RunningLab, controller: Metalmend, kube: AsyncClient, bmcs: BmcPool
) -> None:
    spec = host(hosts_lab, "ipmi")
    lab_dir = hosts_lab.plane.workdir.parent
    await settled(kube, spec, bmcs)
    lab.inject_fault(lab_dir, spec.name, "bmc-down")
    try:
        await annotate(kube, spec.name, {"reboot.metal3.io/while-down": ""})

        async def failing() -> bool:
            status = (await bmh(kube, spec.name))["status"]
            return status.get("operationalStatus") == "error"

        await until(failing, within=30)
        status = (await bmh(kube, spec.name))["status"]
        assert status["errorType"] == "power management error"
        assert status["errorCount"] >= 1
        assert spec.password not in status["errorMessage"]
        # The Event follows the status write (facts first): wait for it, do not race it.
        await until(lambda: has_reason(kube, spec.name, "BMCError"), within=10)
    finally:
        lab.inject_fault(lab_dir, spec.name, "bmc-up")
        await annotate(kube, spec.name, {"reboot.metal3.io/while-down": None})

    async def recovered() -> bool:
        status = (await bmh(kube, spec.name))["status"]
        return status.get("operationalStatus") == "OK" and not status.get("errorType")

    # pyghmi holds a session to the lost BMC for ~15 s and errors back off up to 60 s.
    await until(recovered, within=90)


async def test_a_power_on_recorded_but_never_sent_is_sent_after_a_restart(
    hosts_lab: lab.RunningLab, controller: Metalmend, kube: AsyncClient, bmcs: BmcPool
) -> None:
    """Issue: a controller killed between recording a power command and sending it left the
    host off for the 30 s in-flight guard. The record here is from a previous leader whose
    clock ran ahead (10 minutes): the old guard would hold the host off until then; a
    restarted controller did not send it itself, reads the BMC (off) and sends it."""
    spec = host(hosts_lab, "ipmi")
    await settled(kube, spec, bmcs)
    controller.stop()
    await bmcs.power_off(target(spec), hard=True)
    await until(lambda: _power_is(bmcs, spec, PowerState.OFF), within=10)
    recorded = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10)
    await kube.patch(
        BareMetalHost.Status, spec.name,
        {"status": {"poweredOn": False,
                    "lastPowerCommand": {"action": "on", "at": stamp(recorded)}}},
        namespace=NAMESPACE, patch_type=PatchType.MERGE,
    )  # fmt: skip
    controller.start()
    await until(lambda: _power_is(bmcs, spec, PowerState.ON), within=30)
