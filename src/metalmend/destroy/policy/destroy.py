"""Destroying a node, decided purely (docs/destroy.md, docs/decide-act.md).

Airship's node teardown spec ("Drydock Destroy Node", airship-specs
``specs/approved/workflow_node-teardown.rst``): "reset the hardware to a re-provisionable
state": the node shut down, its local storage wiped (every drive by default, per
datacenter policy; only the OS drive with ``preserve-local-storage``, so that data drives
can be remounted), and the host removed from the provisioner. Per node, in this order:

1. **claim**: the teardown claim on the Node's BareMetalHost (docs/design.md, invariant 7):
   a node under remediation is refused and nothing is changed;
2. **power-off**: ``spec.online: false`` on the host; host-power (``metalmend run``) does
   the BMC work, and the step waits until the host's ``status.poweredOn`` is false. Never
   a power command from here: one owner of the power, as for every other flow. A host
   already off with ``spec.online`` false is not touched;
3. **wipe**: the drives the BMC lists, each erased with Redfish ``Drive.SecureErase`` and
   waited for. With ``preserve-local-storage``, only the OS drive that the host's
   ``spec.rootDeviceHints`` choose (metal3's rules, ``destroy.policy.rootdevice``); when they
   choose none (or several), nothing is erased and the node fails saying why. A drive is
   reported erased only once the BMC reported its erase finished (invariant 8); a BMC that
   cannot erase (IPMI) makes the node fail with "NOT wiped", never a success;
4. **release**: as baremetal-operator deprovisions a host: provisioning state
   ``deprovisioning``, ``spec.consumerRef`` (and ``spec.image``) cleared, then, once no
   ``reboot.metal3.io`` annotation is left (host-power removes them from a deprovisioned
   host: invariant 6 keeps them its own), ``available``: upstream's name for a clean host
   that can be provisioned again (``ready`` is its deprecated older name).

A node whose wipe failed or could not be done is **not released**: ``available`` promises
a host that may be handed to the next tenant, which a host still holding data is not. It
stays off and claimed, and the message says what to do.

Restart safety: the node's record (``NodeState``) is written before each thing it
announces (the power-off asked, an erase requested), and every step decides from that
record and what the cluster and the BMC say now: a host already off is not asked again,
an erase the BMC accepted is only waited for, never started again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from metalmend.api.stamps import parse_stamp, stamp
from metalmend.policy.decision import Decision as _Decision
from metalmend.policy.decision import Event as Event  # one of this policy's actions

# metal3 (baremetal-operator ``apis/metal3.io/v1alpha1/baremetalhost_types.go``).
DEPROVISIONING = "deprovisioning"
AVAILABLE = "available"  # "StateReady is a deprecated name for StateAvailable"
RELEASED_STATES = frozenset({AVAILABLE, "ready"})

# Event reasons, on the BareMetalHost and on the Node.
REASON_STARTED = "DestroyStarted"
REASON_REFUSED = "DestroyRefused"
REASON_POWER_OFF = "DestroyPowerOff"
REASON_POWERED_OFF = "DestroyPoweredOff"
REASON_WIPE_PLANNED = "DestroyWipePlanned"
REASON_ERASE_STARTED = "DriveEraseStarted"
REASON_DRIVE_ERASED = "DriveErased"
REASON_NOT_WIPED = "DestroyNotWiped"
REASON_RELEASING = "DestroyReleasing"
REASON_RELEASED = "DestroyReleased"
REASON_FAILED = "DestroyFailed"


@dataclass(frozen=True)
class DestroySettings:
    """How ``metalmend serve`` destroys nodes (section ``destroy``), in seconds."""

    power_off_timeout: float = 900.0
    """How long host-power may take to report the host off once ``spec.online`` is false:
    its soft power-off is made hard after 180 s, and a BMC may answer slowly."""

    erase_timeout: float = 86400.0
    """How long one drive's erase may run. A secure erase of a large spinning disk that
    overwrites every block takes hours; a day is a stuck erase."""

    poll_interval: float = 5.0
    """How often the host's power and each running erase are looked at."""

    bmc_retry: float = 10.0
    """Seconds before a BMC that did not answer (unreachable, busy, timed out) is asked
    again; the step's own timeout bounds the retries."""

    bmc_timeout: float = 600.0
    """How long a BMC may stay unreachable (or busy) while the drives are listed before the
    wipe gives up; running erases are waited for up to ``erase_timeout`` instead."""

    release_timeout: float = 300.0
    """How long host-power may take to remove the reboot annotations of the deprovisioned
    host (it does at its next poll, 20 s by default)."""

    lease_seconds: float = 30.0
    """A replica running a task renews its lease on it this often x 1/3; a lease not renewed
    for this long is taken over by another replica (several replicas on one database)."""


