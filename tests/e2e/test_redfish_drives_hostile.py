"""Drives and erase against a hostile BMC (the small HTTP server of
test_redfish_hostile): a drive or an erase action outside the host's own system, lists too
long to read in one call, a task monitor elsewhere, an erase the BMC says failed, fields of
the wrong type or size. Each is refused with a clear error, and nothing is erased that the
host does not own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from metalmend.bmc.errors import BmcError, Unsupported
from metalmend.bmc.storage import MAX_DRIVES, EraseFailed
from tests.e2e.test_redfish_hostile import SYSTEM, HostileBmc, Responder, answer, healthy, system

STORAGE = f"{SYSTEM}/Storage"
CONTROLLER = f"{STORAGE}/1"
DRIVE = f"{CONTROLLER}/Drives/0"
ERASE = f"{DRIVE}/Actions/Drive.SecureErase"
OTHER_SYSTEM_DRIVE = "/redfish/v1/Systems/2/Storage/1/Drives/0"


def drive(**fields: Any) -> Responder:
    document: dict[str, Any] = {
        "@odata.type": "#Drive.v1_9_0.Drive",
        "@odata.id": DRIVE,
        "Id": "0",
        "CapacityBytes": 240 << 30,
        "MediaType": "SSD",
        "SerialNumber": "S1",
        "Identifiers": [{"DurableNameFormat": "NAA", "DurableName": "500A07512345678A"}],
        "Actions": {"#Drive.SecureErase": {"target": ERASE}},
    }
    document.update(fields)
    return answer(document)


def drives_bmc(*links: str, **overrides: Responder) -> dict[str, Responder]:
    routes = healthy(**{SYSTEM: system(Storage={"@odata.id": STORAGE})})
    routes[STORAGE] = answer({"Members": [{"@odata.id": CONTROLLER}]})
    routes[CONTROLLER] = answer({"Drives": [{"@odata.id": link} for link in links or (DRIVE,)]})
    routes[DRIVE] = drive()
    routes.update(overrides)
    return routes


def accepted(location: str) -> Responder:
    async def respond(bmc: HostileBmc, _: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(
            f"HTTP/1.1 202 Accepted\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode()
        )
        await w.drain()

    return respond


def posts(bmc: HostileBmc) -> list[str]:
    return [r.path for r in bmc.requests if r.method == "POST"]


async def test_a_well_formed_drive_is_read_with_its_wwn() -> None:
    async with HostileBmc(drives_bmc()).running() as bmc:
        driver = bmc.driver()
        try:
            (only,) = await driver.drives()
        finally:
            await driver.close()
    assert (only.id, only.serial_number, only.wwn, only.rotational) == (
        DRIVE,
        "S1",
        "0x500a07512345678a",
        False,
    )


async def test_a_drive_of_another_system_is_not_followed() -> None:
    async with HostileBmc(drives_bmc(OTHER_SYSTEM_DRIVE)).running() as bmc:
        driver = bmc.driver()
        with pytest.raises(
            BmcError, match="outside the system /redfish/v1/Systems/1; not followed"
        ):
            await driver.drives()
        await driver.close()
    assert OTHER_SYSTEM_DRIVE not in [r.path for r in bmc.requests]


async def test_an_erase_target_outside_the_system_is_refused_and_nothing_is_posted() -> None:
    elsewhere = "/redfish/v1/Systems/2/Storage/1/Drives/0/Actions/Drive.SecureErase"
    routes = drives_bmc(**{DRIVE: drive(Actions={"#Drive.SecureErase": {"target": elsewhere}})})
    async with HostileBmc(routes).running() as bmc:
        driver = bmc.driver()
        with pytest.raises(
            BmcError, match=r"target of #Drive\.SecureErase .* is outside the system"
        ):
            await driver.start_erase(DRIVE)
        await driver.close()
    assert posts(bmc) == []


async def test_an_erase_target_on_another_host_is_refused_and_nothing_is_posted() -> None:
    routes = drives_bmc(
        **{DRIVE: drive(Actions={"#Drive.SecureErase": {"target": "https://evil.example/x"}})}
    )
    async with HostileBmc(routes).running() as bmc:
        driver = bmc.driver()
        with pytest.raises(BmcError, match="not followed"):
            await driver.start_erase(DRIVE)
        await driver.close()
    assert posts(bmc) == []


async def test_a_drive_id_outside_the_system_is_not_erased() -> None:
    async with HostileBmc(drives_bmc()).running() as bmc:
        driver = bmc.driver()
        with pytest.raises(BmcError, match="outside the system"):
            await driver.start_erase(OTHER_SYSTEM_DRIVE)
        await driver.close()
    assert posts(bmc) == []


async def test_a_drive_without_the_erase_action_is_unsupported() -> None:
    async with HostileBmc(drives_bmc(**{DRIVE: drive(Actions={})})).running() as bmc:
        driver = bmc.driver()
        with pytest.raises(Unsupported, match=r"offers no #Drive\.SecureErase action"):
            await driver.start_erase(DRIVE)
        await driver.close()
    assert posts(bmc) == []


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        pytest.param(
            drives_bmc(*(f"{CONTROLLER}/Drives/{n}" for n in range(5000))),
            f"lists more than {MAX_DRIVES} drives; not read",
            id="5000 drives",
        ),
        pytest.param(
            drives_bmc(
                **{
                    STORAGE: answer(
                        {"Members": [{"@odata.id": f"{STORAGE}/{n}"} for n in range(100)]}
                    )
                }
            ),
            "lists 100 storage subsystems, more than the 16 read",
            id="100 storage subsystems",
        ),
        pytest.param(
            drives_bmc(**{CONTROLLER: answer({"Drives": {"@odata.id": DRIVE}})}),
            "Drives of /redfish/v1/Systems/1/Storage/1 is not a list",
            id="Drives not a list",
        ),
        pytest.param(
            healthy(**{SYSTEM: system()}),
            "the Storage link of /redfish/v1/Systems/1 is missing or not a string",
            id="no Storage link",
        ),
    ],
)
async def test_lists_too_long_or_malformed_are_refused(
    routes: dict[str, Responder], message: str
) -> None:
    async with HostileBmc(routes).running() as bmc:
        driver = bmc.driver()
        with pytest.raises(BmcError, match=message):
            await driver.drives()
        await driver.close()
    assert len(bmc.requests) < 20  # refused from the list, not after reading thousands


async def test_a_task_monitor_on_another_endpoint_is_not_followed() -> None:
    routes = drives_bmc(**{ERASE: accepted("https://evil.example:443/redfish/v1/Tasks/1")})
    async with HostileBmc(routes).running() as bmc:
        driver = bmc.driver()
        with pytest.raises(BmcError, match="names a task monitor on another endpoint"):
            await driver.start_erase(DRIVE)
        await driver.close()


async def test_an_erase_the_bmc_says_failed_is_erase_failed() -> None:
    monitor = "/redfish/v1/TaskService/TaskMonitors/7"
    failed = answer(
        {"TaskState": "Exception", "Messages": [{"Message": "sanitize aborted: media error"}]}
    )
    routes = drives_bmc(**{ERASE: accepted(monitor), monitor: failed})
    async with HostileBmc(routes).running() as bmc:
        driver = bmc.driver()
        assert await driver.start_erase(DRIVE) == monitor
        with pytest.raises(EraseFailed, match="ended Exception: sanitize aborted: media error"):
            await driver.erase_status(DRIVE, monitor)
        await driver.close()


@pytest.mark.parametrize(
    ("status", "finished"), [(202, False), (204, True), (200, True)], ids=["202", "204", "200"]
)
async def test_a_task_monitor_without_a_body_says_running_or_over(
    status: int, finished: bool
) -> None:
    monitor = "/redfish/v1/TaskService/TaskMonitors/9"

    async def empty(bmc: HostileBmc, _: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n".encode())
        await w.drain()

    async with HostileBmc(drives_bmc(**{monitor: empty})).running() as bmc:
        driver = bmc.driver()
        assert (await driver.erase_status(DRIVE, monitor)).finished is finished
        await driver.close()


async def test_fields_of_the_wrong_type_or_size_are_absent_or_cut() -> None:
    odd = drive(CapacityBytes="9" * 50, Model="M" * 100_000, SerialNumber=7, MediaType=["HDD"])
    async with HostileBmc(drives_bmc(**{DRIVE: odd})).running() as bmc:
        driver = bmc.driver()
        (only,) = await driver.drives()
        await driver.close()
    assert (only.capacity_bytes, only.serial_number, only.rotational) == (0, "", None)
    assert len(only.model) == 256
