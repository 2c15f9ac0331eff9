"""The drive vocabulary shared by the BMC drivers, the policies and the lab: what one local
drive of a host is, in the terms metal3's ``spec.rootDeviceHints`` match against.

Two sources describe a host's drives, and neither knows everything:

- the BMC (Redfish ``Systems/{id}/Storage/{id}/Drives/{id}``) knows the drive's identity
  (serial number, WWN in ``Identifiers``), size, media type, model and vendor, and is
  where an erase is started; it does not know the operating system's device name
  (``/dev/sda``) nor the SCSI address (HCTL), which only exist inside the running host;
- metal3's inspection inventory (``status.hardware.storage`` of the BareMetalHost, from
  ironic-python-agent running on the host) knows those names but cannot erase anything.

``with_inventory`` joins the two on the drive's serial number (else its WWN): a hint on a
device name can then pick a drive the BMC can erase. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

GIB = 1 << 30


class MediaType(StrEnum):
    """Redfish ``Drive.MediaType`` (HDD, SSD, SMR) and metal3's disk ``type`` (HDD, SSD,
    NVME) in one vocabulary; UNKNOWN when neither says."""

    HDD = "HDD"
    SSD = "SSD"
    NVME = "NVME"
    SMR = "SMR"
    UNKNOWN = ""


@dataclass(frozen=True)
class Drive:
    """One local drive. Text fields are "" when the source does not say (never None):
    a hint on a field the drive does not report never matches it, as in Ironic."""

    id: str
    """Where the BMC serves the drive (its Redfish ``@odata.id``); "" for a drive known
    only from the inspection inventory. ``BmcPool.start_erase`` takes this."""
    name: str = ""
    """The operating system's device name, as metal3's ``deviceName`` hint means it
    (``/dev/sda``); from the inspection inventory."""
    capacity_bytes: int = 0
    rotational: bool | None = None
    """True for spinning media; None when unknown (a ``rotational`` hint never matches)."""
    model: str = ""
    vendor: str = ""
    serial_number: str = ""
    wwn: str = ""
    wwn_with_extension: str = ""
    wwn_vendor_extension: str = ""
    hctl: str = ""
    """SCSI address ``host:channel:target:lun``; from the inspection inventory."""
    media_type: MediaType = MediaType.UNKNOWN
    alternate_names: tuple[str, ...] = ()
    """Other names of the device (``/dev/disk/by-path/...``); from the inspection inventory."""

    @property
    def label(self) -> str:
        """How a message names the drive to an operator: what identifies it best."""
        parts = [p for p in (self.name, self.serial_number and f"serial {self.serial_number}") if p]
        return " ".join(parts) or self.id or "an unnamed drive"

    @classmethod
    def from_metal3(cls, entry: Mapping[str, Any]) -> Drive:
        """One entry of a BareMetalHost's ``status.hardware.storage`` (metal3's Storage
        type). Fields of the wrong type are treated as absent: the inventory is written
        by whoever may write the host's status, and is checked like any other input."""

        def text(key: str) -> str:
            value = entry.get(key)
            return value if isinstance(value, str) else ""

        size = entry.get("sizeBytes")
        rotational = entry.get("rotational", False)  # metal3 omits false (omitempty)
        others = entry.get("alternateNames")
        return cls(
            id="",
            name=text("name"),
            capacity_bytes=size if isinstance(size, int) and not isinstance(size, bool) else 0,
            rotational=rotational if isinstance(rotational, bool) else None,
            model=text("model"),
            vendor=text("vendor"),
            serial_number=text("serialNumber"),
            wwn=text("wwn"),
            wwn_with_extension=text("wwnWithExtension"),
            wwn_vendor_extension=text("wwnVendorExtension"),
            hctl=text("hctl"),
            media_type=media_type(text("type")),
            alternate_names=tuple(
                n for n in (others if isinstance(others, list) else []) if isinstance(n, str)
            ),
        )

    def to_metal3(self) -> dict[str, Any]:
        """This drive as an entry of ``status.hardware.storage`` (what the lab writes)."""
        entry: dict[str, Any] = {
            "name": self.name,
            "sizeBytes": self.capacity_bytes,
            "serialNumber": self.serial_number,
        }
        optional = {
            "rotational": self.rotational,
            "type": self.media_type.value if self.media_type != MediaType.SMR else "HDD",
            "model": self.model,
            "vendor": self.vendor,
            "wwn": self.wwn,
            "wwnWithExtension": self.wwn_with_extension,
            "wwnVendorExtension": self.wwn_vendor_extension,
            "hctl": self.hctl,
            "alternateNames": list(self.alternate_names),
        }
        entry.update({k: v for k, v in optional.items() if v})
        return entry


def media_type(text: str) -> MediaType:
    """A Redfish ``MediaType`` or a metal3 disk ``type``; UNKNOWN for anything else."""
    try:
        return MediaType(text.upper()) if text else MediaType.UNKNOWN
    except ValueError:
        return MediaType.UNKNOWN


def inventory_from_metal3(storage: object) -> list[Drive]:
    """``status.hardware.storage`` as drives; anything but a list of objects is empty."""
    if not isinstance(storage, list):
        return []
    return [Drive.from_metal3(e) for e in storage if isinstance(e, Mapping)]


def with_inventory(bmc_drives: Iterable[Drive], inventory: Iterable[Drive]) -> list[Drive]:
    """The BMC's drives, each completed with what the inspection inventory knows of the
    same drive (device name, HCTL, and any field the BMC left empty). The same drive is
    the one with the same serial number, else the same WWN; a serial number or WWN that
    several inventory entries share identifies nothing and is not used."""
    known = list(inventory)
    by_serial = _unique(known, lambda d: d.serial_number)
    by_wwn = _unique(known, lambda d: d.wwn)
    completed = []
    for drive in bmc_drives:
        seen = by_serial.get(drive.serial_number) or by_wwn.get(drive.wwn)
        completed.append(drive if seen is None else _fill(drive, seen))
    return completed


def _unique(drives: list[Drive], key: Any) -> dict[str, Drive]:
    counts: dict[str, int] = {}
    for drive in drives:
        counts[key(drive)] = counts.get(key(drive), 0) + 1
    return {key(d): d for d in drives if key(d) and counts[key(d)] == 1}


def _fill(drive: Drive, seen: Drive) -> Drive:
    return replace(
        drive,
        name=drive.name or seen.name,
        hctl=drive.hctl or seen.hctl,
        capacity_bytes=drive.capacity_bytes or seen.capacity_bytes,
        rotational=drive.rotational if drive.rotational is not None else seen.rotational,
        model=drive.model or seen.model,
        vendor=drive.vendor or seen.vendor,
        wwn=drive.wwn or seen.wwn,
        wwn_with_extension=drive.wwn_with_extension or seen.wwn_with_extension,
        wwn_vendor_extension=drive.wwn_vendor_extension or seen.wwn_vendor_extension,
        media_type=drive.media_type or seen.media_type,
        alternate_names=drive.alternate_names or seen.alternate_names,
    )
