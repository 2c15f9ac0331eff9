"""Reading a host-power Decision the way the rule tables state their expectations: the
status fields a decision changes (by their wire names, values as Python values; None
clears), the annotations it removes and the command it sends."""

from __future__ import annotations

import dataclasses
from typing import Any

from metalmend.policy.fencing import POWERED_OFF_FOR
from metalmend.policy.hostpower import (
    Decision,
    Host,
    PowerCommand,
    PowerStatus,
    RemoveAnnotations,
    SendPower,
    SetStatus,
)

WIRE = {
    "powered_on": "poweredOn",
    "last_powered_on": "lastPoweredOn",
    "pending_reboot_since": "pendingRebootSince",
    "last_command": "lastPowerCommand",
    "powered_off_for": POWERED_OFF_FOR,
}
STATUS_FIELDS = {"recorded_on": "powered_on", **{k: k for k in WIRE if k != "powered_on"}}


def host(base: Host, **changes: Any) -> Host:
    """``base`` with changes; status fields by their view names (recorded_on: poweredOn)."""
    status = {STATUS_FIELDS[k]: changes.pop(k) for k in list(changes) if k in STATUS_FIELDS}
    if "powered_off_for" in status:
        status["powered_off_for"] = tuple(status["powered_off_for"])
    new_status = dataclasses.replace(base.status, **status)
    return dataclasses.replace(base, status=new_status, **changes)


def status_changes(view: Host, decision: Decision) -> dict[str, Any]:
    """The power facts the decision's first status write changes (errors aside)."""
    written = decision.of(SetStatus)
    status: PowerStatus = written[0].status if written else view.status
    result: dict[str, Any] = {}
    for name, value in status.changes(view.status).items():
        if name not in WIRE:
            continue
        if name == "last_command":
            value = {"action": value.action, "at": value.at} if value else None
        elif name == "powered_off_for":
            value = list(value) or None
        result[WIRE[name]] = value
    return result


def command(decision: Decision) -> PowerCommand | None:
    sent = decision.of(SendPower)
    return sent[0].command.action if sent else None


def removed(decision: Decision) -> list[str]:
    return [key for action in decision.of(RemoveAnnotations) for key in action.keys]
