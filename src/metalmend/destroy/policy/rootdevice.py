"""Which drive is a host's OS drive, by its metal3 ``spec.rootDeviceHints`` (pure).

The meaning of each hint is upstream's, so that the drive chosen here is the drive metal3
installed the operating system on. The BareMetalHost's hints are turned into Ironic root
device hints by baremetal-operator (``pkg/provisioner/ironic/devicehints``,
https://github.com/metal3-io/baremetal-operator) and matched by Ironic's
``find_devices_by_hints`` (ironic-lib ``utils.py``, now ``ironic/common/utils.py``,
https://opendev.org/openstack/ironic-lib):

- ``deviceName``: the device name, exactly (``s==``); a name under ``/dev/disk/by-path/``
  is matched against the device's by-path name instead (``by_path``);
- ``hctl``, ``serialNumber``, ``wwn``, ``wwnWithExtension``, ``wwnVendorExtension``:
  exactly (``s==``), case-sensitive;
- ``model``, ``vendor``: the hint is a SUBSTRING of the drive's value (``<in>``),
  case-sensitive;
- ``minSizeGigabytes``: the drive's size in GiB (bytes / 2**30, despite the name) is at
  least the hint (``>=``); 0 means no hint (Go's omitempty);
- ``rotational``: equal to the drive's (spinning or not).

Every given hint must match; a drive that does not report a hinted field never matches.
Empty strings and a zero size are "not given", as baremetal-operator sends them.

Where metalmend is stricter than Ironic, on purpose (the caller ERASES what is chosen):

- several drives match: Ironic installs on the first it lists; the order of a listing is
  not something to erase by, so this is a reason, not a choice;
- no hints at all: ironic-python-agent installs on the smallest drive of at least 4 GiB
  (``guess_root_disk``, ties broken by name). That is a guess about the past, and a wrong
  guess erases a data drive under ``preserve-local-storage``: the reason says which drive
  Ironic would have picked, so the operator can confirm it with a hint;
- an unknown hint (a typo such as ``serial``) or a hint of the wrong type: a reason, not
  a hint silently dropped (dropping it could widen the match to a data drive).

``os_drive`` returns the one drive, or a reason (str) for the operator; the caller then
erases nothing under ``preserve-local-storage``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from metalmend.api.storage import GIB, Drive

BY_PATH_PREFIX: Final = "/dev/disk/by-path/"
IRONIC_MIN_ROOT_BYTES: Final = 4 * GIB
"""ironic-python-agent's smallest root disk when no hints are given."""
DRIVES_NAMED: Final = 4
"""Drives named in a reason; more are counted."""
MAX_HINT_CHARS: Final = 256
"""Longest hint kept: device names, serials and WWNs are far shorter; a longer one is
hostile or broken, and would only bloat the messages that quote it."""

_TEXT_HINTS: Final[dict[str, str]] = {
    "deviceName": "device_name",
    "hctl": "hctl",
    "model": "model",
    "vendor": "vendor",
    "serialNumber": "serial_number",
    "wwn": "wwn",
    "wwnWithExtension": "wwn_with_extension",
    "wwnVendorExtension": "wwn_vendor_extension",
}
KNOWN_HINTS: Final = (*_TEXT_HINTS, "minSizeGigabytes", "rotational")
_EXACT_ATTRS: Final = ("hctl", "serial_number", "wwn", "wwn_with_extension", "wwn_vendor_extension")


@dataclass(frozen=True)
class RootDeviceHints:
    """metal3's ``spec.rootDeviceHints`` as read. ``problems`` lists what could not be
    read; hints with problems choose no drive."""

    device_name: str = ""
    hctl: str = ""
    model: str = ""
    vendor: str = ""
    serial_number: str = ""
    min_size_gigabytes: int = 0
    wwn: str = ""
    wwn_with_extension: str = ""
    wwn_vendor_extension: str = ""
    rotational: bool | None = None
    problems: tuple[str, ...] = ()

    @classmethod
    def from_wire(cls, wire: object) -> RootDeviceHints:
        """The hints from the BareMetalHost's ``spec.rootDeviceHints`` (absent: no hints).
        Never raises: whatever is wrong is in ``problems``."""
        if wire is None:
            return cls()
        if not isinstance(wire, dict):
            return cls(problems=(f"rootDeviceHints is {_kind(wire)}, not an object",))
        problems: list[str] = []
        values: dict[str, Any] = {}
        for key, value in wire.items():
            if key in _TEXT_HINTS:
                text = _text_hint(key, value, problems)
                if text:
                    values[_TEXT_HINTS[key]] = text
            elif key == "minSizeGigabytes":
                values["min_size_gigabytes"] = _size_hint(value, problems)
            elif key == "rotational":
                if value is not None and not isinstance(value, bool):
                    problems.append(f"rotational is {_kind(value)}, not true or false")
                else:
                    values["rotational"] = value
            else:
                shown = str(key)[:64]
                problems.append(f"{shown!r} is not a root device hint ({', '.join(KNOWN_HINTS)})")
        return cls(**values, problems=tuple(problems))

    @property
    def given(self) -> dict[str, object]:
        """The hints given, by their metal3 names (for messages)."""
        named: dict[str, object] = {
            wire: getattr(self, attr) for wire, attr in _TEXT_HINTS.items() if getattr(self, attr)
        }
        if self.min_size_gigabytes:
            named["minSizeGigabytes"] = self.min_size_gigabytes
        if self.rotational is not None:  # False is a hint: not spinning
            named["rotational"] = self.rotational
        return named

    def matches(self, drive: Drive) -> bool:
        """Every given hint matches ``drive`` (upstream's meaning of each, above)."""
        return not self.problems and all(check(drive) for check in self._checks())

    def _checks(self) -> Iterable[Callable[[Drive], bool]]:
        if self.device_name:
            yield self._device_name_matches
        for attr in _EXACT_ATTRS:
            if getattr(self, attr):
                yield partial(_exact_attr, attr, getattr(self, attr))
        if self.model:
            yield lambda d: _contains(d.model, self.model)
        if self.vendor:
            yield lambda d: _contains(d.vendor, self.vendor)
        if self.min_size_gigabytes:
            yield lambda d: d.capacity_bytes / GIB >= self.min_size_gigabytes
        if self.rotational is not None:
            yield lambda d: d.rotational is not None and d.rotational == self.rotational

    def _device_name_matches(self, drive: Drive) -> bool:
        if self.device_name.startswith(BY_PATH_PREFIX):
            return any(_exact(n, self.device_name) for n in drive.alternate_names)
        return _exact(drive.name, self.device_name)


