"""The lab's drives without a server: every host has an OS drive and one or two data
drives with distinct identities; seeding never overwrites a drive's content; the erase
ledger removes files in step with time, never starts two erases of one drive, and resumes
from its files; the site etcd member's data lives on its host's OS drive."""

from __future__ import annotations

import inspect
import time
from pathlib import Path

from metalmend_lab import drives, siteetcd
from metalmend_lab.inventory import HardwareConfig, HostSpec


def test_every_host_has_an_os_drive_and_one_or_two_data_drives() -> None:
    plans = [drives.plan(f"worker-{i}", i) for i in range(4)]
    assert [len(p) for p in plans] == [2, 3, 2, 3]
    assert all(p[0].id == drives.OS_DRIVE and p[0].name == "/dev/sda" for p in plans)
    serials = [d.serial_number for p in plans for d in p]
    wwns = [d.wwn for p in plans for d in p]
    assert len(set(serials)) == len(serials)
    assert len(set(wwns)) == len(wwns)
    assert all(len(w) == 18 and w.startswith("0x5") for w in wwns)


def test_seeding_keeps_what_a_drive_already_holds(tmp_path: Path) -> None:
    plan = drives.plan("h", 1)
    drives.seed(tmp_path, "h", plan)
    kept = drives.drive_dir(tmp_path, "h", "data1") / "mine.txt"
    kept.write_text("operator data")
    drives.seed(tmp_path, "h", plan)
    assert kept.read_text() == "operator data"
    assert len(drives.content(tmp_path, "h", "data1")) == drives.SEED_FILES + 1


def test_the_erase_ledger_erases_in_step_once_and_resumes_from_its_files(tmp_path: Path) -> None:
    drives.seed(tmp_path, "h", drives.plan("h", 0))
    ledger = drives.EraseLedger(tmp_path, erase_seconds=1.0)
    task = ledger.start("h", "sys", "data1")
    assert ledger.start("h", "sys", "data1").id == task.id  # never two at once
    time.sleep(0.5)
    ledger.step()
    left = len(drives.content(tmp_path, "h", "data1"))
    assert 0 < left < drives.SEED_FILES
    again = drives.EraseLedger(tmp_path, erase_seconds=1.0)  # a restarted process
    time.sleep(0.6)
    again.step()
    finished = again.get(task.id)
    assert finished is not None
    assert finished.state == "Completed"
    assert drives.content(tmp_path, "h", "data1") == []
    assert len(drives.content(tmp_path, "h", "os")) == drives.SEED_FILES
    assert again.running_on("sys", "data1") is None


def test_lab_up_offers_the_labs_own_default_erase_time() -> None:
    from metalmend_lab import cli

    default = inspect.signature(cli.lab_up).parameters["erase_seconds"].default
    assert default == drives.DEFAULT_ERASE_SECONDS


def test_hardware_config_round_trips_the_drives(tmp_path: Path) -> None:
    spec = HostSpec("h", "ns", "redfish", 1, 2, "u", "p", "", "", drives=drives.plan("h", 1))
    HardwareConfig(str(tmp_path), [spec], "", erase_seconds=2.5).write(tmp_path / "c.json")
    read = HardwareConfig.read(tmp_path / "c.json")
    assert read.hosts[0].drives == spec.drives
    assert read.erase_seconds == 2.5


def test_the_site_etcd_member_keeps_its_data_on_its_hosts_os_drive(tmp_path: Path) -> None:
    hosts = [
        HostSpec(f"w{i}", "ns", "redfish", 1, 2, "u", "p", "", "", drives=drives.plan(f"w{i}", i))
        for i in range(3)
    ]
    site = siteetcd.plan(tmp_path, hosts, Path("/bin/etcd"))
    assert site is not None
    for member in site.members:
        assert Path(member.data_dir) == drives.os_drive_dir(tmp_path, member.host) / "etcd"
        assert member.log_path.parent == tmp_path / "hardware" / "etcd"  # not on the drive