class Step(StrEnum):
    CLAIM = "claim"
    POWER_OFF = "power-off"
    WIPE = "wipe"
    RELEASE = "release"
    DONE = "done"


class Outcome(StrEnum):
    PENDING = "pending"
    SUCCESS = "success"
    FAILURE = "failure"


class Role(StrEnum):
    OS = "os"
    DATA = "data"


class Erase(StrEnum):
    PRESERVE = "preserve"  # kept as it is: preserve-local-storage
    PLANNED = "planned"  # to be erased; not asked yet
    REQUESTED = "requested"  # recorded before the request: it may not have reached the BMC
    RUNNING = "running"  # the BMC accepted it
    ERASED = "erased"  # the BMC reported it finished
    FAILED = "failed"


@dataclass(frozen=True)
class DriveRecord:
    id: str
    name: str
    serial: str
    role: Role | None  # None: not decided (no preserve-local-storage: every drive goes)
    erase: Erase
    since: dt.datetime | None = None  # when the erase was requested
    monitor: str = ""  # the BMC's task monitor of the erase, when it gave one
    detail: str = ""  # why it failed

    def describe(self) -> str:
        """``/dev/sda (OS drive, serial S1)``: how an operator finds it in the server."""
        about = (
            [f"{self.role.upper() if self.role is Role.OS else self.role} drive"]
            if self.role
            else []
        )
        about += [f"serial {self.serial}"] if self.serial else []
        return f"{self.name or self.id}" + (f" ({', '.join(about)})" if about else "")


@dataclass(frozen=True)
class NodeMessage:
    message: str
    error: bool
    ts: dt.datetime


@dataclass(frozen=True)
class NodeState:
    """A node's record in its task: everything the destroy remembers. Owns its wire format
    (a JSON object in the task store): ``from_wire`` tolerates anything, ``to_wire`` is the
    whole record."""

    step: Step = Step.CLAIM
    outcome: Outcome = Outcome.PENDING
    host: str = ""  # namespace/name of the BareMetalHost, once claimed
    step_since: dt.datetime | None = None
    power_off_asked: dt.datetime | None = None
    planned: bool = False
    drives: tuple[DriveRecord, ...] = ()
    messages: tuple[NodeMessage, ...] = ()

    @property
    def finished(self) -> bool:
        return self.outcome is not Outcome.PENDING

    def say(self, now: dt.datetime, message: str, error: bool = False) -> NodeState:
        return replace(self, messages=(*self.messages, NodeMessage(message, error, now)))

    def advance(self, step: Step, now: dt.datetime, message: str) -> NodeState:
        done = step is Step.DONE
        state = replace(
            self, step=step, step_since=now, outcome=Outcome.SUCCESS if done else self.outcome
        )
        return state.say(now, message)

    def fail(self, now: dt.datetime, message: str) -> NodeState:
        return replace(self, outcome=Outcome.FAILURE).say(now, message, error=True)

    @classmethod
    def from_wire(cls, wire: Any) -> NodeState:
        if not isinstance(wire, Mapping):
            return cls()
        return cls(
            step=_enum(Step, wire.get("step"), Step.CLAIM),
            outcome=_enum(Outcome, wire.get("outcome"), Outcome.PENDING),
            host=_text(wire.get("host")),
            step_since=_when(wire.get("stepSince")),
            power_off_asked=_when(wire.get("powerOffAsked")),
            planned=wire.get("planned") is True,
            drives=tuple(
                d for d in (_drive(x) for x in _list(wire.get("drives"))) if d is not None
            ),
            messages=tuple(
                m for m in (_message(x) for x in _list(wire.get("messages"))) if m is not None
            ),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "step": str(self.step),
            "outcome": str(self.outcome),
            "host": self.host,
            "stepSince": _stamp(self.step_since),
            "powerOffAsked": _stamp(self.power_off_asked),
            "planned": self.planned,
            "drives": [
                {
                    "id": d.id,
                    "name": d.name,
                    "serial": d.serial,
                    "role": str(d.role) if d.role else None,
                    "erase": str(d.erase),
                    "since": _stamp(d.since),
                    "monitor": d.monitor,
                    "detail": d.detail,
                }
                for d in self.drives
            ],
            "messages": [
                {"message": m.message, "error": m.error, "ts": stamp(m.ts)} for m in self.messages
            ],
        }


