"""Drives and their secure erase through the Redfish driver, against the lab's emulator
(sushy-tools' process with the lab's drives, ``lab.emulator``): the drives listed as the
host's inventory has them, one erased for real (its files gone, every other drive intact),
the erase's progress visible while it runs, and the erase carried through a client that
goes away and through an emulator restarted in the middle."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from metalmend.api.storage import MediaType, inventory_from_metal3, with_inventory
from metalmend.bmc.address import parse
from metalmend.bmc.errors import Unsupported
from metalmend.bmc.pool import BmcPool, BmcTarget, Credentials
from metalmend.bmc.settings import BmcSettings
from metalmend.destroy.policy.rootdevice import RootDeviceHints, os_drive
from metalmend_lab import drives
from metalmend_lab.controlplane import LOOPBACK, free_port
from metalmend_lab.hosts import emulator_argv, emulator_config
from metalmend_lab.inventory import HardwareConfig, HostSpec
from metalmend_lab.pki import CertificateAuthority
from tests.support import STARTUP, Deadline

ERASE_SECONDS = 3.0
SETTINGS = BmcSettings(timeout=10.0)


@dataclass
class Lab:
    config: HardwareConfig
    conf_file: Path
    ca_file: str
    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def lab_dir(self) -> Path:
        return Path(self.config.lab_dir)

    def host(self, index: int) -> HostSpec:
        return self.config.hosts[index]

    def target(self, index: int) -> BmcTarget:
        spec = self.host(index)
        address = f"redfish+https://{LOOPBACK}:{self.port}/redfish/v1/Systems/{spec.system_id}"
        return BmcTarget(parse(address), Credentials(spec.username, spec.password))

    def drive_path(self, index: int, drive: str) -> str:
        return f"/redfish/v1/Systems/{self.host(index).system_id}/Storage/1/Drives/{drive}"

    def files(self, index: int, drive: str) -> list[str]:
        return drives.content(self.lab_dir, self.host(index).name, drive)

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                emulator_argv(self.conf_file), stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        trust = ssl.create_default_context(cafile=self.ca_file)
        deadline = Deadline(STARTUP)
        while True:
            try:
                httpx.get(f"https://{LOOPBACK}:{self.port}/redfish/v1/", verify=trust, timeout=1)
                return
            except httpx.HTTPError:
                if self.process.poll() is not None or deadline.expired():
                    raise AssertionError(
                        f"emulator did not start:\n{self.log.read_text()}"
                    ) from None
                time.sleep(0.1)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


@pytest.fixture
def emulated(tmp_path: Path) -> Iterator[Lab]:
    """Two Redfish hosts (the second with two data drives) on one emulator."""
    ca = CertificateAuthority(tmp_path / "pki")
    serving = ca.issue("bmc", "bmc", ip_addresses=(LOOPBACK,), server=True)
    hosts = []
    for index in range(2):
        name = f"host-{index}"
        hosts.append(
            HostSpec(
                name=name,
                namespace="lab",
                bmc="redfish",
                bmc_port=0,
                internal_port=0,
                username=f"admin-{name}",
                password=f"pw-{name}-secret",
                provider_id="",
                kubeconfig="",
                system_id=f"00000000-0000-4000-8000-00000000000{index}",
                drives=drives.plan(name, index),
            )
        )
        drives.seed(tmp_path, name, hosts[-1].drives)
    config = HardwareConfig(str(tmp_path), hosts, str(ca.pair.cert), ERASE_SECONDS)
    port = free_port()
    conf = emulator_config(config, tmp_path / "redfish", serving.cert, serving.key, port)
    lab = Lab(config, conf, str(ca.pair.cert), port, tmp_path / "emulator.log")
    lab.start()
    try:
        yield lab
    finally:
        lab.kill()


def trusting(lab: Lab) -> BmcPool:
    return BmcPool(BmcSettings(timeout=10.0, ca_bundle=lab.ca_file))


async def test_drives_are_listed_as_the_hosts_inventory_has_them(emulated: Lab) -> None:
    pool = trusting(emulated)
    try:
        listed = await pool.drives(emulated.target(1))
    finally:
        await pool.close()
    planned = emulated.host(1).drives
    assert [d.id for d in listed] == [emulated.drive_path(1, d.id) for d in planned]
    for drive, spec in zip(listed, planned, strict=True):
        assert (drive.serial_number, drive.wwn, drive.capacity_bytes) == (
            spec.serial_number, spec.wwn, spec.capacity_bytes,
        )  # fmt: skip
        assert (drive.model, drive.vendor) == (spec.model, spec.vendor)
        assert drive.rotational is (spec.media_type == "HDD")
        assert drive.name == ""  # a BMC does not know the OS's device names
    assert listed[0].media_type == MediaType.SSD
    # The inspection inventory (what the lab writes into status.hardware.storage) names
    # them; the hints the lab sets then choose the OS drive the BMC can erase.
    inventory = inventory_from_metal3([s.drive().to_metal3() for s in planned])
    chosen = os_drive(
        RootDeviceHints.from_wire({"deviceName": "/dev/sda"}), with_inventory(listed, inventory)
    )
    assert not isinstance(chosen, str)
    assert chosen.id == emulated.drive_path(1, drives.OS_DRIVE)


async def test_an_erase_removes_that_drives_content_only_and_shows_its_progress(
    emulated: Lab,
) -> None:
    pool = trusting(emulated)
    target, data = emulated.target(1), emulated.drive_path(1, "data1")
    before = {d: emulated.files(1, d) for d in ("os", "data1", "data2")}
    other_host = emulated.files(0, "data1")
    assert all(len(files) == drives.SEED_FILES for files in before.values())
    try:
        monitor = await pool.start_erase(target, data)
        assert monitor is not None
        assert monitor.startswith("/redfish/v1/TaskService/TaskMonitors/")
        # Asked again while it runs (a destroy resumed after a restart): the same erase.
        again = await pool.start_erase(target, data)
        assert again == monitor.replace("TaskMonitors", "Tasks")  # its Task, no new one
        assert len(list((emulated.lab_dir / "drives" / "tasks").glob("*.json"))) == 1
        seen: list[int] = []
        partial: list[int] = []
        deadline = Deadline(ERASE_SECONDS + 10)
        while not (status := await pool.erase_status(target, data)).finished:
            assert not deadline.expired(), "the erase did not finish"
            if status.percent is not None:
                seen.append(status.percent)
            partial.append(len(emulated.files(1, "data1")))
            await asyncio.sleep(0.3)
        assert await pool.erase_finished(target, data, monitor)
    finally:
        await pool.close()
    assert seen == sorted(seen)
    assert any(0 < p < 100 for p in seen), f"no progress seen while it ran: {seen}"
    assert any(0 < n < drives.SEED_FILES for n in partial), f"files left while erasing: {partial}"
    assert emulated.files(1, "data1") == []
    assert (emulated.lab_dir / "drives" / "host-1" / "data1").is_dir()  # wiped, not removed
    assert emulated.files(1, "os") == before["os"]
    assert emulated.files(1, "data2") == before["data2"]
    assert emulated.files(0, "data1") == other_host


async def test_a_running_erase_is_listed_on_the_drive_and_finished_without_its_monitor(
    emulated: Lab,
) -> None:
    pool = trusting(emulated)
    target, os_path = emulated.target(0), emulated.drive_path(0, "os")
    try:
        await pool.start_erase(target, os_path)
        fresh = BmcPool(BmcSettings(timeout=10.0, ca_bundle=emulated.ca_file))  # a restart
        try:
            assert not (await fresh.erase_status(target, os_path)).finished
            deadline = Deadline(ERASE_SECONDS + 10)
            while not await fresh.erase_finished(target, os_path):
                assert not deadline.expired()
                await asyncio.sleep(0.3)
        finally:
            await fresh.close()
    finally:
        await pool.close()
    assert emulated.files(0, "os") == []
    assert len(emulated.files(0, "data1")) == drives.SEED_FILES


def test_the_erase_survives_the_client_going_away_and_an_emulator_restart(emulated: Lab) -> None:
    spec = emulated.host(0)
    trust = ssl.create_default_context(cafile=emulated.ca_file)
    url = f"https://{LOOPBACK}:{emulated.port}{emulated.drive_path(0, 'data1')}"
    with httpx.Client(auth=(spec.username, spec.password), verify=trust, timeout=5) as client:
        answer = client.post(f"{url}/Actions/Drive.SecureErase", json={})
    assert answer.status_code == 202  # and the client is gone
    time.sleep(ERASE_SECONDS / 3)
    emulated.kill()  # mid-erase
    left = emulated.files(0, "data1")
    assert 0 < len(left) < drives.SEED_FILES, left
    emulated.start()
    deadline = Deadline(ERASE_SECONDS + 10)
    while emulated.files(0, "data1"):  # nobody asks: the restarted emulator carries it out
        assert not deadline.expired(), "the erase was not resumed"
        time.sleep(0.2)
    assert len(emulated.files(0, "os")) == drives.SEED_FILES


async def test_ipmi_cannot_list_or_erase_drives_and_nothing_is_sent() -> None:
    pool = BmcPool(SETTINGS)
    target = BmcTarget(parse(f"ipmi://127.0.0.1:{free_port()}"), Credentials("u", "p"))
    try:
        for call in (
            pool.drives(target),
            pool.start_erase(target, "/redfish/v1/Systems/1/Storage/1/Drives/0"),
            pool.erase_finished(target, "/redfish/v1/Systems/1/Storage/1/Drives/0"),
        ):
            with pytest.raises(Unsupported, match="IPMI cannot list or erase drives"):
                await call
    finally:
        await pool.close()


def test_the_lab_emulator_is_sushy_tools_with_drives() -> None:
    argv = emulator_argv(Path("conf"))
    assert argv[:3] == [sys.executable, "-m", "metalmend_lab.emulator"]
