"""``status.poweredOffFor`` on the real API server: the BareMetalHost CRD admits the list of
reboot keys host-power writes, and refuses anything else there (remediation reads it to
decide whether it may delete a Node)."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost
from metalmend.policy.fencing import POWERED_OFF_FOR, host_power, reported_off

KEY = "reboot.metal3.io/metal3-remediation-u1"


async def test_the_crd_admits_the_keys_powered_off_for_and_nothing_else(
    aclient: AsyncClient, namespace: str
) -> None:
    host: Any = BareMetalHost(
        metadata=ObjectMeta(name="h1", annotations={KEY: '{"mode":"hard"}'}),
        spec={"online": True, "bmc": {"address": "redfish://bmc.example/redfish/v1/Systems/1"}},
    )
    client: Any = aclient  # (lightkube's overloads do not cover generic resources)
    await client.create(host, namespace=namespace)
    status = {"poweredOn": False, POWERED_OFF_FOR: [KEY]}
    written: Any = await aclient.patch(
        BareMetalHost.Status, "h1", {"status": status},
        namespace=namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip
    assert written.get("status")[POWERED_OFF_FOR] == [KEY]
    assert reported_off(host_power(written.get("status"), written.metadata.annotations, KEY))
    with pytest.raises(ApiError) as refused:
        await aclient.patch(
            BareMetalHost.Status, "h1", {"status": {POWERED_OFF_FOR: KEY}},
            namespace=namespace, patch_type=PatchType.MERGE,
        )  # fmt: skip
    assert refused.value.status.code == 422
