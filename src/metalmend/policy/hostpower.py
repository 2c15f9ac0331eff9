"""The host power controller's decisions: seed 000 (the reboot interface), sentence by
sentence, plus keeping power matching ``spec.online``.

``decide(host, now, settings)`` is pure: the host as observed (spec, annotations, status,
and the power state just read from its BMC) in, what to do out. Each rule below quotes the
sentence of the seed it implements.

Two things the seed leaves open, decided here:
- A host that is already off when a reboot annotation appears has satisfied the power-off
  part of the request; pendingRebootSince is recorded anyway, so that the rest of the flow
  (removing the suffixless form, powering on) proceeds instead of holding the host off
  forever with the seed's "PoweredOn is true" condition unmet.
- Power commands are recorded in ``status.lastPowerCommand`` and not re-sent for
  ``command_retry`` seconds: BMCs (sushy-tools' fake driver among them) restart a pending
  change when the command is repeated, and a restarted controller must know a soft
  power-off is already running to escalate it to hard after ``soft_timeout``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from metalmend.api import names
from metalmend.api.reboot import RebootRequest, reboot_requests
from metalmend.bmc.driver import PowerState

PowerCommand = Literal["on", "soft off", "hard off"]
MICROSECOND = dt.timedelta(microseconds=1)


@dataclass(frozen=True)
class PowerSettings:
    soft_timeout: float = 180.0  # soft power-off, then hard (upstream: Ironic's 180 s)
    poll_interval: float = 20.0  # re-read the BMC this often when nothing is happening
    transition_poll: float = 1.0  # ... at most this often while a commanded change lands
    first_poll: float = 0.1  # and this soon after a command: many BMCs obey at once
    command_retry: float = 30.0  # re-send a power command not obeyed after this long


@dataclass(frozen=True)
class LastCommand:
    action: PowerCommand
    at: dt.datetime


@dataclass(frozen=True)
class Host:
    """A BareMetalHost as the controller sees it in one reconcile."""

    online: bool
    provisioning_state: str
    externally_provisioned: bool
    annotations: Mapping[str, str]
    power: PowerState  # read from the BMC in this reconcile
    recorded_on: bool | None  # status.poweredOn (None: never recorded)
    last_powered_on: dt.datetime | None
    pending_reboot_since: dt.datetime | None
    last_command: LastCommand | None = None


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Decision:
    command: PowerCommand | None = None
    # status fields to write; a None value clears the field
    status: dict[str, Any] = field(default_factory=dict)
    remove_annotations: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    invalid: list[RebootRequest] = field(default_factory=list)  # malformed values
    ignored: str | None = None  # why reboot annotations are not honoured
    requeue_after: float = 0.0

    def note(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(Event("Warning" if warning else "Normal", reason, message))


def honours_reboots(host: Host) -> bool:
    """Seed 000: reboots are for provisioned hosts; upstream also honours externally
    provisioned ones."""
    return host.externally_provisioned or host.provisioning_state in (
        names.PROVISIONED,
        names.EXTERNALLY_PROVISIONED,
    )


def decide(host: Host, now: dt.datetime, settings: PowerSettings = PowerSettings()) -> Decision:
    decision = Decision(requeue_after=settings.poll_interval)
    on = host.power == PowerState.ON
    requests = reboot_requests(host.annotations)
    decision.invalid = [r for r in requests if r.problem]
    last = _record_power(host, on, now, decision)

    if host.provisioning_state in names.DEPROVISIONED_STATES:
        # "The controller automatically removes all annotations with the reboot.metal3.io
        # prefix if the Host is deprovisioned."
        if requests:
            decision.remove_annotations = [r.key for r in requests]
            removed = ", ".join(decision.remove_annotations)
            decision.note(names.REASON_REBOOT_CLEARED, f"host deprovisioned: removed {removed}")
        if host.pending_reboot_since is not None:
            decision.status["pendingRebootSince"] = None
        return _power_to(host.online, host, on, [], now, settings, decision)

    if not honours_reboots(host):
        if requests:
            decision.ignored = (
                f"reboot annotations are honoured only by provisioned hosts; this host is"
                f" {host.provisioning_state or 'not provisioned'}"
            )
        return _power_to(host.online, host, on, [], now, settings, decision)

    pending = _note_reboot_request(host, requests, on, last, now, decision)
    reboot_pending = pending is not None and (last is None or pending > last)

    # "Once the Host is powered off (Status.PoweredOn is false), if/when the Spec.Online
    # field is true, and the lastPoweredOn time is before the pendingRebootSince time, then
    # the controller should remove the suffixless reboot.metal3.io annotation."
    if not on and host.online and reboot_pending and names.REBOOT in host.annotations:
        decision.remove_annotations.append(names.REBOOT)
        requests = [r for r in requests if r.keyed]

    # "Whenever pendingRebootSince is later than the lastPoweredOn time, the Host
    # controller will attempt to power the host off regardless of the Spec.Online setting."
    # "Once no reboot annotations are present [...] the existing logic for powering on
    # the Host should execute." Keyed annotations hold it off until their owners remove
    # them, and so take precedence over the suffixless form.
    held_off = bool(requests) or (reboot_pending and on)
    return _power_to(host.online and not held_off, host, on, requests, now, settings, decision)


def _record_power(host: Host, on: bool, now: dt.datetime, decision: Decision) -> dt.datetime | None:
    """status.poweredOn follows the BMC; lastPoweredOn moves when power was restored (seen
    off, now on), or when we first see a host on."""
    last = host.last_powered_on
    if host.recorded_on != on:
        decision.status["poweredOn"] = on
    if on and (host.recorded_on is not True or last is None):
        last = now
        decision.status["lastPoweredOn"] = now
        if host.recorded_on is False:
            decision.note(names.REASON_POWERED_ON, "power restored")
        pending = host.pending_reboot_since
        previous = host.last_powered_on
        if pending is not None and (previous is None or pending > previous):
            when = f"requested at {_stamp(pending)}, powered on at {_stamp(now)}"
            decision.note(names.REASON_REBOOT_COMPLETED, f"rebooted: {when}")
    elif not on and host.recorded_on is True:
        decision.note(names.REASON_POWERED_OFF, "power is off")
    return last


def _note_reboot_request(
    host: Host,
    requests: list[RebootRequest],
    on: bool,
    last: dt.datetime | None,
    now: dt.datetime,
    decision: Decision,
) -> dt.datetime | None:
    """ "If there is one or more annotations with the reboot.metal3.io prefix present, and
    the Status.PoweredOn field is true, and the value of pendingRebootSince is empty or
    earlier than the lastPoweredOn time, then the Host controller will update
    pendingRebootSince to the current time." (Also when the host is off: see above.)"""
    pending = host.pending_reboot_since
    stale = pending is None or (last is not None and pending < last)
    if not requests or not stale:
        return pending
    # Strictly later than lastPoweredOn, even if both were taken in this same instant.
    pending = max(now, last + MICROSECOND) if last is not None else now
    decision.status["pendingRebootSince"] = pending
    mode = "hard" if any(r.mode == "hard" for r in requests) else "soft"
    how = "powering off" if on else "host is already off"
    keys = ", ".join(r.key for r in requests)
    decision.note(names.REASON_REBOOT_REQUESTED, f"{mode} reboot requested by {keys}; {how}")
    return pending


