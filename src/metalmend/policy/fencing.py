"""When may remediation trust that a host is off? (docs/design.md safety invariant 1.)

A Node may be deleted, so that at-most-one workloads start elsewhere, only once the host was
reported off *for the reboot request of this remediation*. ``status.poweredOn: false`` alone
is not enough: it can be an old value, read before our request existed (the host may have
been powered on from outside since), or read while a power-on sent earlier was still on its
way to the BMC; a Node deleted on the strength of it would leave a running kernel with its
workloads while copies start elsewhere: a split brain.

So "reported off" is read from the host status that the host power controller writes, in
the same object version that carries our reboot annotation:

- our reboot key is listed in ``status.poweredOffFor``: the host power controller read the
  BMC off *while this very key was on the host*, with no power-on of its own that could
  still land (it cancels one with a power-off first), and has not read it on since. Each
  key is acknowledged for itself: an off report written for an earlier request (withdrawn,
  or another remediation's) never counts for a later one;
- ``poweredOn`` is false (the same reading);
- ``lastPowerCommand`` is not "on": the controller is not in the middle of powering it on.

A key removed and added again is a new request, but the host power controller may not have
seen the removal: its acknowledgement would then look current. So a remediation never
(re-)adds its key while the key is still listed without being on the host
(``withdrawal_unseen``): the host power controller drops it at its next reconcile.

Only a power-on from outside the system (a button, another tool at the BMC) after that
reading can defeat this, and nothing that reads the BMC through the host controller can see
that any sooner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from metalmend.api import names

POWERED_OFF_FOR = "poweredOffFor"
"""BareMetalHost ``status`` field: the reboot keys the host was read off for (policy.hostpower)."""


@dataclass(frozen=True)
class HostPower:
    """The power facts of a BareMetalHost's status as they concern one reboot key."""

    holds_key: bool  # the remediation's reboot key is on the host, in this same version
    powered_on: bool | None  # status.poweredOn (None: never reported)
    acknowledged: bool  # the key is listed in status.poweredOffFor
    power_on_in_flight: bool  # status.lastPowerCommand.action == "on"


def host_power(status: Mapping[str, Any], annotations: Mapping[str, str], key: str) -> HostPower:
    """``HostPower`` for reboot key ``key`` from a BareMetalHost's status and annotations."""
    acknowledged = status.get(POWERED_OFF_FOR) or []
    command = status.get("lastPowerCommand") or {}
    return HostPower(
        holds_key=key in annotations,
        powered_on=status.get("poweredOn"),
        acknowledged=isinstance(acknowledged, list) and key in acknowledged,
        power_on_in_flight=isinstance(command, dict) and command.get("action") == "on",
    )


def reported_off(host: HostPower) -> bool:
    """The host was reported off for the reboot request that our key is."""
    return (
        host.holds_key
        and host.acknowledged
        and host.powered_on is False
        and not host.power_on_in_flight
    )


def withdrawal_unseen(host: HostPower) -> bool:
    """Our key is gone but still acknowledged: the host power controller has not yet seen
    it removed. Adding it again now would make that old acknowledgement count for the new
    request, so the key is added only once the acknowledgement is gone."""
    return host.acknowledged and not host.holds_key


def is_remediation_key(key: str) -> bool:
    """A reboot annotation that belongs to some remediation (either flow)."""
    return key == names.MACHINE_REMEDIATION_REBOOT or key.startswith(
        names.METAL3_REMEDIATION_REBOOT_PREFIX
    )


def other_remediation(annotations: Mapping[str, str], own_key: str) -> str | None:
    """The reboot key of another remediation acting on this host, if any: at most one
    remediation acts on a host at a time."""
    others = sorted(k for k in annotations if is_remediation_key(k) and k != own_key)
    return others[0] if others else None
