"""The lab hosts' local drives: what each drive is, what is on it, and its erase.

Every lab host has an OS drive (``/dev/sda``, an SSD) and one or two data drives (HDDs),
each with its size, model, vendor, serial number, WWN and HCTL (``DriveSpec``, part of the
host's ``HostSpec``). A drive's content is a directory, ``.lab/drives/<host>/<drive>/``:
``lab up`` seeds a few files on each; the host's site etcd member keeps its data on the OS
drive (``os_drive_dir``), so wiping the OS drive really wipes the member's data, and a
data drive keeps its files until it is erased itself.

An erase (``EraseLedger``) is a file per task under ``.lab/drives/tasks/``: the Redfish
emulator (``lab.emulator``) starts it on ``#Drive.SecureErase`` and a thread of that
process carries it out, deleting the drive's files in step with the time passed, over
``erase_seconds``. Nothing ties the erase to the HTTP request that started it: the client
may go away, and a restarted emulator finishes what its ledger says is running.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from metalmend.api.storage import GIB, Drive, MediaType

OS_DRIVE = "os"
DEFAULT_ERASE_SECONDS = 5.0
SEED_FILES = 6
"""Files seeded on each drive: enough that an erase in progress has visibly removed some
and kept others."""


@dataclass
class DriveSpec:
    """One lab drive, as the host's inventory lists it."""

    id: str  # Redfish Drive Id under the host's one Storage ("os", "data1", ...)
    name: str  # the OS's device name
    capacity_bytes: int
    media_type: str  # Redfish MediaType: SSD or HDD
    protocol: str  # Redfish Protocol: SATA or SAS
    model: str
    vendor: str
    serial_number: str
    wwn: str  # 0x + 16 hex digits (NAA 5), as Linux writes it
    hctl: str

    def drive(self, redfish_path: str = "") -> Drive:
        """In the shared vocabulary (as inspection would report it)."""
        return Drive(
            id=redfish_path,
            name=self.name,
            capacity_bytes=self.capacity_bytes,
            rotational=self.media_type == "HDD",
            model=self.model,
            vendor=self.vendor,
            serial_number=self.serial_number,
            wwn=self.wwn,
            hctl=self.hctl,
            media_type=MediaType(self.media_type),
        )


def plan(host: str, index: int) -> list[DriveSpec]:
    """An OS drive and one data drive; every other host has a second data drive."""

    def wwn(drive: str) -> str:
        return "0x5" + uuid.uuid5(uuid.NAMESPACE_DNS, f"{drive}.{host}.metalmend.lab").hex[:15]

    tag = uuid.uuid5(uuid.NAMESPACE_DNS, f"{host}.metalmend.lab").hex[:8].upper()
    drives = [
        DriveSpec(
            OS_DRIVE, "/dev/sda", 240 * GIB, "SSD", "SATA", "Micron 5300 PRO", "ATA",
            f"OS{tag}", wwn(OS_DRIVE), "0:0:0:0",
        ),
        DriveSpec(
            "data1", "/dev/sdb", 4000 * GIB, "HDD", "SAS", "Exos X16", "SEAGATE",
            f"DA{tag}1", wwn("data1"), "1:0:0:0",
        ),
    ]  # fmt: skip
    if index % 2:
        second = DriveSpec(
            "data2", "/dev/sdc", 8000 * GIB, "HDD", "SAS", "Exos X18", "SEAGATE",
            f"DA{tag}2", wwn("data2"), "2:0:0:0",
        )  # fmt: skip
        drives.append(second)
    return drives


def drives_dir(lab_dir: Path) -> Path:
    return lab_dir / "drives"


def drive_dir(lab_dir: Path, host: str, drive_id: str) -> Path:
    return drives_dir(lab_dir) / host / drive_id


def os_drive_dir(lab_dir: Path, host: str) -> Path:
    return drive_dir(lab_dir, host, OS_DRIVE)


def seed(lab_dir: Path, host: str, drives: list[DriveSpec]) -> None:
    """A few files on each drive that has no directory yet (``lab up`` clears the drives
    first; within a running lab a drive's content is never reseeded, so a redeployed host
    keeps what its data drives hold)."""
    for spec in drives:
        directory = drive_dir(lab_dir, host, spec.id)
        if directory.exists():
            continue
        directory.mkdir(parents=True)
        for number in range(SEED_FILES):
            (directory / f"block-{number:02d}.dat").write_text(
                f"{host} {spec.id} ({spec.serial_number}) block {number}\n"
            )