def os_drive(hints: RootDeviceHints, drives: Sequence[Drive]) -> Drive | str:
    """The one drive the hints choose among ``drives``, or why there is none to trust."""
    if hints.problems:
        return "spec.rootDeviceHints cannot be used: " + "; ".join(hints.problems)
    if not drives:
        return "the host reports no drives"
    if not hints.given:
        return _no_hints(drives)
    chosen = [d for d in drives if hints.matches(d)]
    if len(chosen) == 1:
        return chosen[0]
    given = _show_hints(hints)
    if not chosen:
        return f"no drive matches spec.rootDeviceHints ({given}); drives: {_names(drives)}" + (
            _names_unknown(hints, drives)
        )
    return (
        f"{len(chosen)} drives match spec.rootDeviceHints ({given}): {_names(chosen)};"
        " the OS drive is not known for sure (add a hint that only it matches, such as"
        " serialNumber)"
    )


def ironic_default(drives: Sequence[Drive]) -> Drive | None:
    """The drive ironic-python-agent installs on without hints (``guess_root_disk``): the
    smallest of at least 4 GiB, ties broken by name; None if none is that large."""
    large = [d for d in drives if d.capacity_bytes >= IRONIC_MIN_ROOT_BYTES]
    return min(large, key=lambda d: (d.capacity_bytes, d.name), default=None)


def _no_hints(drives: Sequence[Drive]) -> str:
    guess = ironic_default(drives)
    guessed = (
        f"; Ironic would have installed on the smallest drive of at least 4 GiB, {guess.label}"
        if guess is not None
        else ""
    )
    return (
        "the host has no spec.rootDeviceHints, so its OS drive is not known for sure"
        f"{guessed}; set a hint (deviceName, serialNumber or wwn) naming the OS drive"
    )


def _names_unknown(hints: RootDeviceHints, drives: Sequence[Drive]) -> str:
    """Why a deviceName or hctl hint cannot match: the BMC does not know OS names."""
    if (hints.device_name or hints.hctl) and not any(d.name or d.hctl for d in drives):
        return (
            " (deviceName and hctl are known only from the host's inspection inventory,"
            " status.hardware.storage, which names none of these drives)"
        )
    return ""


def _text_hint(key: str, value: object, problems: list[str]) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        problems.append(f"{key} is {_kind(value)}, not a string")
        return ""
    if len(value) > MAX_HINT_CHARS:
        problems.append(f"{key} is longer than {MAX_HINT_CHARS} characters")
        return ""
    if not value.isprintable():
        problems.append(f"{key} contains control characters")
        return ""
    return value.strip()


def _size_hint(value: object, problems: list[str]) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"minSizeGigabytes is {_kind(value)}, not a whole number")
        return 0
    if value < 0:
        problems.append(f"minSizeGigabytes is {value}, below 0")
        return 0
    return value


def _exact_attr(attr: str, hint: str, drive: Drive) -> bool:
    return _exact(getattr(drive, attr), hint)


def _exact(value: str, hint: str) -> bool:
    return bool(value.strip()) and value.strip() == hint


def _contains(value: str, hint: str) -> bool:
    return bool(value.strip()) and hint in value.strip()


def _kind(value: object) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names |= {list: "a list", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _show_hints(hints: RootDeviceHints) -> str:
    shown = []
    for key, value in hints.given.items():
        text = str(value).lower() if isinstance(value, bool) else repr(value)
        shown.append(f"{key}={text}")
    return ", ".join(shown)


def _names(drives: Sequence[Drive]) -> str:
    shown = ", ".join(_described(d) for d in drives[:DRIVES_NAMED])
    more = len(drives) - DRIVES_NAMED
    return shown + (f" and {more} more" if more > 0 else "")


def _described(drive: Drive) -> str:
    size = f"{drive.capacity_bytes / GIB:.0f} GiB" if drive.capacity_bytes else "size unknown"
    return f"{drive.label} ({size})"