def _power_to(
    want_on: bool,
    host: Host,
    on: bool,
    requests: list[RebootRequest],
    now: dt.datetime,
    settings: PowerSettings,
    decision: Decision,
) -> Decision:
    """Send (or wait for) the power command that makes the host's power ``want_on``."""
    last = host.last_command
    if want_on == on:
        # Forget the last command once it is obeyed, or once it had time to land. A recent
        # command for the *other* state may still land (an "on" sent just before a reboot
        # key arrived): remediation reads it as "power-on in flight" and does not fence.
        obeyed = (last.action == "on") == on if last is not None else True
        stale = last is not None and (now - last.at).total_seconds() >= settings.command_retry
        if last is not None and (obeyed or stale):
            decision.status["lastPowerCommand"] = None
        elif last is not None:
            decision.requeue_after = min(decision.requeue_after, settings.transition_poll)
        return decision
    since = (now - last.at).total_seconds() if last is not None else None
    if want_on:
        command: PowerCommand = "on"
    elif any(r.mode == "hard" for r in requests):
        command = "hard off"  # "a hard shutdown request takes priority over a soft one"
    elif last is not None and last.action == "soft off" and since is not None:
        if since < settings.soft_timeout:  # running: look for it landing, escalate on time
            decision.requeue_after = min(
                settings.soft_timeout - since, _landing_poll(since, settings)
            )
            return decision
        command = "hard off"
        message = f"still on {since:.0f}s after a soft power-off; powering off hard"
        decision.note(names.REASON_SOFT_TIMEOUT, message, warning=True)
    else:
        command = "soft off"
    recent = last is not None and last.action == command
    if recent and since is not None and since < settings.command_retry:
        decision.requeue_after = _landing_poll(since, settings)  # sent; waiting for it to land
        return decision
    decision.command = command
    decision.status["lastPowerCommand"] = {"action": command, "at": now}
    reason = names.REASON_POWER_ON if want_on else names.REASON_POWER_OFF
    decision.note(reason, _why(command, host, requests))
    decision.requeue_after = settings.first_poll
    return decision


def _landing_poll(since: float, settings: PowerSettings) -> float:
    """Look soon after a command, then less often: a fast BMC is seen to obey within a
    tenth of a second, and a slow one is not polled hard."""
    return min(max(since / 2, settings.first_poll), settings.transition_poll)


def _why(command: PowerCommand, host: Host, requests: list[RebootRequest]) -> str:
    if command == "on":
        return "powering on: spec.online is true and no reboot annotation holds the host off"
    if requests or host.online:
        keys = ", ".join(r.key for r in requests) or "a pending reboot"
        return f"{command}: reboot requested by {keys}"
    return f"{command}: spec.online is false"


def _stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def stamp(moment: dt.datetime) -> str:
    """RFC 3339 with microseconds, UTC: how times are written to status."""
    return _stamp(moment.astimezone(dt.UTC))


def parse_stamp(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(dt.UTC)