def content(lab_dir: Path, host: str, drive_id: str) -> list[str]:
    """The files on a drive, relative to it (tests and ``lab status`` read this)."""
    directory = drive_dir(lab_dir, host, drive_id)
    return [str(p.relative_to(directory)) for p in _files(directory)]


@dataclass
class EraseTask:
    """One erase, as its ledger file holds it (wall-clock times: they survive a restart
    of the process carrying it out)."""

    id: str
    host: str
    system: str  # the Redfish system id (uuid)
    drive: str
    started: float
    seconds: float
    files_at_start: int = 0
    state: str = "Running"  # Redfish TaskState: Running, Completed, Exception
    message: str = ""

    def percent(self, now: float) -> int:
        if self.state != "Running":
            return 100
        if self.seconds <= 0:
            return 100
        return max(0, min(100, int((now - self.started) * 100 / self.seconds)))


class EraseLedger:
    """The lab's erases: started by the emulator's SecureErase, carried out by
    ``run_forever`` in a thread of the same process. Thread-safe."""

    def __init__(self, lab_dir: Path, erase_seconds: float) -> None:
        self.lab_dir = lab_dir
        self.erase_seconds = erase_seconds
        self._dir = drives_dir(lab_dir) / "tasks"
        self._lock = threading.Lock()

    def start(self, host: str, system: str, drive: str) -> EraseTask:
        """A new erase of the drive, or the one already running on it (never two)."""
        with self._lock:
            running = self._running(system, drive)
            if running is not None:
                return running
            files = len(_files(drive_dir(self.lab_dir, host, drive)))
            task = EraseTask(f"erase-{uuid.uuid4().hex[:12]}", host, system, drive,
                             time.time(), self.erase_seconds, files)  # fmt: skip
            self._write(task)
            return task

    def get(self, task_id: str) -> EraseTask | None:
        with self._lock:
            task = self._read(self._dir / f"{task_id}.json")
            if task is not None:
                self._advance(task)
            return task

    def running_on(self, system: str, drive: str) -> EraseTask | None:
        with self._lock:
            return self._running(system, drive)

    def step(self) -> None:
        """Carry every running erase forward to where the time passed puts it."""
        with self._lock:
            for task in self._all():
                if task.state == "Running":
                    self._advance(task)

    def run_forever(self, every: float = 0.1) -> None:
        while True:
            try:
                self.step()
            except OSError as error:  # a disk hiccup must not end every future erase
                print(f"lab erase: {error}", flush=True)
            time.sleep(every)

    # -- inside the lock ---------------------------------------------------------------

    def _advance(self, task: EraseTask) -> None:
        if task.state != "Running":
            return
        directory = drive_dir(self.lab_dir, task.host, task.drive)
        percent = task.percent(time.time())
        if percent >= 100:
            _empty(directory)
            task.state = "Completed"
            self._write(task)
            return
        # Delete in step with the time passed: at p % done, p % of the files the drive
        # held when the erase began are gone.
        files = _files(directory)
        should_remain = math.ceil(task.files_at_start * (100 - percent) / 100)
        for path in files[: max(0, len(files) - should_remain)]:
            path.unlink(missing_ok=True)

    def _running(self, system: str, drive: str) -> EraseTask | None:
        for task in self._all():
            if task.system == system and task.drive == drive:
                self._advance(task)
                if task.state == "Running":
                    return task
        return None

    def _all(self) -> list[EraseTask]:
        if not self._dir.is_dir():
            return []
        tasks = (self._read(p) for p in sorted(self._dir.glob("erase-*.json")))
        return [t for t in tasks if t is not None]

    def _read(self, path: Path) -> EraseTask | None:
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            return EraseTask(**data)
        except (OSError, ValueError, TypeError):
            return None

    def _write(self, task: EraseTask) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        path = self._dir / f"{task.id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(task)))
        tmp.replace(path)


def _files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.rglob("*") if p.is_file())


def _empty(directory: Path) -> None:
    """Everything on the drive gone; the (empty) drive itself stays."""
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        return
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                child.unlink()
