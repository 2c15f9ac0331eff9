"""When may remediation trust that a host is off? (DESIGN.md invariant 1.)

A Node may be deleted, so that at-most-one workloads start elsewhere, only once the host was
reported off *for the reboot request of this remediation*. ``status.poweredOn: false`` alone
is not enough: it can be an old value, written before the host was powered on again by its
controller (the report of that power-on may still be on its way), and a Node deleted on the
strength of it would leave a running kernel with its workloads while copies start
elsewhere: a split brain.

So "reported off" is read from the host status that the host power controller writes
(seed 000 fields), in the same object version that carries our reboot annotation:

- ``poweredOn`` is false: the BMC said off at the controller's last read;
- ``pendingRebootSince`` is later than ``lastPoweredOn``: the controller has registered a
  reboot request and not yet seen power restored since, so it holds the host off (it reads
  the BMC after every annotation change and would have recorded ``poweredOn: true``);
- ``lastPowerCommand`` is not "on": the controller is not in the middle of powering it on.

Only a power-on from outside the system (a button, another tool at the BMC) can defeat
this, and nothing that reads the BMC through the host controller can see that any sooner.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from metalmend.api import names


@dataclass(frozen=True)
class HostPower:
    """The power facts of a BareMetalHost's status, and whether a given key is present."""

    holds_key: bool  # the remediation's reboot key is on the host, in this same version
    powered_on: bool | None  # status.poweredOn (None: never reported)
    pending_reboot_since: dt.datetime | None
    last_powered_on: dt.datetime | None
    power_on_in_flight: bool  # status.lastPowerCommand.action == "on"


def reported_off(host: HostPower) -> bool:
    """The host was reported off for the pending reboot request that our key is part of."""
    if not host.holds_key or host.powered_on is not False or host.power_on_in_flight:
        return False
    pending, last = host.pending_reboot_since, host.last_powered_on
    return pending is not None and (last is None or pending > last)


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