# ---- the view: what was observed in this round ------------------------------------------


@dataclass(frozen=True)
class HostFacts:
    """The node's BareMetalHost as read now."""

    key: str  # namespace/name
    online: bool
    powered_on: bool | None  # status.poweredOn (host-power's reading)
    power_error: str  # status.errorMessage while host-power reports an error
    provisioning_state: str
    consumer: bool  # spec.consumerRef set
    image: bool  # spec.image set
    reboot_keys: tuple[str, ...]  # reboot.metal3.io annotations present


@dataclass(frozen=True)
class DriveFacts:
    """A drive as the BMC lists it (the part the record keeps)."""

    id: str
    name: str
    serial: str = ""


class Seen(StrEnum):
    RUNNING = "running"
    FINISHED = "finished"  # no erase runs: the one requested is over (or never started)
    FAILED = "failed"


@dataclass(frozen=True)
class SeenErase:
    state: Seen
    detail: str = ""  # the BMC's words when it failed


@dataclass(frozen=True)
class View:
    node: str
    preserve: bool  # preserve-local-storage
    state: NodeState
    host: HostFacts | None = None
    host_problem: str = ""  # why there is no host to destroy
    refused: str = ""  # the claim was refused (a remediation holds the host)
    # Read from the BMC in this round, only while the wipe is not planned yet:
    drives: tuple[DriveFacts, ...] | None = None
    os_drive: str | None = None  # the id rootDeviceHints choose (preserve only)
    os_problem: str = ""  # ... or why they choose none
    cannot_erase: str = ""  # the BMC cannot erase drives (IPMI): its words
    bmc_error: str = ""  # a passing BMC failure (unreachable, busy, timed out)
    # The erases on record (requested or running), as the BMC reports them in this round
    # (a drive it did not answer for is absent):
    erases: Mapping[str, SeenErase] = field(default_factory=dict)
    # What the erase requests of the last round got: the BMC accepted (drive id ->
    # its task monitor, "" without one), or refused for good (-> its words).
    accepted: Mapping[str, str] = field(default_factory=dict)
    start_failed: Mapping[str, str] = field(default_factory=dict)


# ---- actions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """Take the teardown claim on the Node's host (``teardown.interlock``); a 409 is the fact
    ``refused`` of the next round."""

    step: str


@dataclass(frozen=True)
class SetState:
    """Store the node's record (first: facts before what they announce)."""

    state: NodeState


@dataclass(frozen=True)
class SetOnline:
    """``spec.online`` of the host: false asks host-power to power it off."""

    host: str
    online: bool


@dataclass(frozen=True)
class StartErase:
    host: str
    drive: str


@dataclass(frozen=True)
class SetProvisioningState:
    host: str
    state: str


@dataclass(frozen=True)
class ClearConsumer:
    """Remove ``spec.consumerRef`` and ``spec.image``: the host belongs to no one."""

    host: str


Action = Claim | SetState | SetOnline | StartErase | SetProvisioningState | ClearConsumer | Event
Decision = _Decision[Action]


def decide(view: View, now: dt.datetime, settings: DestroySettings = DestroySettings()) -> Decision:
    """The next actions for one node; ``requeue_at``: when to look again (None: finished)."""
    state = view.state
    if state.finished:
        return Decision()
    if view.refused:
        return _fail(state, now, f"refused: {view.refused}", REASON_REFUSED)
    if state.step is Step.CLAIM:
        return _claim(view, now)
    if view.host is None:
        why = view.host_problem or "its BareMetalHost is gone"
        return _fail(state, now, f"{state.step}: {why}")
    match state.step:
        case Step.POWER_OFF:
            return _power_off(view, view.host, now, settings)
        case Step.WIPE:
            return _wipe(view, now, settings)
        case Step.RELEASE:
            return _release(view, view.host, now, settings)
    return Decision()


def _fail(
    state: NodeState, now: dt.datetime, message: str, reason: str = REASON_FAILED
) -> Decision:
    return Decision().do(SetState(state.fail(now, message))).note(reason, message, warning=True)


