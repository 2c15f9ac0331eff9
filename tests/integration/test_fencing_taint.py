"""Fencing by the out-of-service taint on the real API server: power off and hold, confirm
off with metalmend's own BMC reads, taint, wait for the Node's pods and VolumeAttachments
to go, power on, untaint once Ready; and a kill of the controller in the middle.

The test plays host-power (it writes the host's power status) and the BMC that the
remediation controller reads (``Bmc``: the hardware; everything Kubernetes is real). No
kube-controller-manager runs here: the test removes the tainted Node's pods and
attachments itself, as its taint manager, pod GC and attach-detach controller would."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.storage_v1 import VolumeAttachment
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.resources import Metal3Remediation
from metalmend.bmc import Unreachable
from metalmend.controllers import remediation
from metalmend.settings import FenceMethod, RemediationSettings
from tests.integration.test_remediation import (
    Controllers,
    World,
    _has,
    _is_none,
    _lacks,
    key_of,
    phase_is,
)
from tests.support import until

HOLD = "example.com/hold"
TAINT = RemediationSettings(
    fence=FenceMethod.OUT_OF_SERVICE_TAINT,
    confirm_window=1.0,
    confirm_reads=3,
    evacuation_poll=0.2,
)


@pytest.fixture
async def controllers(aclient: AsyncClient, namespace: str) -> AsyncIterator[Controllers]:
    running = Controllers(aclient, namespace)
    yield running
    await running.kill()


@pytest.fixture
async def world(aclient: AsyncClient, namespace: str) -> AsyncIterator[World]:
    made = World(aclient, namespace)
    yield made
    await made.cleanup()


class Bmc:
    """The hosts' BMCs as the remediation controller reads them (read-only)."""

    def __init__(self) -> None:
        self.off: dict[str, bool | None] = {}  # host -> off? (None: unreachable)
        self.reads = 0

    async def is_off(self, host: Any) -> bool:
        self.reads += 1
        off = self.off.get(host.metadata.name, False)
        if off is None:
            raise Unreachable("BMC unreachable")
        return off


async def tainted(world: World, machine: str) -> bool:
    node = await world.node_obj(machine)
    return node is not None and names.OUT_OF_SERVICE_TAINT in [
        t.key for t in node.spec.taints or []
    ]


async def untainted(world: World, machine: str) -> bool:
    return not await tainted(world, machine)


async def attach(world: World, name: str, machine: str) -> None:
    await world.client.create(
        VolumeAttachment.from_dict(
            {
                "metadata": {"name": name},
                "spec": {
                    "attacher": "csi.example.com",
                    "nodeName": world.node_name(machine),
                    "source": {"persistentVolumeName": f"pv-{name}"},
                },
            }
        )
    )


async def ready_again(world: World, machine: str) -> None:
    """The kubelet of the powered-on host reports Ready (a new transition)."""
    now = dt.datetime.now(dt.UTC).isoformat()
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    await world.client.patch(
        Node.Status,
        world.node_name(machine),
        {"status": {"conditions": [condition]}},
        patch_type=PatchType.STRATEGIC,
    )


async def not_ready(world: World, machine: str) -> None:
    now = dt.datetime.now(dt.UTC).isoformat()
    condition = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    await world.client.patch(
        Node.Status,
        world.node_name(machine),
        {"status": {"conditions": [condition]}},
        patch_type=PatchType.STRATEGIC,
    )


async def message(world: World, name: str) -> str:
    obj = await world.get(Metal3Remediation, name)
    return str(((obj.get("status") or {}) if obj else {}).get("message") or "")


