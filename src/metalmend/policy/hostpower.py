"""The host power controller's decisions: metal3's reboot interface design, sentence by
sentence, plus keeping power matching ``spec.online``.

``decide(host, now, settings)`` is pure: the host as observed (spec, annotations, status,
and the power state just read from its BMC) in, what to do out. Each rule below quotes the
sentence of the design it implements.

Two things the design leaves open, decided here:
- A host that is already off when a reboot annotation appears has satisfied the power-off
  part of the request; pendingRebootSince is recorded anyway, so that the rest of the flow
  (removing the suffixless form, powering on) proceeds instead of holding the host off
  forever with the design's "PoweredOn is true" condition unmet.
- Power commands are recorded in ``status.lastPowerCommand`` and not re-sent for
  ``command_retry`` seconds: BMCs (sushy-tools' fake driver among them) restart a pending
  change when the command is repeated, and a restarted controller must know a soft
  power-off is already running to escalate it to hard after ``soft_timeout``.
- Remediation deletes Nodes on our word that a host is off (policy.fencing), so the word is
  given per reboot key: ``status.poweredOffFor`` lists the keyed reboot annotations that
  were on the host when the BMC was read off, with no power-on of ours that could still
  land, and none read on since (``_acknowledge``). A power-on we sent and have not seen
  obeyed is never forgotten while the host is off, however long ago it was sent: a slow BMC
  may still carry it out, and a power-off sent after it cannot be relied on to cancel it
  (sushy-tools' fake driver, like BMCs that compare a request with the present state,
  ignores a power-off while a power-on is pending). It stays on record until the host is
  read on, or until an "on" is sent again because the host must be on.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from metalmend.api import names
from metalmend.api.power import PowerAction, PowerState
from metalmend.api.reboot import RebootRequest, is_reboot_annotation, reboot_requests
from metalmend.api.stamps import parse_stamp, stamp
from metalmend.policy.decision import Decision as _Decision
from metalmend.policy.decision import Event as Event  # one of this policy's actions
from metalmend.policy.decision import EventType
from metalmend.policy.fencing import POWERED_OFF_FOR

# The command a decision sends: the drivers' own type, so that it reaches them unconverted.
PowerCommand = PowerAction
MICROSECOND = dt.timedelta(microseconds=1)


@dataclass(frozen=True)
class PowerSettings:
    """The host-power controller's timers, in seconds."""

    soft_timeout: float = 180.0
    """A soft power-off not done after this long is made hard: Ironic's default, long
    enough for an operating system to shut down cleanly; 0 powers off hard at once."""

    poll_interval: float = 20.0
    """Re-read the BMC this often when nothing is happening: notices a host switched off
    behind our back within a Node's heartbeat grace, without loading the BMCs."""

    poll_budget: float = 300.0
    """... but at most this many of those routine reads a second in this process (0: no
    limit): above poll_budget * poll_interval hosts (6,000 at the defaults), each host's
    idle poll comes every hosts / poll_budget seconds instead (``poll_every``). Each read
    is a new TLS connection to its BMC (``bmc.pool`` hangs up after a routine poll), on
    libcurl since issue 38 (``bmc/curl.py``): 5,000 hosts every 20 s, 250 reads a second,
    fit without stretching; the budget stays as the safety valve (docs/scale.md, fix 14
    and "The HTTP client of a routine read")."""

    poll_batch: float = 16.0
    """Idle polls are read in batches of about this many (0: each at its own moment):
    each host's slot is rounded down to a grid of about poll_batch / (this process's
    routine reads a second) seconds, at most POLL_GRID_MAX (``poll_grid``). The same reads
    as without it, each host still once per interval, but the process wakes once for a
    batch instead of once a read, and a read done right after others costs less CPU than
    one done alone after a sleep: a third less at 1,250 hosts, a tenth at 5,000
    (docs/sharding.md, "Idle polls in batches")."""

    transition_poll: float = 1.0
    """... at most this often while a commanded change lands, so it is seen promptly."""

    first_poll: float = 0.1
    """... and this soon after a command: many BMCs obey at once."""

    command_retry: float = 30.0
    """Re-send a power command not obeyed after this long: BMCs restart a pending change
    when the command is repeated, so not sooner."""


@dataclass(frozen=True)
class LastCommand:
    """``status.lastPowerCommand``: the power command last sent, and when (a soft
    power-off sent again keeps its first time: escalation to hard counts from it)."""

    action: PowerCommand
    at: dt.datetime


ERROR = "error"
OK = "OK"
WRITES_CONDITION = "WritesAccepted"  # status.conditions type: our writes were admitted