def _claim(view: View, now: dt.datetime) -> Decision:
    if view.host is None:
        why = view.host_problem or "no BareMetalHost"
        return _fail(view.state, now, f"claim: {why}")
    wipe = "only the OS drive" if view.preserve else "every local drive"
    message = f"claim: host {view.host.key} claimed for destroy (wiping {wipe})"
    state = replace(view.state, host=view.host.key).advance(Step.POWER_OFF, now, message)
    return (
        Decision()
        .do(Claim("destroy"), SetState(state))
        .note(REASON_STARTED, f"destroying Node {view.node}: power off, wipe {wipe}, release")
        .at(now)
    )


def _power_off(
    view: View, host: HostFacts, now: dt.datetime, settings: DestroySettings
) -> Decision:
    state = view.state
    poll = now + dt.timedelta(seconds=settings.poll_interval)
    if host.online:
        # Asked before it is written: a restart finds the request on record and its time.
        message = "power-off: spec.online set to false; host-power powers the server off"
        asked = replace(state, power_off_asked=state.power_off_asked or now)
        if state.power_off_asked is None:
            asked = asked.say(now, message)
        return (
            Decision()
            .do(SetState(asked), SetOnline(host.key, False))
            .note(REASON_POWER_OFF, message)
            .at(poll)
        )
    if host.powered_on is False:
        if state.power_off_asked is None:
            message = "power-off: already off (status.poweredOn false, spec.online false)"
        else:
            message = "power-off: done (host-power reports status.poweredOn false)"
        return (
            Decision()
            .do(SetState(state.advance(Step.WIPE, now, message)))
            .note(REASON_POWERED_OFF, message)
            .at(now)
        )
    since = state.power_off_asked or state.step_since or now
    deadline = since + dt.timedelta(seconds=settings.power_off_timeout)
    if now >= deadline:
        seen = {True: "on", None: "not reported"}[host.powered_on]
        error = f"; host-power reports: {host.power_error}" if host.power_error else ""
        return _fail(
            state, now,
            f"power-off: not reported off within {settings.power_off_timeout:g}s (status.poweredOn"
            f" {seen}{error}); is metalmend run (host-power) running for this host?",
        )  # fmt: skip
    return Decision().at(min(poll, deadline))


# ---- wipe ---------------------------------------------------------------------------------


def plan(
    drives: Sequence[DriveFacts], preserve: bool, os_drive: str | None
) -> tuple[DriveRecord, ...]:
    """Every drive erased; with ``preserve``, only ``os_drive`` (the others preserved)."""
    records = []
    for drive in drives:
        if not preserve:
            role, erase = None, Erase.PLANNED
        elif drive.id == os_drive:
            role, erase = Role.OS, Erase.PLANNED
        else:
            role, erase = Role.DATA, Erase.PRESERVE
        records.append(DriveRecord(drive.id, drive.name, drive.serial, role, erase))
    return tuple(records)


def _wipe(view: View, now: dt.datetime, settings: DestroySettings) -> Decision:
    state = view.state
    if not state.planned:
        return _plan_wipe(view, now, settings)
    return _erase(view, now, settings)


def _not_wiped(state: NodeState, now: dt.datetime, why: str) -> Decision:
    message = (
        f"wipe: drives NOT wiped: {why}. The host is left powered off, claimed and not"
        " released: wipe its drives by other means before it is used again"
    )
    return Decision().do(SetState(state.fail(now, message))).note(REASON_NOT_WIPED, message, True)


def _plan_wipe(view: View, now: dt.datetime, settings: DestroySettings) -> Decision:
    state = view.state
    if view.cannot_erase:
        return _not_wiped(state, now, f"the BMC cannot erase drives ({view.cannot_erase})")
    if view.drives is None:
        return _bmc_retry(view, now, settings, "reading the drives")
    if not view.drives:
        return _not_wiped(state, now, "the BMC lists no drive, so no erase can be confirmed")
    if view.preserve and view.os_drive is None:
        why = view.os_problem or "no drive matches"
        return _not_wiped(
            state, now,
            f"preserve-local-storage: the OS drive cannot be decided from spec.rootDeviceHints"
            f" ({why}); nothing was erased",
        )  # fmt: skip
    records = plan(view.drives, view.preserve, view.os_drive)
    erase = ", ".join(r.describe() for r in records if r.erase is Erase.PLANNED)
    keep = ", ".join(r.describe() for r in records if r.erase is Erase.PRESERVE)
    message = f"wipe: erasing {erase}" + (f"; preserving {keep}" if keep else "")
    planned = replace(state, planned=True, drives=records).say(now, message)
    return Decision().do(SetState(planned)).note(REASON_WIPE_PLANNED, message).at(now)