async def test_taint_only_after_confirmation_and_power_on_only_after_evacuation(
    world: World, controllers: Controllers
) -> None:
    bmc = Bmc()
    setup = functools.partial(remediation.setup, reader=bmc)
    await controllers.start(setup, remediation=TAINT)
    machine = await world.machine("m1")
    await world.pod_on("m1", "db-0")
    await world.pod_on("m1", "web-0")
    # a finalizer another controller holds: deleted, the pod stays until it lets go
    await world.client.patch(
        Pod,
        "web-0",
        {"metadata": {"finalizers": [HOLD]}},
        namespace=world.ns,
        patch_type=PatchType.MERGE,
    )
    await attach(world, "va-db-0", "m1")
    await not_ready(world, "m1")
    obj = await world.remediation(machine)
    key = key_of(obj)
    await until(lambda: _has(world.host_annotations("host-m1"), key))

    # host-power reports it off, but the BMC still reads on: no taint, the power-off again
    bmc.off["host-m1"] = False
    await world.power("host-m1", on=False)
    await until(lambda: _contains(message(world, "m1"), "read on from its BMC"))
    # (host-power, played here, still says off: the confirmation starts over and over)
    assert await world.phase("m1") in ("power-off", "confirming-off")
    assert await untainted(world, "m1"), "tainted while the BMC read on"

    # now it reads off: three reads over a second, then the taint; the key stays
    bmc.off["host-m1"] = True
    await world.power("host-m1", on=True)  # host-power saw it on, then off again
    await world.power("host-m1", on=False)
    await until(await phase_is(world, "m1", "evacuating"))
    assert bmc.reads >= 4
    assert await tainted(world, "m1")
    got = await world.get(Metal3Remediation, "m1")
    assert got.status["offReads"] == 3
    assert key in await world.host_annotations("host-m1")

    # killed while evacuating: the new process holds the host off just the same
    await controllers.kill()
    await controllers.start(setup, remediation=TAINT)
    # confirmed off: metalmend deleted the Node's pods at once; web-0 is held by its
    # finalizer, and the host stays off for it
    await until(lambda: _is_none(world.get(Pod, "db-0")))
    await until(lambda: _contains(message(world, "m1"), "web-0"))
    await world.client.patch(
        Pod,
        "web-0",
        {"metadata": {"finalizers": None}},
        namespace=world.ns,
        patch_type=PatchType.MERGE,
    )
    await until(lambda: _is_none(world.get(Pod, "web-0")))
    await until(lambda: _contains(message(world, "m1"), "va-db-0"))
    assert key in await world.host_annotations("host-m1"), "released with a volume attached"
    assert await world.phase("m1") == "evacuating"
    await world.client.delete(VolumeAttachment, "va-db-0")

    # evacuated: the key goes (host-power powers on), the taint stays until Ready
    await until(await phase_is(world, "m1", "power-on"))
    await until(lambda: _lacks(world.host_annotations("host-m1"), key))
    assert await tainted(world, "m1")
    await world.power("host-m1", on=True)
    await asyncio.sleep(1.1)  # Ready's transition time has whole seconds
    await ready_again(world, "m1")
    await until(await phase_is(world, "m1", "waiting"))
    await until(lambda: untainted(world, "m1"))


async def test_a_failing_bmc_read_never_leads_to_the_taint(
    world: World, controllers: Controllers
) -> None:
    bmc = Bmc()
    bmc.off["host-m1"] = None
    await controllers.start(functools.partial(remediation.setup, reader=bmc), remediation=TAINT)
    machine = await world.machine("m1")
    obj = await world.remediation(machine, powerOffTimeoutSeconds=1)
    await until(lambda: _has(world.host_annotations("host-m1"), key_of(obj)))
    await world.power("host-m1", on=False)
    await until(lambda: _contains(message(world, "m1"), "BMC unreachable"))
    await until(await phase_is(world, "m1", "backoff"))  # after the timeout and the window
    assert await untainted(world, "m1")
    await until(lambda: _lacks(world.host_annotations("host-m1"), key_of(obj)))


async def test_deleting_the_remediation_untaints_and_releases(
    world: World, controllers: Controllers
) -> None:
    bmc = Bmc()
    bmc.off["host-m1"] = True
    await controllers.start(functools.partial(remediation.setup, reader=bmc), remediation=TAINT)
    machine = await world.machine("m1")
    await world.pod_on("m1", "db-0")
    # Its volume still attached holds the remediation in evacuating (its pods alone are
    # deleted at once: a test polling for the phase could miss it on a busy machine).
    await attach(world, "va-m1", "m1")
    obj = await world.remediation(machine)
    await until(lambda: _has(world.host_annotations("host-m1"), key_of(obj)))
    await world.power("host-m1", on=False)
    await until(await phase_is(world, "m1", "evacuating"))
    await world.client.delete(Metal3Remediation, "m1", namespace=world.ns)
    await until(lambda: _is_none(world.get(Metal3Remediation, "m1")))
    assert await untainted(world, "m1")
    assert key_of(obj) not in await world.host_annotations("host-m1")
    await world.client.delete(VolumeAttachment, "va-m1")
    with contextlib.suppress(ApiError):
        await world.client.delete(Pod, "db-0", namespace=world.ns, grace_period=0)


async def _contains(found: Any, text: str) -> bool:
    return text in await found
