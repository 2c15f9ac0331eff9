"""What Redfish's storage answers mean (bmc/storage.py), without a server: a Drive resource
in our vocabulary (WWN as Linux writes it, media and rotation), an erase as a Drive or a
Task reports it; and the pool refusing drives on IPMI before anything is sent."""

from __future__ import annotations

from typing import Any

import pytest

from metalmend.api.storage import MediaType
from metalmend.bmc.address import parse
from metalmend.bmc.errors import Unsupported
from metalmend.bmc.pool import BmcPool, BmcTarget, Credentials
from metalmend.bmc.storage import EraseStatus, drive_from_redfish, erase_in_drive, task_state


@pytest.mark.parametrize(
    ("resource", "expected"),
    [
        pytest.param(
            {
                "MediaType": "HDD",
                "Identifiers": [{"DurableNameFormat": "NAA", "DurableName": "5000C500AAAAAAA1"}],
            },
            {"rotational": True, "media_type": MediaType.HDD, "wwn": "0x5000c500aaaaaaa1"},
            id="HDD with a 64-bit NAA WWN",
        ),
        pytest.param(
            {
                "MediaType": "SSD",
                "Protocol": "NVMe",
                "Identifiers": [
                    {
                        "DurableNameFormat": "NAA",
                        "DurableName": "0x600508B1001C0A1B2C3D4E5F60718293",
                    }
                ],
            },
            {
                "rotational": False,
                "media_type": MediaType.NVME,
                "wwn": "0x600508b1001c0a1b",
                "wwn_with_extension": "0x600508b1001c0a1b2c3d4e5f60718293",
                "wwn_vendor_extension": "0x2c3d4e5f60718293",
            },
            id="NVMe SSD with a 128-bit NAA name: WWN and its vendor extension",
        ),
        pytest.param(
            {
                "MediaType": "SMR",
                "Identifiers": [
                    {"DurableNameFormat": "UUID", "DurableName": "x"},
                    {"DurableNameFormat": "NAA", "DurableName": "nothex-nothex-12"},
                ],
            },
            {"rotational": True, "wwn": ""},
            id="SMR spins; a UUID or a non-hex NAA is no WWN",
        ),
        pytest.param(
            {
                "MediaType": "Tape",
                "CapacityBytes": True,
                "Model": "A\x00B\u2028C ",
            },
            {
                "rotational": None,
                "media_type": MediaType.UNKNOWN,
                "capacity_bytes": 0,
                "model": "ABC",
            },
            id="unknown media, a boolean size, control characters",
        ),
    ],
)
def test_a_redfish_drive_in_our_vocabulary(
    resource: dict[str, Any], expected: dict[str, Any]
) -> None:
    drive = drive_from_redfish("/redfish/v1/Systems/1/Storage/1/Drives/0", resource)
    assert drive.id == "/redfish/v1/Systems/1/Storage/1/Drives/0"
    assert drive.name == ""
    for field, value in expected.items():
        assert getattr(drive, field) == value, field


@pytest.mark.parametrize(
    ("resource", "status"),
    [
        pytest.param({"Status": {"State": "Enabled"}}, EraseStatus(True, 100), id="idle: finished"),
        pytest.param(
            {"Operations": [{"OperationName": "Sanitize", "PercentageComplete": 40}]},
            EraseStatus(False, 40),
            id="an operation listed",
        ),
        pytest.param(
            {"Operations": [{"PercentageComplete": 400}]},
            EraseStatus(False, None),
            id="a percentage out of range is unknown",
        ),
        pytest.param(
            {"Status": {"State": "Updating"}},
            EraseStatus(False, None),
            id="updating without operations",
        ),
        pytest.param({"Operations": "busy"}, EraseStatus(True, 100), id="Operations not a list"),
    ],
)
def test_an_erase_as_the_drive_reports_it(resource: dict[str, Any], status: EraseStatus) -> None:
    assert erase_in_drive(resource) == status


def test_a_task_state_with_its_messages() -> None:
    task = {
        "TaskState": "Exception",
        "PercentComplete": 30,
        "Messages": [{"Message": "a"}, {"Message": 3}, "b", {"Message": "c"}],
    }
    assert task_state(task) == ("Exception", 30, "a; c")
    assert task_state({"TaskState": 5}) == (None, None, "")


async def test_the_pool_refuses_drives_on_ipmi_before_sending_anything() -> None:
    pool = BmcPool()
    target = BmcTarget(parse("ipmi://192.0.2.1:623"), Credentials("u", "p"))
    try:
        with pytest.raises(Unsupported, match="IPMI cannot list or erase drives; use Redfish"):
            await pool.drives(target)
        with pytest.raises(Unsupported):
            await pool.start_erase(target, "x")
        with pytest.raises(Unsupported):
            await pool.erase_status(target, "x")
    finally:
        await pool.close()