def _bmc_retry(view: View, now: dt.datetime, settings: DestroySettings, doing: str) -> Decision:
    state = view.state
    since = state.step_since or now
    deadline = since + dt.timedelta(seconds=settings.bmc_timeout)
    why = view.bmc_error or "no answer"
    if now >= deadline:
        return _not_wiped(state, now, f"the BMC did not answer {doing}: {why}")
    return Decision().at(min(now + dt.timedelta(seconds=settings.bmc_retry), deadline))


def _erase(view: View, now: dt.datetime, settings: DestroySettings) -> Decision:
    state = view.state
    to_start: list[DriveRecord] = []
    updated: list[DriveRecord] = []
    events: list[str] = []
    for record in state.drives:
        record, start, event = _drive_now(record, view, now, settings)
        if start:
            to_start.append(record)
        if event:
            events.append(event)
        updated.append(record)
    new = replace(state, drives=tuple(updated))
    for line in events:
        new = new.say(now, line)
    decision = Decision()
    for line in events:
        decision.note(REASON_DRIVE_ERASED, line)
    if to_start:
        # Facts first: each erase is on record as requested before it is asked for; the
        # next round records it running once the BMC accepted it.
        names = ", ".join(r.describe() for r in to_start)
        decision.do(SetState(new), *(StartErase(state.host, r.id) for r in to_start))
        return decision.note(REASON_ERASE_STARTED, f"Drive.SecureErase of {names}").at(now)
    return decision.then(_after_erase(new, state, now, settings))


def _drive_now(
    record: DriveRecord, view: View, now: dt.datetime, settings: DestroySettings
) -> tuple[DriveRecord, bool, str]:
    """One drive's record now, whether its erase is to be asked for, and what to say."""
    limit = dt.timedelta(seconds=settings.erase_timeout)
    late = record.since is not None and now - record.since >= limit
    seen = view.erases.get(record.id)
    if record.erase is Erase.PLANNED:
        return replace(record, erase=Erase.REQUESTED, since=now), True, ""
    if record.erase is Erase.REQUESTED:
        if record.id in view.accepted:
            return replace(record, erase=Erase.RUNNING, monitor=view.accepted[record.id]), False, ""
        if record.id in view.start_failed:
            return (
                replace(record, erase=Erase.FAILED, detail=view.start_failed[record.id]),
                False,
                "",
            )
        if seen is not None and seen.state is Seen.RUNNING:
            # Asked for before a restart and accepted: waited for, never started twice.
            return replace(record, erase=Erase.RUNNING), False, ""
        if late:
            return (
                replace(record, erase=Erase.FAILED, detail="the BMC never accepted it"),
                False,
                "",
            )
        # Not known to have reached the BMC, and none runs: asked (again).
        return record, seen is not None, ""
    if record.erase is Erase.RUNNING and seen is not None:
        if seen.state is Seen.FAILED:
            return replace(record, erase=Erase.FAILED, detail=seen.detail), False, ""
        if seen.state is Seen.FINISHED:
            erased = replace(record, erase=Erase.ERASED)
            return erased, False, f"wipe: {record.describe()} erased (the BMC reported it finished)"
    if record.erase is Erase.RUNNING and late:
        detail = f"not finished within {settings.erase_timeout:g}s"
        return replace(record, erase=Erase.FAILED, detail=detail), False, ""
    return record, False, ""


def _after_erase(
    new: NodeState, before: NodeState, now: dt.datetime, settings: DestroySettings
) -> Decision:
    drives = new.drives
    open_ = [d for d in drives if d.erase in (Erase.REQUESTED, Erase.RUNNING)]
    failed = [d for d in drives if d.erase is Erase.FAILED]
    if open_:
        decision = Decision()
        if new != before:
            decision.do(SetState(new))
        return decision.at(now + dt.timedelta(seconds=settings.poll_interval))
    erased = ", ".join(d.describe() for d in drives if d.erase is Erase.ERASED) or "none"
    if failed:
        why = "; ".join(f"{d.describe()}: {d.detail}" for d in failed)
        return _not_wiped(new, now, f"{why} (erased: {erased})")
    kept = [d.describe() for d in drives if d.erase is Erase.PRESERVE]
    message = f"wipe: done: erased {erased}" + (f"; preserved {', '.join(kept)}" if kept else "")
    return (
        Decision()
        .do(SetState(new.advance(Step.RELEASE, now, message)))
        .note(REASON_RELEASING, f"{message}; releasing the host")
        .at(now)
    )


