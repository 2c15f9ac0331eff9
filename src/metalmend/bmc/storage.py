"""A host's drives through its BMC: list them, erase one, learn when the erase is over.

The interface (``StorageDriver``) and what Redfish's answers mean for it; the HTTP side is
in ``redfish.py`` (its checks on every answer and link apply here too). Redfish, from the
DMTF schemas ``ComputerSystem``, ``StorageCollection``, ``Storage``, ``Drive`` and ``Task``
(https://www.dmtf.org/standards/redfish):

- ``Systems/{id}`` links ``Storage`` (a collection); each ``Storage`` lists ``Drives``
  (links); a ``Drive`` has ``CapacityBytes``, ``MediaType`` (HDD, SSD, SMR), ``Protocol``,
  ``Model``, ``Manufacturer``, ``SerialNumber``, ``Identifiers`` (``DurableName`` with its
  ``DurableNameFormat``, NAA for a WWN) and the action ``#Drive.SecureErase``;
- the erase is a POST to the action's ``target``; a long one answers 202 with a task
  monitor in ``Location``, which answers 202 while the task runs and the Task (or the
  action's result) once it is over; a Drive busy with an erase lists it in
  ``Operations`` (``OperationName``, ``PercentageComplete``).

Only links under the system's own path are followed for drives and their erase action:
a BMC answer naming another system's drive, or an action target elsewhere, is refused,
so a hostile or confused BMC cannot make metalmend erase what the host does not own.
IPMI has no drives at all: its driver does not implement this interface, and the pool
answers ``Unsupported``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

from metalmend.api.storage import Drive, MediaType, media_type
from metalmend.bmc.errors import BmcError

SECURE_ERASE_ACTION: Final = "#Drive.SecureErase"
MAX_STORAGE: Final = 16
"""Storage subsystems read per system; servers have one to four."""
MAX_DRIVES: Final = 64
"""Drives read per system (a 2U server has at most a few dozen bays); a BMC listing more
is refused rather than read for minutes inside one call's deadline."""
MAX_FIELD_CHARS: Final = 256
"""Longest text kept from a drive's field (models and serials are tens of characters)."""

RUNNING_TASK_STATES: Final = frozenset(
    {"New", "Starting", "Running", "Pending", "Suspended", "Stopping", "Cancelling",
     "Interrupted", "Service"}
)  # fmt: skip
FAILED_TASK_STATES: Final = frozenset({"Exception", "Killed", "Cancelled"})
BUSY_DRIVE_STATES: Final = frozenset({"Updating", "Starting", "InTest"})


class EraseFailed(BmcError):
    """The BMC ran the erase and says it failed (or was cancelled): the drive is not wiped."""


@dataclass(frozen=True)
class EraseStatus:
    """Where an erase is. ``percent`` is what the BMC reports (None when it does not)."""

    finished: bool
    percent: int | None = None


@runtime_checkable
class StorageDriver(Protocol):
    async def drives(self) -> list[Drive]:
        """Every drive of the one system the host names (``Drive.id``: where it is served)."""
        ...

    async def start_erase(self, drive_id: str) -> str | None:
        """Start erasing the drive ``drive_id`` (an id from ``drives``); the task monitor
        to follow it with, when the BMC gives one."""
        ...

    async def erase_status(self, drive_id: str, monitor: str | None) -> EraseStatus:
        """Where the erase of ``drive_id`` is; ``EraseFailed`` when it failed."""
        ...


def drive_from_redfish(path: str, resource: Mapping[str, Any]) -> Drive:
    """A Redfish Drive resource (served at ``path``) in our vocabulary. A field of the
    wrong type is absent; texts are cut to ``MAX_FIELD_CHARS``."""
    kind = media_type(_text(resource, "MediaType"))
    if kind == MediaType.SSD and _text(resource, "Protocol").lower() == "nvme":
        kind = MediaType.NVME  # metal3 calls an NVMe SSD an NVME disk
    rotational = {MediaType.HDD: True, MediaType.SMR: True, MediaType.SSD: False}
    size = resource.get("CapacityBytes")
    wwn, with_extension, vendor_extension = _wwn(resource.get("Identifiers"))
    return Drive(
        id=path,
        capacity_bytes=size if isinstance(size, int) and not isinstance(size, bool) else 0,
        rotational=rotational.get(kind, False if kind == MediaType.NVME else None),
        model=_text(resource, "Model"),
        vendor=_text(resource, "Manufacturer"),
        serial_number=_text(resource, "SerialNumber"),
        wwn=wwn,
        wwn_with_extension=with_extension,
        wwn_vendor_extension=vendor_extension,
        media_type=kind,
    )


def erase_in_drive(resource: Mapping[str, Any]) -> EraseStatus:
    """What a Drive resource says of an erase: busy while it lists an operation (or its
    state says it is busy), finished otherwise."""
    operations = resource.get("Operations")
    listed = [o for o in operations if isinstance(o, dict)] if isinstance(operations, list) else []
    status = resource.get("Status")
    state = status.get("State") if isinstance(status, dict) else None
    if not listed and state not in BUSY_DRIVE_STATES:
        return EraseStatus(finished=True, percent=100)
    percents = [_percent(o.get("PercentageComplete")) for o in listed]
    known = [p for p in percents if p is not None]
    return EraseStatus(finished=False, percent=min(known) if known else None)


def task_state(document: Mapping[str, Any]) -> tuple[str | None, int | None, str]:
    """A Task resource's ``TaskState``, ``PercentComplete`` and messages (None: not a Task)."""
    state = document.get("TaskState")
    messages = document.get("Messages")
    said = "; ".join(
        m["Message"]
        for m in (messages if isinstance(messages, list) else [])
        if isinstance(m, dict) and isinstance(m.get("Message"), str)
    )
    return (
        state if isinstance(state, str) else None,
        _percent(document.get("PercentComplete")),
        said,
    )


def _text(resource: Mapping[str, Any], key: str) -> str:
    value = resource.get(key)
    if not isinstance(value, str):
        return ""
    return "".join(c for c in value if c.isprintable())[:MAX_FIELD_CHARS].strip()


def _percent(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 100:
        return value
    return None


def _wwn(identifiers: object) -> tuple[str, str, str]:
    """WWN, WWN with vendor extension and the extension, as Linux (and so metal3's
    inventory) writes them (``0x`` and lower-case hex), from an NAA durable name: 16 hex
    digits are a WWN; 32 (NAA 6, registered extended) are a WWN and its extension."""
    for identifier in identifiers if isinstance(identifiers, list) else []:
        if not isinstance(identifier, dict) or identifier.get("DurableNameFormat") != "NAA":
            continue
        name = identifier.get("DurableName")
        if not isinstance(name, str):
            continue
        digits = name.lower().removeprefix("0x").replace(":", "")
        if len(digits) == 16 and _hex(digits):
            return f"0x{digits}", "", ""
        if len(digits) == 32 and _hex(digits):
            return f"0x{digits[:16]}", f"0x{digits}", f"0x{digits[16:]}"
    return "", "", ""


def _hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