def _stamp_of(value: Any) -> dt.datetime | None:
    try:
        return parse_stamp(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _last_command(value: Any) -> LastCommand | None:
    if not isinstance(value, Mapping) or value.get("action") not in tuple(PowerAction):
        return None
    at = _stamp_of(value.get("at"))
    return LastCommand(PowerAction(value["action"]), at) if at is not None else None


def _keys(listed: Any) -> tuple[str, ...]:
    """status.poweredOffFor as written by us; anything else lists nothing."""
    if not isinstance(listed, list):
        return ()
    return tuple(k for k in listed if isinstance(k, str))


@dataclass(frozen=True)
class PowerStatus:
    """The BareMetalHost status fields host-power owns (upstream metal3's names where
    upstream has them). Owns its wire format: ``from_wire`` reads anything without
    raising (a field of the wrong type reads as absent), ``to_wire`` replaces only these
    fields in a status and keeps every other field as it was. None: absent."""

    powered_on: bool | None = None  # poweredOn
    last_powered_on: dt.datetime | None = None  # provisioning.lastPoweredOn
    pending_reboot_since: dt.datetime | None = None  # provisioning.pendingRebootSince
    last_command: LastCommand | None = None  # lastPowerCommand
    powered_off_for: tuple[str, ...] = ()  # poweredOffFor (policy.fencing)
    error_type: str | None = None  # errorType
    error_message: str | None = None  # errorMessage
    error_count: int | None = None  # errorCount: failed attempts at the BMC in a row
    operational_status: str | None = None  # operationalStatus: OK | error
    writes_refused: Mapping[str, str] | None = None  # the WritesAccepted=False condition

    @classmethod
    def from_wire(cls, status: Mapping[str, Any]) -> PowerStatus:
        provisioning = status.get("provisioning")
        provisioning = provisioning if isinstance(provisioning, Mapping) else {}
        powered_on, count = status.get("poweredOn"), status.get("errorCount")
        refused = next(
            (
                c
                for c in status.get("conditions") or []
                if isinstance(c, Mapping)
                and c.get("type") == WRITES_CONDITION
                and c.get("status") == "False"
            ),
            None,
        )
        return cls(
            powered_on=powered_on if isinstance(powered_on, bool) else None,
            last_powered_on=_stamp_of(provisioning.get("lastPoweredOn")),
            pending_reboot_since=_stamp_of(provisioning.get("pendingRebootSince")),
            last_command=_last_command(status.get("lastPowerCommand")),
            powered_off_for=_keys(status.get(POWERED_OFF_FOR)),
            error_type=_str(status.get("errorType")),
            error_message=_str(status.get("errorMessage")),
            error_count=count if isinstance(count, int) and not isinstance(count, bool) else None,
            operational_status=_str(status.get("operationalStatus")),
            writes_refused=dict(refused) if refused is not None else None,
        )

    def to_wire(self, status: Mapping[str, Any]) -> dict[str, Any]:
        result = dict(status)
        provisioning = dict(result.get("provisioning") or {})
        command = self.last_command
        top: dict[str, Any] = {
            "poweredOn": self.powered_on,
            "lastPowerCommand": (
                {"action": str(command.action), "at": stamp(command.at)} if command else None
            ),
            POWERED_OFF_FOR: list(self.powered_off_for) or None,
            "errorType": self.error_type,
            "errorMessage": self.error_message,
            "errorCount": self.error_count,
            "operationalStatus": self.operational_status,
        }
        nested: dict[str, Any] = {
            "lastPoweredOn": stamp(self.last_powered_on) if self.last_powered_on else None,
            "pendingRebootSince": (
                stamp(self.pending_reboot_since) if self.pending_reboot_since else None
            ),
        }
        for values, target in ((top, result), (nested, provisioning)):
            for name, value in values.items():
                if value is None:
                    target.pop(name, None)
                else:
                    target[name] = value
        if provisioning:
            result["provisioning"] = provisioning
        conditions = [
            c for c in result.get("conditions") or [] if c.get("type") != WRITES_CONDITION
        ]
        if self.writes_refused is not None:
            conditions.append(dict(self.writes_refused))
        if conditions or "conditions" in result:
            result["conditions"] = conditions
        return result

    def changes(self, before: PowerStatus) -> dict[str, Any]:
        """The fields that differ from ``before`` (by attribute name): for logs and tests."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(before, f.name)
        }

    # ---- the status rules of failed and successful attempts ------------------------------

    @property
    def in_error(self) -> bool:
        return bool(self.error_type) or self.operational_status == ERROR

    def failed(self, error_type: str, message: str, *, forget_command: bool) -> PowerStatus:
        """After a failed attempt at the BMC (upstream metal3's fields). ``errorCount``
        counts failed attempts, not reconciles (a reconcile that only waits for the
        schedule writes nothing). ``forget_command``: a power command recorded but refused
        by the BMC is forgotten, so the next attempt sends it again."""
        return replace(
            self,
            error_type=error_type,
            error_message=message,
            error_count=(self.error_count or 0) + 1,
            operational_status=ERROR,
            last_command=None if forget_command else self.last_command,
        )

    def recovered(self) -> PowerStatus:
        """After a successful attempt: errors cleared (``errorCount`` back to 0) and a
        refused-writes condition dropped."""
        status = replace(
            self, writes_refused=None, operational_status=self.operational_status or OK
        )
        if self.in_error:
            status = replace(
                status, error_type="", error_message="", error_count=0, operational_status=OK
            )
        return status

    def refused(self, message: str, now: dt.datetime) -> PowerStatus:
        """The API server refused one of our writes (an admission policy): the host is in
        error, with a ``WritesAccepted=False`` condition saying what was refused, because a
        reboot that cannot finish holds the host off."""
        condition = {
            "type": WRITES_CONDITION,
            "status": "False",
            "reason": "AdmissionRefused",
            "message": message,
            "lastTransitionTime": stamp(now).split(".")[0] + "Z",  # metav1.Time: seconds
        }
        return replace(
            self,
            error_type="power management error",
            error_message=message,
            operational_status=ERROR,
            writes_refused=condition,
        )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Host:
    """A BareMetalHost as the controller sees it in one reconcile."""

    online: bool
    provisioning_state: str
    externally_provisioned: bool
    annotations: Mapping[str, str]
    power: PowerState  # read from the BMC in this reconcile
    status: PowerStatus = PowerStatus()
    # This controller process sent status.last_command itself. False after a restart or
    # failover, or when the send never happened (the BMC was busy): see send_recorded_now.
    command_confirmed: bool = True
    # The host's own place in the poll interval, in [0, 1) (``poll_phase`` of its key);
    # None: idle polls are not spread (every host polls poll_interval after its reconcile).
    poll_phase: float | None = None
    # The interval its idle polls keep (``poll_every``: poll_interval, or longer for the
    # poll budget); None: poll_interval.
    poll_every: float | None = None
    # The grid its slot is rounded down to (``poll_grid``), seconds; 0: not rounded; and
    # where this process's grid starts, as a fraction of a step (``Observed.grid_shift``).
    poll_grid: float = 0.0
    grid_shift: float = 0.0


# ---- actions, executed in order by controllers.hostpower ----------------------------------


@dataclass(frozen=True)
class SetStatus:
    """Write the host's power status (first: facts before the command they announce)."""

    status: PowerStatus


@dataclass(frozen=True)
class RemoveAnnotations:
    keys: tuple[str, ...]


@dataclass(frozen=True)
class SendPower:
    """Send ``command.action`` to the BMC; ``command`` is what status records of it."""

    command: LastCommand


@dataclass(frozen=True)
class ReportOnce:
    """An Event given once per ``topic`` by this process (a malformed annotation, reboots
    ignored): it stays true at every poll, and repeating it would be a write at rest."""

    event: Event
    topic: tuple[str, ...]


Action = SetStatus | RemoveAnnotations | SendPower | ReportOnce | Event
Decision = _Decision[Action]


@dataclass
class _Draft:
    """What ``decide``'s rules accumulate; turned into actions by ``_actions``."""

    command: PowerCommand | None = None
    status: dict[str, Any] = field(default_factory=dict)  # PowerStatus field -> new value
    remove_annotations: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    invalid: list[RebootRequest] = field(default_factory=list)  # malformed values
    ignored: str | None = None  # why reboot annotations are not honoured
    requeue_after: float = 0.0

    def note(self, reason: str, message: str, warning: bool = False) -> None:
        kind = EventType.WARNING if warning else EventType.NORMAL
        self.events.append(Event(kind, reason, message))


def honours_reboots(host: Host) -> bool:
    """The reboot interface design: reboots are for provisioned hosts; upstream also
    honours externally provisioned ones."""
    return host.externally_provisioned or host.provisioning_state in (
        names.PROVISIONED,
        names.EXTERNALLY_PROVISIONED,
    )


def decide(host: Host, now: dt.datetime, settings: PowerSettings = PowerSettings()) -> Decision:
    """The host's power status, annotation removals and power command, in that order,
    then Events; ``requeue_at`` the next poll. Called after a successful BMC read: the
    status written is recovered from any earlier error."""
    return _actions(host, _draft(host, now, settings), now, settings)


def _actions(host: Host, draft: _Draft, now: dt.datetime, settings: PowerSettings) -> Decision:
    status = replace(host.status, **draft.status)
    decision = Decision()
    recovered = status.recovered()
    if draft.remove_annotations and host.status.writes_refused is not None:
        # A refused removal stays reported until a removal succeeds (not cleared and set
        # again by every attempt): the facts first, the removal, then the recovery.
        decision.do(SetStatus(status), RemoveAnnotations(tuple(draft.remove_annotations)))
        decision.do(SetStatus(recovered))
    else:
        decision.do(SetStatus(recovered))
        if draft.remove_annotations:
            decision.do(RemoveAnnotations(tuple(draft.remove_annotations)))
    if host.status.in_error:
        decision.note(names.REASON_BMC_RECOVERED, "BMC answers again")
    if draft.command is not None:
        decision.do(SendPower(recovered.last_command or LastCommand(draft.command, now)))
    decision.do(*draft.events)
    for request in draft.invalid:
        value = host.annotations.get(request.key, "")
        message = f"{request.key}: {request.problem}; using the default mode (soft)"
        event = Event(EventType.WARNING, names.REASON_INVALID_REBOOT, message)
        decision.do(ReportOnce(event, ("invalid", request.key, value)))
    if draft.ignored:
        event = Event(EventType.NORMAL, names.REASON_REBOOT_IGNORED, draft.ignored)
        decision.do(ReportOnce(event, ("ignored", draft.ignored)))
    return decision.at(_next_poll(host, draft.requeue_after, now, settings))


def _next_poll(host: Host, after: float, now: dt.datetime, settings: PowerSettings) -> dt.datetime:
    """``after`` seconds from now, except the idle poll of a host with a phase: that one
    at the host's own slot (``spread_poll``)."""
    if host.poll_phase is None or after < settings.poll_interval:
        return now + dt.timedelta(seconds=after)
    every = host.poll_every or settings.poll_interval
    return spread_poll(now, every, host.poll_phase, host.poll_grid, host.grid_shift)


POLL_EVERY_MAX = 3600.0
"""The longest interval between two idle reads of a host's power, whatever the settings
and the number of hosts: a host switched off behind our back is noticed within the hour.
The settings loader bounds ``poll_interval`` by it; ``poll_every`` never stretches past it
(beyond poll_budget x POLL_EVERY_MAX hosts the process reads more than poll_budget a
second rather than less than once an hour)."""


def poll_every(settings: PowerSettings, hosts: int) -> float:
    """The interval the idle polls of ``hosts`` hosts keep: poll_interval, unless reading
    each of them that often would exceed poll_budget reads a second; then hosts /
    poll_budget, rounded up to a whole second (hosts coming and going then move the
    polls' slots only when a whole second is crossed), at most POLL_EVERY_MAX. The polls
    stay spread evenly over it (``spread_poll``), so the process reads at most poll_budget
    BMCs a second at rest.

    Only idle polls: a reboot, a power change landing, a fence's evidence or a failing
    BMC's retries are read on their own schedule. Total for any settings (the loader's
    ranges are not relied on here): never raises, always finite and positive."""
    interval = _poll_interval(settings.poll_interval)
    budget = settings.poll_budget
    if not budget > 0 or not math.isfinite(budget) or hosts <= budget * interval:
        return interval
    return float(min(POLL_EVERY_MAX, math.ceil(min(hosts / budget, POLL_EVERY_MAX))))


POLL_EVERY_MIN = 0.001  # the shortest interval spread_poll spreads over

POLL_GRID_MAX = 1.0
"""The coarsest grid idle polls are batched on (s): a host's poll comes at most this much
before its own moment in the interval, however few hosts the process polls."""


def poll_grid(settings: PowerSettings, hosts: int, every: float) -> float:
    """The grid (s) that the idle polls' slots of ``hosts`` hosts read every ``every``
    seconds are rounded down to, so that they come in batches of about
    ``power.poll_batch`` (from half of it to all of it): poll_batch x every / hosts,
    rounded down to a power of two (the grid, and so every host's slot, changes only when
    the number of hosts doubles or halves), at most POLL_GRID_MAX and at most a
    sixteenth of the interval. 0 (no batching) when poll_batch is 0 or not a number.
    Total: never raises, always finite and at least 0."""
    batch, hosts = settings.poll_batch, max(hosts, 1)
    every = _poll_interval(every)
    if not batch > 0 or not math.isfinite(batch):
        return 0.0
    raw = min(batch * every / hosts, POLL_GRID_MAX, every / 16)
    return 2.0 ** math.floor(math.log2(raw)) if raw >= 2.0**-20 else 0.0


def _poll_interval(interval: float) -> float:
    """``interval`` within [POLL_EVERY_MIN, POLL_EVERY_MAX]; nan: the longest."""
    if not interval >= POLL_EVERY_MIN:  # nan too
        return POLL_EVERY_MAX if math.isnan(interval) else POLL_EVERY_MIN
    return min(interval, POLL_EVERY_MAX)


POLL_SPREAD_MIN = 0.25
"""An idle poll comes at least this fraction of the interval after the last read (and so
at most 1 + this fraction after it): the slot of a host read just before it is skipped."""


def poll_phase(key: str) -> float:
    """A host's place in the poll interval, in [0, 1): a hash of its ``namespace/name``,
    the same in every process and after every restart."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def spread_poll(
    now: dt.datetime, interval: float, phase: float, grid: float = 0.0, shift: float = 0.0
) -> dt.datetime:
    """The next idle poll of a host: the next moment (wall clock) whose offset in the
    interval is the host's ``phase``, at least POLL_SPREAD_MIN intervals from now. With a
    ``grid`` (``poll_grid``), the offset is rounded down to the grid, whose steps start
    ``shift`` (a fraction of a step) after the interval's: the hosts whose phases fall in
    the same step are read at the same moment, one batch (every host still exactly once
    per interval; at most one step early). Each process draws its own shift, so that the
    batches of replicas sharing a machine, or BMCs behind one switch, do not coincide.

    Without it every host polls ``interval`` after its last reconcile, so hosts created
    together, or all reconciled at once after a restart, read their BMCs in step forever:
    5,000 reads in the same second, then nothing. With it their reads spread evenly over
    the interval whatever happened before, and each host still reads its BMC exactly once
    per interval once it is on its slot (at most 1 + POLL_SPREAD_MIN intervals apart).

    Total: any interval, phase, grid and shift (an interval outside [POLL_EVERY_MIN,
    POLL_EVERY_MAX] is taken as the nearest bound, a phase or shift modulo 1, nan as 0, a
    grid that is not a positive number as none) give a moment from POLL_SPREAD_MIN to 1 +
    POLL_SPREAD_MIN intervals ahead, never past the latest moment a datetime can hold; it
    never raises."""
    interval = _poll_interval(interval)
    phase = phase % 1.0 if math.isfinite(phase) else 0.0
    try:
        clock = now.timestamp()
    except (OverflowError, ValueError, OSError):  # a naive moment the local zone cannot map
        clock = 0.0
    offset = phase * interval
    if grid > 0 and math.isfinite(grid):
        step = min(grid, interval)
        start = (shift % 1.0 if math.isfinite(shift) else 0.0) * step
        offset = math.floor((offset - start) / step) * step + start
    wait = (offset - clock) % interval
    if wait < POLL_SPREAD_MIN * interval:
        wait += interval
    try:
        return now + dt.timedelta(seconds=wait)
    except OverflowError:  # within an hour of year 9999
        return dt.datetime.max.replace(tzinfo=now.tzinfo)


def _draft(host: Host, now: dt.datetime, settings: PowerSettings) -> _Draft:
    decision = _Draft(requeue_after=settings.poll_interval)
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
        if host.status.pending_reboot_since is not None:
            decision.status["pending_reboot_since"] = None
        _acknowledge(host, [], on, decision)
        return _power_to(host.online, host, on, [], now, settings, decision)

    if not honours_reboots(host):
        if requests:
            decision.ignored = (
                f"reboot annotations are honoured only by provisioned hosts; this host is"
                f" {host.provisioning_state or 'not provisioned'}"
            )
        _acknowledge(host, [], on, decision)  # the annotations do not hold it off
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
    _acknowledge(host, [r.key for r in requests if r.keyed], on, decision)
    return _power_to(host.online and not held_off, host, on, requests, now, settings, decision)


def _acknowledge(host: Host, holding: list[str], on: bool, decision: _Draft) -> None:
    """``status.poweredOffFor``: the keyed reboot annotations (``holding``: present, and
    holding the host off) that the host has been read off for.

    A key is listed when the BMC, read in this reconcile, says off while the key is on the
    host (in the very version this status write is conditional on), and no power-on we sent
    could still land: none on record (one is kept until it is seen obeyed, see ``_power_to``).
    The list keeps only keys still present and is emptied whenever the host is read on, so
    a key listed was read off *after it was added* and the host was not seen on since:
    remediation fences on nothing less (policy.fencing)."""
    in_flight = (
        host.status.last_command is not None and host.status.last_command.action == PowerAction.ON
    )
    if on or in_flight:
        wanted: tuple[str, ...] = ()
    else:
        wanted = tuple(sorted(set(holding)))
    if wanted != tuple(host.status.powered_off_for):
        decision.status["powered_off_for"] = wanted


def _record_power(host: Host, on: bool, now: dt.datetime, decision: _Draft) -> dt.datetime | None:
    """status.poweredOn follows the BMC; lastPoweredOn moves when power was restored (seen
    off, now on), or when we first see a host on."""
    last = host.status.last_powered_on
    if host.status.powered_on != on:
        decision.status["powered_on"] = on
    if on and (host.status.powered_on is not True or last is None):
        last = now
        decision.status["last_powered_on"] = now
        if host.status.powered_on is False:
            decision.note(names.REASON_POWERED_ON, "power restored")
        pending = host.status.pending_reboot_since
        previous = host.status.last_powered_on
        if pending is not None and (previous is None or pending > previous):
            when = f"requested at {stamp(pending)}, powered on at {stamp(now)}"
            decision.note(names.REASON_REBOOT_COMPLETED, f"rebooted: {when}")
    elif not on and host.status.powered_on is True:
        decision.note(names.REASON_POWERED_OFF, "power is off")
    return last


def _note_reboot_request(
    host: Host,
    requests: list[RebootRequest],
    on: bool,
    last: dt.datetime | None,
    now: dt.datetime,
    decision: _Draft,
) -> dt.datetime | None:
    """ "If there is one or more annotations with the reboot.metal3.io prefix present, and
    the Status.PoweredOn field is true, and the value of pendingRebootSince is empty or
    earlier than the lastPoweredOn time, then the Host controller will update
    pendingRebootSince to the current time." (Also when the host is off: see above.)"""
    pending = host.status.pending_reboot_since
    stale = pending is None or (last is not None and pending < last)
    if not requests or not stale:
        return pending
    # Strictly later than lastPoweredOn, even if both were taken in this same instant.
    pending = max(now, last + MICROSECOND) if last is not None else now
    decision.status["pending_reboot_since"] = pending
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
    decision: _Draft,
) -> _Draft:
    """Send (or wait for) the power command that makes the host's power ``want_on``."""
    last = host.status.last_command
    if want_on == on and not on and last is not None and last.action == PowerAction.ON:
        # Off as wanted, but a power-on we sent and have not seen obeyed may still land (sent
        # just before a reboot key arrived, or to a BMC that takes its time), however long
        # ago it was sent. It stays on record - remediation reads "power-on in flight" and
        # fences nothing - until the host is read on (then held off and powered off again,
        # and read off after that). Watched closely while it should land, then at the
        # ordinary poll interval. (A lost "on" costs a remediation one failed attempt: it
        # releases the host, and the "on" is sent again if spec.online.)
        landing_for = (now - last.at).total_seconds()
        if landing_for < settings.command_retry:
            poll = _landing_poll(landing_for, settings)
            decision.requeue_after = min(decision.requeue_after, poll)
        return decision
    if want_on == on:
        # Forget the last command once it is obeyed, or once it had time to land (an
        # unobeyed "on" while off is kept, above).
        obeyed = (last.action == PowerAction.ON) == on if last is not None else True
        stale = last is not None and (now - last.at).total_seconds() >= settings.command_retry
        if last is not None and (obeyed or stale):
            decision.status["last_command"] = None
        elif last is not None:
            decision.requeue_after = min(decision.requeue_after, settings.transition_poll)
        return decision
    since = (now - last.at).total_seconds() if last is not None else None
    if want_on:
        command = PowerAction.ON
    elif any(r.mode == "hard" for r in requests):
        command = PowerAction.HARD_OFF  # "a hard shutdown request takes priority over a soft one"
    elif last is not None and last.action == PowerAction.HARD_OFF:
        # Escalated to hard (or asked hard by a request since withdrawn): never back to soft
        # while the hard power-off lands. A soft one sent now would replace the pending hard
        # change on many BMCs and restart the soft timeout: a loop of soft, hard, soft.
        command = PowerAction.HARD_OFF
    elif last is not None and last.action == PowerAction.SOFT_OFF and since is not None:
        if since < settings.soft_timeout and host.command_confirmed:
            # running: look for it landing, escalate on time
            decision.requeue_after = min(
                settings.soft_timeout - since, _landing_poll(since, settings)
            )
            return decision
        if since < settings.soft_timeout:
            command = PowerAction.SOFT_OFF  # may never have been sent: send it, keep its time
        else:
            command = PowerAction.HARD_OFF
            message = f"still on {since:.0f}s after a soft power-off; powering off hard"
            decision.note(names.REASON_SOFT_TIMEOUT, message, warning=True)
    else:
        command = PowerAction.SOFT_OFF
    if not send_recorded_now(last, command, host.command_confirmed, since, settings):
        decision.requeue_after = _landing_poll(
            since or 0.0, settings
        )  # sent; waiting for it to land
        return decision
    decision.command = command
    # A soft power-off sent again keeps its first time: escalation to hard counts from it.
    resent_soft = command == PowerAction.SOFT_OFF and last is not None and last.action == command
    at = last.at if resent_soft and last is not None else now
    decision.status["last_command"] = LastCommand(command, at)
    reason = names.REASON_POWER_ON if want_on else names.REASON_POWER_OFF
    decision.note(reason, _why(command, host, requests))
    decision.requeue_after = settings.first_poll
    return decision


def _landing_poll(since: float, settings: PowerSettings) -> float:
    """Look soon after a command, then less often: a fast BMC is seen to obey within a
    tenth of a second, and a slow one is not polled hard."""
    return min(max(since / 2, settings.first_poll), settings.transition_poll)


def _why(command: PowerCommand, host: Host, requests: list[RebootRequest]) -> str:
    if command == PowerAction.ON:
        return "powering on: spec.online is true and no reboot annotation holds the host off"
    if requests or host.online:
        keys = ", ".join(r.key for r in requests) or "a pending reboot"
        return f"{command}: reboot requested by {keys}"
    return f"{command}: spec.online is false"


# ---- a recorded command after a restart ---------------------------------------------------


def send_recorded_now(
    last: LastCommand | None,
    command: PowerCommand,
    confirmed: bool,
    since: float | None,
    settings: PowerSettings,
) -> bool:
    """Whether ``command`` (what the host needs now, its power not yet matching) is sent in
    this reconcile, given the command on record in ``status.lastPowerCommand``.

    A command on record was written *before* it was sent (facts first), so a controller
    killed between the two, a failover to another replica, or a BMC too busy to take the
    send leaves a record of a command that may never have reached the BMC. ``confirmed``
    says that this controller process sent the recorded command itself. Only then does the
    in-flight guard apply (``command_retry``: BMCs restart a pending change when the command
    is repeated); an unconfirmed record of the very command the host needs now is sent at
    once: the BMC was just read and the host is not where the command takes it, and sending
    ``on``/``off`` again is what the guard would do anyway after ``command_retry``.

    Never a different command than the one the rules chose: this decides *when*, not what.
    """
    if last is None or last.action != command or since is None:
        return True
    if not confirmed:
        return True
    return since >= settings.command_retry


# ---- BMC errors: the retry schedule ----------------------------------------------------


@dataclass(frozen=True)
class RetrySettings:
    """When a host whose BMC failed is tried again. Only this schedule decides: watch
    events for the host (its own status writes, Events, unrelated updates) never bring an
    attempt forward; a user's real change may (see ``user_inputs``).

    Ordinary errors (unreachable, timed out, malformed address, missing Secret): 1 s
    doubling to 60 s, as the README promises, so a BMC back from an outage is noticed within
    a minute; that is at most 7 attempts in the first minute (0, 1, 3, 7, 15, 31, 63 s) and
    one a minute after.

    Authentication failures: 5 min, then 15 min, 45 min, and hourly. Real BMCs lock the
    account after a few failed logins, often for every user of it (the controller, the
    operator at the console, other tools), so a wrong password must cost as few failed
    logins as possible while a fixed Secret is still noticed at once (a Secret change resets
    the schedule: ``HostPowerController.reset_backoff``). The schedule never makes 3 failed
    logins within any 15 minutes (attempts at 0, 5, 20, 65 min, then hourly; jitter only
    delays), and at most 3 within any hour. What that is safe against:

    - Linux PAM ``pam_faillock`` defaults (deny=3 within fail_interval=900 s), which many
      BMC firmwares built on Linux reuse: never reached.
    - Dell iDRAC's IP blocking (off by default; typical settings 3-5 failures within a
      60 s window) and per-user lockouts of a few failures a minute: never reached.
    - HPE iLO, which by default delays logins after a failure rather than locking the
      account: one attempt every 5+ minutes never meets the delay.
    - Supermicro BMCs, whose lockout (after a configurable number of failures, often 3-5)
      is usually off by default: not reached within any 15 minutes.
    - Redfish ``AccountService`` (AccountLockoutThreshold, AccountLockoutCounterResetAfter,
      DMTF Redfish schema): safe whenever the counter resets within 15 minutes or the
      threshold is 4 or more per hour. A threshold of 3 with a counter kept longer than
      20 minutes can still lock the account once; we have not checked every vendor's
      default, so operators with such a policy should fix credentials within 20 minutes or
      pause the host (spec.bmc change) - the Warning Event says an authentication failure.

    One attempt may log in more than once (a Redfish driver may retry a refused session
    with basic auth); the numbers above are attempts, the driver's logins per attempt
    multiply them.
    """

    base: float = 1.0
    cap: float = 60.0
    authentication_first: float = 300.0
    authentication_factor: float = 3.0
    authentication_cap: float = 3600.0
    jitter: float = 0.2  # up to this fraction *later*, never earlier: bounds stay bounds


def retry_delay(
    failures: int, authentication_failures: int, jitter: float, settings: RetrySettings
) -> float:
    """Seconds until the next attempt after ``failures`` consecutive failed attempts, the
    last ``authentication_failures`` of them refused logins. ``jitter`` in [0, 1) is the
    caller's random draw (the rule stays pure and testable)."""
    if authentication_failures > 0:
        delay = min(
            settings.authentication_cap,
            settings.authentication_first
            * settings.authentication_factor ** min(authentication_failures - 1, 20),
        )
    else:
        delay = min(settings.cap, settings.base * 2.0 ** min(max(failures - 1, 0), 20))
    return delay * (1.0 + settings.jitter * min(max(jitter, 0.0), 1.0))


def user_inputs(
    spec: Mapping[str, Any], annotations: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """What a user changes to ask for something new: ``spec.online``, ``spec.bmc`` (address,
    Secret name, certificate checking) and the reboot annotations. When these differ from
    what they were at the last failed attempt, the host is tried again at once instead of
    on its schedule (once: failing again continues the schedule). Anything else - status,
    labels, other annotations, our own writes - waits for the schedule."""
    bmc = spec.get("bmc") or {}
    items = [
        ("online", repr(spec.get("online"))),
        ("bmc.address", str(bmc.get("address") or "")),
        ("bmc.credentialsName", str(bmc.get("credentialsName") or "")),
        ("bmc.disableCertificateVerification", repr(bmc.get("disableCertificateVerification"))),
    ]
    items += sorted((k, v) for k, v in annotations.items() if is_reboot_annotation(k))
    return tuple(items)


def credentials_inputs(
    spec: Mapping[str, Any], annotations: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """The part of ``user_inputs`` that can fix refused credentials: after an
    authentication failure only a new address or Secret (or a changed Secret: reset_backoff)
    retries early; flipping ``online`` or adding a reboot annotation does not, because each
    early try would be one more failed login towards the BMC's lockout."""
    del annotations
    return tuple(i for i in user_inputs(spec, {}) if i[0] in ("bmc.address", "bmc.credentialsName"))


@dataclass(frozen=True)
class Schedule:
    """The retry schedule of one failing host (kept in memory by the controller: a
    restart forgets it, and each failing host then gets one immediate attempt)."""

    failures: int  # consecutive failed attempts
    authentication_failures: int  # ... of which the last ones were refused logins
    next_attempt: dt.datetime
    inputs: tuple[tuple[str, str], ...]  # the user's inputs then: a change retries early
    unwritten: tuple[str, str, bool] | None = None  # (errorType, message, forget) to write


def after_failure(
    previous: Schedule | None,
    status: PowerStatus,
    *,
    authentication: bool,
    spec: Mapping[str, Any],
    annotations: Mapping[str, str],
    now: dt.datetime,
    jitter: float,
    settings: RetrySettings,
) -> Schedule:
    """The schedule after one more failed attempt. The first failure after a restart
    continues from ``status.errorCount``, so the next wait is as long as before."""
    if previous is not None:
        failures, auth_failures = previous.failures + 1, previous.authentication_failures
    else:
        failures, auth_failures = (status.error_count or 0) + 1, 0
    auth_failures = auth_failures + 1 if authentication else 0
    delay = retry_delay(failures, auth_failures, jitter, settings)
    inputs = (credentials_inputs if authentication else user_inputs)(spec, annotations)
    return Schedule(failures, auth_failures, now + dt.timedelta(seconds=delay), inputs)


def user_changed(
    schedule: Schedule, spec: Mapping[str, Any], annotations: Mapping[str, str]
) -> bool:
    """A user changed what they ask of the host since its last failed attempt."""
    inputs = credentials_inputs if schedule.authentication_failures else user_inputs
    return inputs(spec, annotations) != schedule.inputs


def forget_refused_command(command: PowerCommand, timed_out: bool) -> bool:
    """Whether a power command whose send failed is dropped from ``lastPowerCommand`` (so
    that the next attempt sends it again at once). Not an "on" that timed out: it may have
    reached the BMC and still land, and remediation must go on reading it as in flight
    (policy.fencing); it is sent again all the same, being unconfirmed."""
    return not (command == PowerAction.ON and timed_out)


# ---- one reconcile, whole: observed -> decide_reconcile -> the executor --------------------
#
# ``decide`` above is the reboot interface on a host whose power was just read. What
# happens around it is decided here too, in one pure function over one frozen snapshot:
# whether the host waits for its retry schedule, a busy or failing BMC, a command the BMC
# refused, a write the API server refused, a host handed to another replica. The
# controller only gathers the snapshot and carries the decision out.

BUSY_JITTER = 0.2  # a busy BMC's retry_after, up to this fraction later (spreads the herd)

# /metrics outcomes of a reconcile (metalmend_reconcile_total{outcome=...}); None: success
OUTCOME_BMC_ERROR = "bmc_error"
OUTCOME_BACKOFF = "backoff"  # waited for the host's schedule: nothing read, nothing written
OUTCOME_BUSY = "busy"  # the BMC was busy with other calls: tried again shortly
OUTCOME_REFUSED = "write_refused"


@dataclass(frozen=True)
class Memory:
    """What host-power keeps of one host between two reconciles, in this process only (a
    restart forgets it: everything a reboot needs is in the host's status). The
    controller holds one per host, and replaces it only with what a decision says
    (``Remember``)."""

    schedule: Schedule | None = None  # failing: the retry schedule
    sent: LastCommand | None = None  # the power command this process sent (confirms status)
    reported: frozenset[tuple[str, ...]] = frozenset()  # ReportOnce topics told, uid first
    waiting: bool = False  # told (an Event) that it waits for other namespaces' BMC calls


@dataclass(frozen=True)
class HostObject:
    """The BareMetalHost as cached: the parts host-power reads, as written (the policy
    reads them: ``PowerStatus.from_wire`` never raises)."""

    uid: str
    spec: Mapping[str, Any]
    annotations: Mapping[str, str]
    status: Mapping[str, Any]


@dataclass(frozen=True)
class PowerRead:
    """The BMC answered: the host's power now."""

    power: PowerState


@dataclass(frozen=True)
class BmcFailed:
    """The BMC call failed (or its address or credentials did: nothing was sent)."""

    error_type: str  # the BareMetalHost errorType to report
    message: str
    authentication: bool = False  # the BMC refused the login
    timed_out: bool = False  # no answer in time: the call may still have landed


@dataclass(frozen=True)
class BmcBusy:
    """The BMC endpoint was busy with other calls: nothing was read or sent."""

    message: str
    retry_after: float
    others: int = 0  # calls of other namespaces ahead of this one


Reading = PowerRead | BmcFailed | BmcBusy


@dataclass(frozen=True)
class SendEnded:
    """The power command of a decision was not carried out by the BMC."""

    command: LastCommand
    result: BmcFailed | BmcBusy


@dataclass(frozen=True)
class WriteRefused:
    """The API server refused a write of a decision (RBAC, an admission policy)."""

    action: SetStatus | RemoveAnnotations
    code: int  # the HTTP status code
    reason: str  # the API server's message


Ended = SendEnded | WriteRefused


@dataclass(frozen=True)
class Observed:
    """One reconcile's snapshot: the host from the cache, what this process remembers of
    it, and the BMC's answer (None: not read, the host waits for its retry schedule).
    ``ended``: a decision's action that failed; the rest of that decision is dropped and
    this snapshot (the host as last written) is decided again."""

    key: str
    now: dt.datetime
    host: HostObject | None  # None: not in the cache (deleted, or not this replica's)
    memory: Memory = Memory()
    draining: bool = False  # sharded, and the leader moves the host to another replica
    background: bool = False  # a routine poll: a busy BMC is not reported for it
    hosts: int = 1  # hosts cached by this process (the poll budget)
    jitter: float = 0.0  # a random draw in [0, 1): retries and busy waits spread
    grid_shift: float = 0.0  # this process's draw in [0, 1), once: where its poll grid starts
    bmc: Reading | None = None
    ended: Ended | None = None


# ---- what the executor does besides the reboot interface's actions ------------------------


@dataclass(frozen=True)
class Remember:
    """Replace this process's memory of the host."""

    memory: Memory


@dataclass(frozen=True)
class LetGo:
    """Remove both shard labels, on the version that asked (docs/sharding.md)."""


@dataclass(frozen=True)
class WriteFailure:
    """Write a failed attempt to status (``errorCount`` counts it once). Once written, or
    refused (the Event and the log say it), the memory becomes ``then``; a conflict or a
    host gone leaves it unwritten, for the next reconcile to write without a BMC call."""

    status: PowerStatus
    then: Memory


@dataclass(frozen=True)
class ReportRefusal:
    """Write a refused write's report to status; if that is refused too, the Event says it."""

    status: PowerStatus


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"


@dataclass(frozen=True)
class Log:
    """A line in the controller's log (``fields``: its structured fields)."""

    level: LogLevel
    message: str
    context: tuple[tuple[str, Any], ...] = ()


Step = (
    SetStatus | RemoveAnnotations | SendPower | Event | Remember | LetGo | WriteFailure
    | ReportRefusal | Log
)  # fmt: skip


@dataclass(frozen=True)
class ReconcileDecision:
    """Everything one reconcile does, in order, and what it returns: the next look
    (``requeue_at``), its /metrics ``outcome`` (None: success), whether the key keeps the
    priority it was handed out with (``same_priority``: nothing was done), and the idle
    polls' interval computed on the way (``poll_every``, for the log; None: not read)."""

    actions: tuple[Step, ...] = ()
    requeue_at: dt.datetime | None = None
    outcome: str | None = None
    same_priority: bool = False
    poll_every: float | None = None


def waits_for_schedule(observed: Observed) -> Schedule | None:
    """The schedule the host waits for (None: it is tried now). A failing host is tried on
    its own schedule only, unless a user changed what they ask of it since
    (``user_changed``). Observe asks it too: a waiting host's BMC is not read."""
    host, schedule = observed.host, observed.memory.schedule
    if host is None or schedule is None or observed.now >= schedule.next_attempt:
        return None
    return None if user_changed(schedule, host.spec, host.annotations) else schedule


def reads_bmc(observed: Observed) -> bool:
    """Whether this reconcile reads the host's BMC: a host cached, not handed over, and
    not waiting for its schedule."""
    if observed.host is None or observed.draining:
        return False
    return waits_for_schedule(observed) is None


def decide_reconcile(
    observed: Observed, settings: PowerSettings, retry: RetrySettings
) -> ReconcileDecision:
    """The whole of one reconcile of a host, from its snapshot (pure):

    - not cached: forget its schedule and the command sent;
    - handed to another replica: let go of it, forget it;
    - an action of the last decision failed (``ended``): the failure's decision;
    - failing, and its next attempt not due: wait (writing a failure a conflict left
      unwritten, without a BMC call);
    - the BMC busy: look again shortly; failing: the next attempt on the schedule
      (``after_failure``), the failure written and told;
    - the BMC read: ``decide`` (the reboot interface), then forget the schedule and
      remember the command sent."""
    host, memory, now = observed.host, observed.memory, observed.now
    if host is None:
        return ReconcileDecision((Remember(replace(memory, schedule=None, sent=None)),))
    if observed.draining:
        forgotten = replace(memory, schedule=None, sent=None, waiting=False)
        return ReconcileDecision((LetGo(), Remember(forgotten)))
    if observed.ended is not None:
        return _ended(observed, host, observed.ended, retry)
    schedule = waits_for_schedule(observed)
    if schedule is not None:
        unwritten = _write_failure(host, memory) if schedule.unwritten is not None else ()
        return ReconcileDecision(unwritten, schedule.next_attempt, OUTCOME_BACKOFF)
    match observed.bmc:
        case PowerRead() as read:
            return _read(observed, host, read, settings)
        case BmcBusy() as busy:
            told = not observed.background and busy.others != 0 and not memory.waiting
            return _busy(observed, busy, told, replace(memory, waiting=told or memory.waiting))
        case BmcFailed() as failed:
            return _failed(observed, host, failed, forget=False, retry=retry)
    return ReconcileDecision(requeue_at=now)  # not read although due: look again


def _read(
    observed: Observed, host: HostObject, read: PowerRead, settings: PowerSettings
) -> ReconcileDecision:
    """The reboot interface's decision, its ReportOnce Events told once, and the memory
    after it: no schedule, not waiting, the command sent remembered once sent."""
    memory = observed.memory
    status = PowerStatus.from_wire(host.status)
    provisioning = host.status.get("provisioning")
    state = provisioning.get("state") if isinstance(provisioning, Mapping) else None
    every = poll_every(settings, observed.hosts)
    view = Host(
        online=bool(host.spec.get("online", False)),
        provisioning_state=str(state or ""),
        externally_provisioned=bool(host.spec.get("externallyProvisioned", False)),
        annotations=dict(host.annotations),
        power=read.power,
        status=status,
        command_confirmed=status.last_command == memory.sent,
        poll_phase=poll_phase(observed.key),
        poll_every=every,
        poll_grid=poll_grid(settings, observed.hosts, every),
        grid_shift=observed.grid_shift,
    )
    decision = decide(view, observed.now, settings)
    # The BMC answered: no longer waiting for other namespaces' calls (said at once).
    actions: list[Step] = [Remember(replace(memory, waiting=False))] if memory.waiting else []
    reported, sent, last_write = set(memory.reported), memory.sent, 0
    for action in decision.actions:
        if isinstance(action, ReportOnce):
            topic = (host.uid, *action.topic)
            if topic not in reported:
                reported.add(topic)
                actions.append(action.event)
            continue
        actions.append(action)
        if isinstance(action, SendPower):
            sent = action.command
        if isinstance(action, (SetStatus, RemoveAnnotations, SendPower)):
            last_write = len(actions)
    after = Memory(schedule=None, sent=sent, reported=frozenset(reported), waiting=False)
    actions.insert(last_write, Remember(after))  # once every write and the command landed
    return ReconcileDecision(tuple(actions), decision.requeue_at, poll_every=every)


def _busy(observed: Observed, busy: BmcBusy, told: bool, memory: Memory) -> ReconcileDecision:
    """Not the BMC's failure, and no attempt: nothing written, nothing counted, and no
    worker waits for the BMC to be free. A host whose call waits for other namespaces'
    calls says so once per wait (an Event: status is the BMC's outcome, not its queue)."""
    delay = busy.retry_after * (1.0 + BUSY_JITTER * observed.jitter)
    actions: list[Step] = [Remember(memory)]
    if told:
        actions.append(Event(EventType.NORMAL, names.REASON_BMC_WAITING, busy.message))
    retry_in = f"{delay:.2f}s"
    actions.append(
        Log(LogLevel.DEBUG, "BMC busy", (("host", observed.key), ("retry_in", retry_in)))
    )
    requeue_at = observed.now + dt.timedelta(seconds=delay)
    # Nothing read, nothing done: a poll stays a background poll (kube.controller)
    return ReconcileDecision(
        tuple(actions), requeue_at, OUTCOME_BUSY, same_priority=observed.ended is None
    )


def _failed(
    observed: Observed, host: HostObject, failed: BmcFailed, *, forget: bool, retry: RetrySettings
) -> ReconcileDecision:
    """One failed attempt: the next on the schedule (``after_failure``), the failure
    written to status (``forget``: the command refused is dropped from it), told once
    (an Event) and logged."""
    memory, now = observed.memory, observed.now
    schedule = after_failure(
        memory.schedule,
        PowerStatus.from_wire(host.status),
        authentication=failed.authentication,
        spec=host.spec,
        annotations=host.annotations,
        now=now,
        jitter=observed.jitter,
        settings=retry,
    )
    schedule = replace(schedule, unwritten=(failed.error_type, failed.message, forget))
    memory = replace(memory, schedule=schedule, waiting=False)
    delay = (schedule.next_attempt - now).total_seconds()
    told = (
        ("host", observed.key), ("error", failed.message), ("attempt", schedule.failures),
        ("retry_in", f"{delay:.1f}s"),
    )  # fmt: skip
    actions: tuple[Step, ...] = (
        Remember(memory),
        *_write_failure(host, memory),
        Event(EventType.WARNING, names.REASON_BMC_ERROR, failed.message),
        Log(LogLevel.WARNING, "BMC error", told),
    )
    return ReconcileDecision(actions, schedule.next_attempt, OUTCOME_BMC_ERROR)


def _write_failure(host: HostObject, memory: Memory) -> tuple[WriteFailure, ...]:
    """The failed attempt on record in ``memory``'s schedule, written to status."""
    schedule = memory.schedule
    if schedule is None or schedule.unwritten is None:
        return ()
    error_type, message, forget = schedule.unwritten
    status = PowerStatus.from_wire(host.status).failed(error_type, message, forget_command=forget)
    then = replace(
        memory,
        schedule=replace(schedule, unwritten=None),
        sent=None if forget else memory.sent,
    )
    return (WriteFailure(status, then),)


def _ended(
    observed: Observed, host: HostObject, ended: Ended, retry: RetrySettings
) -> ReconcileDecision:
    """An action of the last decision failed; ``observed.host`` is the host as last
    written, and the BMC was read (not waiting for other namespaces any more)."""
    observed = replace(observed, memory=replace(observed.memory, waiting=False))
    if isinstance(ended, WriteRefused):
        return _refused(observed, host, ended, retry)
    if isinstance(ended.result, BmcBusy):
        # Recorded, not sent: unconfirmed, so the next attempt sends it at once.
        told = ended.result.others != 0
        return _busy(observed, ended.result, told, replace(observed.memory, waiting=told))
    forget = forget_refused_command(ended.command.action, ended.result.timed_out)
    return _failed(observed, host, ended.result, forget=forget, retry=retry)


def _refused(
    observed: Observed, host: HostObject, refused: WriteRefused, retry: RetrySettings
) -> ReconcileDecision:
    """The API server refused our status or annotation write (RBAC, or an admission
    policy such as deploy/policies/reboot-annotation-writers.yaml without our identity):
    say so on the host where an operator looks, and retry on the ordinary schedule."""
    now, action = observed.now, refused.action
    if isinstance(action, RemoveAnnotations):
        what, intended = f"removal of {', '.join(action.keys)}", PowerStatus.from_wire(host.status)
    else:
        what, intended = "status update", action.status
    reason = " ".join(refused.reason.split())[:500]
    message = (
        f"the API server refused metalmend's {what} ({refused.code}): {reason};"
        " the host's reboot cannot finish until metalmend may write it"
    )
    schedule = after_failure(
        observed.memory.schedule,
        intended,
        authentication=False,
        spec=host.spec,
        annotations=host.annotations,
        now=now,
        jitter=observed.jitter,
        settings=retry,
    )
    actions = (
        Remember(replace(observed.memory, schedule=schedule)),
        ReportRefusal(intended.refused(message, now)),
        Event(EventType.WARNING, names.REASON_WRITE_REFUSED, message),
        Log(LogLevel.WARNING, "write refused", (("host", observed.key), ("error", message))),
    )
    return ReconcileDecision(actions, schedule.next_attempt, OUTCOME_REFUSED)