# ---- release ------------------------------------------------------------------------------


def _release(view: View, host: HostFacts, now: dt.datetime, settings: DestroySettings) -> Decision:
    state = view.state
    decision = Decision()
    released = host.provisioning_state in RELEASED_STATES
    if host.provisioning_state != DEPROVISIONING and not released:
        decision.do(SetProvisioningState(host.key, DEPROVISIONING))
    if host.consumer or host.image:
        decision.do(ClearConsumer(host.key))
    if host.online:  # turned on again meanwhile: a released host stays off
        decision.do(SetOnline(host.key, False))
    if decision.actions:
        return decision.at(now + dt.timedelta(seconds=settings.poll_interval))
    if host.reboot_keys:
        deadline = (state.step_since or now) + dt.timedelta(seconds=settings.release_timeout)
        if now >= deadline:
            keys = ", ".join(host.reboot_keys)
            return _fail(
                state, now,
                f"release: reboot annotations {keys} still on the host"
                f" {settings.release_timeout:g}s after it was deprovisioned; host-power"
                " (metalmend run) removes them: is it running?",
            )  # fmt: skip
        return decision.at(min(now + dt.timedelta(seconds=settings.poll_interval), deadline))
    if not released:
        decision.do(SetProvisioningState(host.key, AVAILABLE))
    message = (
        f"release: host {host.key} released: provisioning state {AVAILABLE}, consumerRef"
        " cleared, no reboot annotation left, powered off"
    )
    return decision.do(SetState(state.advance(Step.DONE, now, message))).note(
        REASON_RELEASED, message
    )


# ---- the task's result ----------------------------------------------------------------------


class TaskStatus(StrEnum):
    """Drydock's task status."""

    REQUESTED = "requested"
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETE = "complete"


class ResultStatus(StrEnum):
    """Drydock's task result status."""

    INCOMPLETE = "incomplete"
    SUCCESS = "success"
    PARTIAL_SUCCESS = "partial_success"
    FAILURE = "failure"


@dataclass(frozen=True)
class TaskResult:
    status: ResultStatus
    successes: tuple[str, ...]
    failures: tuple[str, ...]
    complete: bool  # every node finished


def task_result(nodes: Mapping[str, NodeState]) -> TaskResult:
    """success: every node destroyed; failure: none; partial_success: some. Incomplete while
    a node is still at work."""
    successes = tuple(sorted(n for n, s in nodes.items() if s.outcome is Outcome.SUCCESS))
    failures = tuple(sorted(n for n, s in nodes.items() if s.outcome is Outcome.FAILURE))
    complete = len(successes) + len(failures) == len(nodes)
    if not complete:
        status = ResultStatus.INCOMPLETE
    elif not failures:
        status = ResultStatus.SUCCESS
    elif not successes:
        status = ResultStatus.FAILURE
    else:
        status = ResultStatus.PARTIAL_SUCCESS
    return TaskResult(status, successes, failures, complete)


# ---- wire helpers -----------------------------------------------------------------------


def _enum(kind: Any, value: Any, default: Any) -> Any:
    try:
        return kind(value)
    except ValueError:
        return default


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _when(value: Any) -> dt.datetime | None:
    try:
        return parse_stamp(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _stamp(value: dt.datetime | None) -> str | None:
    return stamp(value) if value is not None else None


def _drive(wire: Any) -> DriveRecord | None:
    if not isinstance(wire, Mapping) or not _text(wire.get("id")):
        return None
    role = wire.get("role")
    return DriveRecord(
        id=_text(wire.get("id")),
        name=_text(wire.get("name")),
        serial=_text(wire.get("serial")),
        role=_enum(Role, role, None) if role is not None else None,
        erase=_enum(Erase, wire.get("erase"), Erase.PLANNED),
        since=_when(wire.get("since")),
        monitor=_text(wire.get("monitor")),
        detail=_text(wire.get("detail")),
    )


def _message(wire: Any) -> NodeMessage | None:
    if not isinstance(wire, Mapping) or not isinstance(wire.get("message"), str):
        return None
    when = _when(wire.get("ts"))
    if when is None:
        return None
    return NodeMessage(wire["message"], wire.get("error") is True, when)
