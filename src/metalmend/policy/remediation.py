"""Metal3Remediation: fence first, then power back on (metal3's Metal3Remediation proposal;
docs/design.md, invariants 1 and 2).

``decide(observed, now, settings)`` is pure. It reads one remediation object, its Machine,
host and Node as observed, and returns the actions that move the remediation one step on,
in the order they must run. Every phase first re-asserts what it needs from the host (our
reboot key present while the host must be off, absent otherwise), so a controller killed
between any two actions picks up where it stopped.

Phases (``status.phase``), each with what ends it:

- ``power-off``: our reboot key asks for a hard power-off; waiting until the host is
  reported off *for this request* (policy.fencing: host-power lists our key in
  ``status.poweredOffFor``). -> fencing; a BMC error or powerOffTimeoutSeconds -> a failed
  attempt. The key is (re-)added only once host-power no longer lists it from an earlier
  attempt (``withdrawal_unseen``).
- ``confirming-off`` (fence out-of-service-taint, or beside baremetal-operator): reported
  off; the controller reads the BMC itself (``read_due``) ``confirm_reads`` times over
  ``confirm_window`` seconds, all must say off. -> fencing; a read on -> power-off.
- ``fencing``: the host is off: the Node's labels and annotations are backed up on this
  object, the Node is deleted and its pods deleted. -> power-on. With the taint: the Node
  tainted out-of-service and its pods deleted, our key kept. -> evacuating.
- ``evacuating`` (taint): the host is held off until no pod the taint removes is left on
  the Node and no VolumeAttachment names it (``Evacuation``). -> power-on (the taint is
  removed once the Node is Ready again). Whenever the host is no longer reported off
  before that, the taint is removed first (invariant 12).
- ``power-on``: our key is removed; waiting for the Node to register and be Ready, then
  restoring the backed-up labels and annotations it lacks. -> waiting;
  powerOnTimeoutSeconds -> a failed attempt. (A host with spec.online=false is not powered
  on by remediation: the phase stays, with the reason in ``status.message``.)
- ``waiting``: the Node is back and Ready; waiting for the health check to find it healthy
  and delete this object. Another powerOnTimeoutSeconds -> a failed attempt.
- ``backoff``: an attempt failed (``retryCount`` counts them); the host is released; the
  next attempt starts at ``status.nextAttemptAt``, after growing waits. -> power-off.
- ``deleting-machine``: strategy escalate after deleteAfterRetries failed attempts: the
  Machine is deleted so that its owner replaces it.
- ``failed``: cannot start: no Machine, no host link, no host, a host link or Node the
  tenancy rules refuse (api/links.py) (``status.message`` says). -> power-off once fixed.

Deletion of the object at any moment (the health check deletes it once the Node is healthy)
removes our reboot key (the host is never left off), removes our taint, and restores the
backed-up labels and annotations once the Node is back (waiting for it at most
powerOnTimeoutSeconds); then the finalizer goes.

While a teardown claims the host (``metalmend.dev/teardown``: policy.interlock,
docs/design.md invariant 7), nothing but that clean-up happens: no attempt starts or
fails, no key is added, the Machine is not deleted; ``status.message`` says why. An
attempt that already holds its key finishes first.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from metalmend.api import names
from metalmend.api.stamps import parse_stamp, stamp
from metalmend.policy.decision import Decision as _Decision
from metalmend.policy.decision import Event as Event  # one of this policy's actions
from metalmend.policy.fencing import (
    HostPower,
    host_power,
    other_remediation,
    reported_off,
    withdrawal_unseen,
)
from metalmend.policy.interlock import (
    REASON_HELD_BY_TEARDOWN,
    REASON_STALE_CLAIM,
    Claim,
    claim_stale,
    hold_message,
    teardown_claim,
)


class Phase(StrEnum):
    """``status.phase``: what the remediation is doing (module docstring)."""

    POWER_OFF = "power-off"
    FENCING = "fencing"
    POWER_ON = "power-on"
    WAITING = "waiting"
    BACKOFF = "backoff"
    DELETING_MACHINE = "deleting-machine"
    FAILED = "failed"
    CONFIRMING = "confirming-off"
    EVACUATING = "evacuating"


# The phases by their names, for readability in rules and tests.
POWER_OFF, FENCING, POWER_ON, WAITING = (
    Phase.POWER_OFF,
    Phase.FENCING,
    Phase.POWER_ON,
    Phase.WAITING,
)
BACKOFF, DELETING_MACHINE, FAILED = Phase.BACKOFF, Phase.DELETING_MACHINE, Phase.FAILED
CONFIRMING, EVACUATING = Phase.CONFIRMING, Phase.EVACUATING
PHASES = tuple(Phase)


class Strategy(StrEnum):
    """``spec.strategy`` of metal3's Metal3Remediation."""

    REBOOT = "reboot"
    """Power-cycle, retry after each failed attempt, forever."""

    ESCALATE = "escalate"
    """After ``deleteAfterRetries`` failed attempts, delete the Machine."""


class FenceMethod(StrEnum):
    """How a Node is fenced once its host is off."""

    DELETE_NODE = "delete-node"
    """Delete the Node object: its pods are gone at once, on every Kubernetes version."""

    OUT_OF_SERVICE_TAINT = "out-of-service-taint"
    """Taint the Node ``node.kubernetes.io/out-of-service`` (Kubernetes >= 1.28): the
    Node and its labels stay, and Kubernetes itself detaches volumes and deletes pods."""


class PowerOwner(StrEnum):
    """Who sends the power commands to the hosts' BMCs."""

    AUTO = "auto"
    """``metalmend run`` decides from the served BareMetalHost schema: baremetal-operator's
    own CRD (which has no field for host-power's evidence) means baremetal-operator."""

    METALMEND = "metalmend"
    """metalmend's host-power: evidence is its per-key acknowledgement (policy.fencing)."""

    BAREMETAL_OPERATOR = "baremetal-operator"
    """metal3's baremetal-operator: metalmend only adds its keyed reboot annotation, takes
    BMO's ``status.poweredOn: false`` in the host version carrying that key, and confirms
    with its own read-only BMC reads; it never sends a power command."""


@dataclass(frozen=True)
class Settings:
    """Remediation (both remediation controllers)."""

    fence: FenceMethod = FenceMethod.DELETE_NODE
    """Deleting the Node works on every cluster; the taint needs Kubernetes >= 1.28."""

    power_owner: PowerOwner = PowerOwner.AUTO
    """Decided at start from what the cluster serves, unless set (docs/install.md)."""

    confirm_window: float = 10.0
    """Out-of-service taint only: seconds over which metalmend's own BMC reads must keep
    saying off, after host-power first reported the host off, before the Node is tainted.
    Some BMCs report Off while the host is still stopping; ten seconds covers the ones
    we know of and is small against the minutes a lost Node costs."""

    confirm_reads: int = 3
    """Out-of-service taint only: how many such reads (the first at once, the others
    spread evenly over ``confirm_window``); all must say off."""

    evacuation_poll: float = 5.0
    """Out-of-service taint only: seconds between looks at the tainted Node's pods and
    VolumeAttachments while the host is held off for them to go."""

    retry_base: float = 30.0
    """Seconds before retrying a failed remediation; doubles with every failure. Long
    enough for a BMC or API server hiccup to pass, short against a health check's timeout."""

    retry_cap: float = 1800.0
    """The longest wait between retries: a remediation stuck for hours is still retried
    twice an hour, so a repaired BMC is noticed without anyone's help."""


def _number(value: Any, default: float) -> float:
    """A spec number as the CRD admits it; anything else (a hostile or stale object written
    around the schema) reads as the default rather than failing the reconcile."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value) if math.isfinite(value) else default


@dataclass(frozen=True)
class Spec:
    """``spec`` of a Metal3Remediation, with metal3's defaults."""

    strategy: Strategy = Strategy.REBOOT
    delete_after_retries: int = 3
    power_off_timeout: float = 120.0
    power_on_timeout: float = 600.0

    @classmethod
    def from_wire(cls, spec: Mapping[str, Any]) -> Spec:
        strategy = spec.get("strategy")
        return cls(
            strategy=Strategy(strategy) if strategy in tuple(Strategy) else Strategy.REBOOT,
            delete_after_retries=int(_number(spec.get("deleteAfterRetries"), 3)),
            power_off_timeout=_number(spec.get("powerOffTimeoutSeconds"), 120.0),
            power_on_timeout=_number(spec.get("powerOnTimeoutSeconds"), 600.0),
        )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _stamp_of(value: Any) -> dt.datetime | None:
    try:
        return parse_stamp(value) if isinstance(value, str) else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Progress:
    """``status`` of the object: all the state there is (besides the backup annotations).
    Owns its wire format: ``from_wire`` / ``to_wire``."""

    phase: Phase | None = None  # None: no attempt begun
    retry_count: int = 0
    last_remediated: dt.datetime | None = None
    phase_since: dt.datetime | None = None
    next_attempt_at: dt.datetime | None = None
    node: str | None = None  # the Node this remediation fences (name)
    fenced_node_uid: str | None = None  # the Node object fenced in this attempt
    message: str = ""
    host: str | None = None  # "namespace/name" of the host we put our key on: released
    # even if the Machine that named it is gone
    # Out-of-service taint: our own BMC reads in this confirmation (all said off), since
    # when, and when the last read was taken (off or failed).
    off_reads: int = 0
    off_read_since: dt.datetime | None = None
    last_read_at: dt.datetime | None = None

    @classmethod
    def from_wire(cls, status: Mapping[str, Any]) -> Progress:
        """Read from ``status``; a value of the wrong type reads as absent (never raises)."""
        phase = status.get("phase")
        count = status.get("retryCount")
        return cls(
            phase=Phase(phase) if phase in tuple(Phase) else None,
            retry_count=_count(count),
            last_remediated=_stamp_of(status.get("lastRemediated")),
            phase_since=_stamp_of(status.get("phaseSince")),
            next_attempt_at=_stamp_of(status.get("nextAttemptAt")),
            node=_text(status.get("node")),
            fenced_node_uid=_text(status.get("fencedNodeUID")),
            message=_text(status.get("message")) or "",
            host=_text(status.get("host")),
            off_reads=_count(status.get("offReads")),
            off_read_since=_stamp_of(status.get("offReadSince")),
            last_read_at=_stamp_of(status.get("lastPowerReadAt")),
        )

    def to_wire(self, status: Mapping[str, Any]) -> dict[str, Any]:
        """``status`` with our fields replaced (absent ones removed), others kept."""
        result = dict(status)
        values: dict[str, Any] = {
            "phase": str(self.phase) if self.phase else None,
            "retryCount": self.retry_count,
            "lastRemediated": stamp(self.last_remediated) if self.last_remediated else None,
            "phaseSince": stamp(self.phase_since) if self.phase_since else None,
            "nextAttemptAt": stamp(self.next_attempt_at) if self.next_attempt_at else None,
            "node": self.node,
            "fencedNodeUID": self.fenced_node_uid,
            "message": self.message or None,
            "host": self.host,
            "offReads": self.off_reads or None,
            "offReadSince": stamp(self.off_read_since) if self.off_read_since else None,
            "lastPowerReadAt": stamp(self.last_read_at) if self.last_read_at else None,
        }
        for name, value in values.items():
            if value is None:
                result.pop(name, None)
            else:
                result[name] = value
        return result


@dataclass(frozen=True)
class NodeView:
    name: str
    uid: str
    ready: bool
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    out_of_service: bool  # carries our out-of-service taint
    ready_since: dt.datetime | None = None  # lastTransitionTime of Ready (whole seconds)


@dataclass(frozen=True)
class HostView:
    key: str  # "namespace/name"
    online: bool
    power: HostPower  # holds_key: our key
    other_remediation: str | None  # reboot key of another remediation on this host
    bmc_error: str  # the host's BMC error message, "" when none
    # A teardown's claim on the host (policy.interlock): no attempt starts, and none goes
    # on without our key, while it is there.
    teardown: Claim | None = None
    # The host carries our escalation marker (names.ESCALATING): the Machine may go.
    escalation_marked: bool = False
    # spec.disablePowerOff (baremetal-operator turns a power-off into a reboot)
    disable_power_off: bool = False


@dataclass(frozen=True)
class Backup:
    """The fenced Node's labels and annotations, kept in two annotations of the
    remediation object (so that they survive the Node's deletion and our restart)."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]

    @classmethod
    def from_wire(cls, annotations: Mapping[str, str]) -> Backup | None:
        """None when there is no backup, or it cannot be read (written around us)."""
        if names.NODE_LABELS_BACKUP not in annotations:
            return None
        try:
            labels = json.loads(annotations[names.NODE_LABELS_BACKUP])
            kept = json.loads(annotations.get(names.NODE_ANNOTATIONS_BACKUP) or "{}")
        except ValueError:
            return None
        if not (isinstance(labels, dict) and isinstance(kept, dict)):
            return None
        return cls(
            labels={str(k): str(v) for k, v in labels.items()},
            annotations={str(k): str(v) for k, v in kept.items()},
        )

    def to_wire(self) -> dict[str, str]:
        return {
            names.NODE_LABELS_BACKUP: json.dumps(dict(self.labels), sort_keys=True),
            names.NODE_ANNOTATIONS_BACKUP: json.dumps(dict(self.annotations), sort_keys=True),
        }


@dataclass(frozen=True)
class Observed:
    spec: Spec
    progress: Progress
    has_finalizer: bool
    deleting_since: dt.datetime | None  # metadata.deletionTimestamp
    machine_found: bool
    machine_node: str | None  # Machine.status.nodeRef.name
    host: HostView | None
    host_problem: str  # why ``host`` is None
    node: NodeView | None  # the Node named progress.node (or machine_node)
    backup: Backup | None
    # A link the tenancy rules refuse (api/links.py): a host annotation of another namespace
    # or a Node that is not the host's. With ``host`` set (the host we recorded), whatever we
    # hold on it is released; nothing else is done.
    link_problem: str = ""
    # Out-of-service taint: metalmend's own BMC read, taken for this decision when
    # ``read_due`` said so (None: none taken); the fenced Node's leftovers, looked at in
    # phase evacuating (None: not looked at).
    power_read: PowerRead | None = None
    evacuation: Evacuation | None = None
    awake_since: dt.datetime | None = None  # Seen.awake_since


@dataclass(frozen=True)
class PowerRead:
    """One read of the host's power from its BMC, by the remediation controller itself."""

    off: bool | None  # None: the read failed
    error: str = ""  # why it failed (never a secret: the BMC layer's message)


@dataclass(frozen=True)
class Evacuation:
    """What still ties a tainted Node to its workloads: pods bound to it that the taint
    removes (``blocks_evacuation``), and VolumeAttachments naming it."""

    pods: tuple[str, ...] = ()  # namespace/name
    attachments: tuple[str, ...] = ()

    @property
    def done(self) -> bool:
        return not self.pods and not self.attachments


# ---- the snapshot observe gathers, and how the policy reads it ----------------------------


@dataclass(frozen=True)
class HostWire:
    """A BareMetalHost as cached: what a remediation reads of it, as written."""

    key: str  # "namespace/name"
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    annotations: Mapping[str, str]


def host_view(host: HostWire, reboot_key: str) -> HostView:
    """The host as the rules read it, for the remediation holding ``reboot_key``."""
    spec, status, annotations = host.spec, host.status, host.annotations
    error = status.get("errorMessage") if status.get("operationalStatus") == "error" else ""
    return HostView(
        key=host.key,
        online=bool(spec.get("online", False)),
        power=host_power(status, annotations, reboot_key),
        other_remediation=other_remediation(annotations, reboot_key),
        bmc_error=str(error or ""),
        teardown=teardown_claim(annotations),
        escalation_marked=annotations.get(names.ESCALATING) == reboot_key,
        disable_power_off=spec.get("disablePowerOff") is True,
    )


@dataclass(frozen=True)
class Seen:
    """One reconcile's snapshot of a remediation object, gathered by the controller's
    observe from the caches without reading any of it: the object's spec, status and
    annotations as written, the host it acts on as written, and what observe found of
    its target (the tenancy rules of api/links.py applied). ``view`` reads it."""

    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    annotations: Mapping[str, str]
    has_finalizer: bool
    deleting_since: dt.datetime | None  # metadata.deletionTimestamp
    machine_found: bool  # a Machine, or (node_target) the Node named
    machine_node: str | None  # the Machine's Node (node_target: the Node named)
    host: HostWire | None
    reboot_key: str  # the reboot annotation key this remediation holds its host off with
    host_problem: str  # why ``host`` is None
    node: NodeView | None
    link_problem: str = ""
    created: dt.datetime | None = None  # metadata.creationTimestamp
    # A remediation of a Node without a Machine (the NodeHealthCheck's): its Node gone,
    # and the host not naming it; a link problem unless this remediation fenced it.
    node_target: bool = False
    node_gone_unnamed: str = ""
    power_read: PowerRead | None = None
    evacuation: Evacuation | None = None
    # When this controller first reconciled (it leads, its caches synced): what a phase's
    # timeout is counted from when the phase began before it (``_power_off``).
    awake_since: dt.datetime | None = None


def recorded_node(status: Mapping[str, Any]) -> str | None:
    """The Node a remediation recorded in its status (``status.node``): observe looks it
    up. Anything but a name reads as none."""
    return _text(status.get("node"))


def view(seen: Seen) -> Observed:
    """What the rules read from a snapshot: its spec, status and backup (each
    ``from_wire``: a value of the wrong type reads as absent or the default, never an
    exception), its host's view, and the link problems that depend on them."""
    spec = Spec.from_wire(seen.spec)
    progress = Progress.from_wire(seen.status)
    problem, link_problem = seen.host_problem, seen.link_problem
    if seen.node_target and spec.strategy == Strategy.ESCALATE:
        problem = (
            "strategy escalate deletes the Machine; this remediation of Node"
            f" {seen.machine_node} has none: use strategy reboot"
        )
        link_problem = link_problem or problem
    elif seen.node_target and not problem and not progress.fenced_node_uid:
        link_problem = link_problem or seen.node_gone_unnamed
    host = host_view(seen.host, seen.reboot_key) if seen.host is not None else None
    return Observed(
        spec=spec,
        progress=progress,
        has_finalizer=seen.has_finalizer,
        deleting_since=seen.deleting_since,
        machine_found=seen.machine_found,
        machine_node=seen.machine_node,
        host=host,
        host_problem=problem,
        node=seen.node,
        backup=Backup.from_wire(seen.annotations),
        link_problem=link_problem if host is not None else "",
        power_read=seen.power_read,
        evacuation=seen.evacuation,
        awake_since=seen.awake_since,
    )


def reads_power(seen: Seen, now: dt.datetime, settings: Settings) -> bool:
    """``read_due`` of the snapshot's status: observe reads the host's BMC itself."""
    return read_due(Progress.from_wire(seen.status), now, settings)


def lists_evacuation(seen: Seen, settings: Settings) -> str | None:
    """The fenced Node whose leftovers observe lists (``evacuation_due``), or None."""
    progress = Progress.from_wire(seen.status)
    return progress.node if progress.node and evacuation_due(progress, settings) else None


def tolerates_out_of_service(tolerations: Any) -> bool:
    """Whether a pod's tolerations let it stay on a Node tainted
    ``node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`` (Kubernetes' matching:
    an empty key with Exists matches every taint; an empty effect matches every effect)."""
    for t in tolerations or ():
        key, operator = t.get("key") or "", t.get("operator") or "Equal"
        effect, value = t.get("effect") or "", t.get("value") or ""
        if effect not in ("", "NoExecute"):
            continue
        if key == "" and operator == "Exists":
            return True
        if key != names.OUT_OF_SERVICE_TAINT:
            continue
        if operator == "Exists" or value == OUT_OF_SERVICE_VALUE:
            return True
    return False


OUT_OF_SERVICE_VALUE = "nodeshutdown"


def blocks_evacuation(deleting: bool, tolerations: Any) -> bool:
    """A pod bound to the tainted Node keeps the host off while it exists, unless it
    tolerates the taint and is not being deleted (a DaemonSet's pod that tolerates every
    taint stays for good: waiting for it would hold the host off forever)."""
    return deleting or not tolerates_out_of_service(tolerations)


# ---- actions, executed in order by controllers.remediation ----------------------------------


@dataclass(frozen=True)
class AddFinalizer:
    pass


@dataclass(frozen=True)
class RemoveFinalizer:
    pass


@dataclass(frozen=True)
class RequestPowerOff:
    """Add our reboot key ({"mode":"hard"}) to the host, only if the host is unchanged
    since observed (so two remediations cannot both start on one host)."""


@dataclass(frozen=True)
class ReleasePower:
    """Remove our reboot key: the host controller powers the host on (if spec.online)."""


@dataclass(frozen=True)
class BackupNode:
    """Keep the Node's labels and annotations on our object (versioned: written once)."""

    backup: Backup


@dataclass(frozen=True)
class DeleteNode:
    name: str
    uid: str  # precondition: never delete a Node that registered since we looked


@dataclass(frozen=True)
class TaintNode:
    name: str


@dataclass(frozen=True)
class UntaintNode:
    name: str


@dataclass(frozen=True)
class DeletePods:
    node: str  # pods bound to this (fenced) Node: the host is off, they are not running


@dataclass(frozen=True)
class RestoreNode:
    name: str
    labels: Mapping[str, str]  # only keys the Node lacks
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class DeleteMachine:
    pass


@dataclass(frozen=True)
class MarkEscalation:
    """Put our escalation marker (names.ESCALATING) on the host, only if the host is
    unchanged since observed: a teardown claiming the host meanwhile (invariant 7) makes
    this write fail, and the Machine is not deleted."""


@dataclass(frozen=True)
class ClearEscalation:
    """Remove our escalation marker from the host (only ours)."""


@dataclass(frozen=True)
class SetProgress:
    progress: Progress


Action = (
    AddFinalizer | RemoveFinalizer | RequestPowerOff | ReleasePower | BackupNode | DeleteNode
    | TaintNode | UntaintNode | DeletePods | RestoreNode | DeleteMachine | MarkEscalation
    | ClearEscalation | SetProgress | Event
)  # fmt: skip
Decision = _Decision[Action]


def _seconds(value: float) -> dt.timedelta:
    return dt.timedelta(seconds=value)


def retry_wait(retry_count: int, settings: Settings) -> float:
    """Growing intervals between attempts: base, 2x base, 4x base ... capped."""
    return float(min(settings.retry_cap, settings.retry_base * 2 ** max(retry_count - 1, 0)))


def _taint(settings: Settings) -> bool:
    return settings.fence == FenceMethod.OUT_OF_SERVICE_TAINT


def _bmo(settings: Settings) -> bool:
    return settings.power_owner == PowerOwner.BAREMETAL_OPERATOR


def _confirms(settings: Settings) -> bool:
    """Whether our own BMC reads must agree before fencing: for the taint, and wherever
    another controller (baremetal-operator) owns power."""
    return _taint(settings) or _bmo(settings)


def _reported_off(host: HostView, settings: Settings) -> bool:
    """The power owner's word that the host is off for our request. Beside
    baremetal-operator: ``status.poweredOn`` false in the very host version that carries
    our key (BMO keeps no per-request acknowledgement and no timestamp; the confirming
    reads make up for what that value cannot say)."""
    if _bmo(settings):
        power = host.power
        return power.holds_key and power.powered_on is False
    return reported_off(host.power)


def read_interval(settings: Settings) -> float:
    """Seconds between the confirmation reads: ``confirm_reads`` spread over the window."""
    return settings.confirm_window / max(settings.confirm_reads - 1, 1)


def read_due(progress: Progress, now: dt.datetime, settings: Settings) -> bool:
    """Whether the controller reads the host's BMC itself before this decision (phase
    confirming-off, the first read at once, the next one ``read_interval`` later)."""
    if not _confirms(settings) or progress.phase != CONFIRMING:
        return False
    last = progress.last_read_at
    return last is None or now >= last + _seconds(read_interval(settings))


def evacuation_due(progress: Progress, settings: Settings) -> bool:
    """Whether the controller looks at the fenced Node's pods and VolumeAttachments."""
    return _taint(settings) and progress.phase == EVACUATING


# ---- decide ----------------------------------------------------------------------------------


def decide(observed: Observed, now: dt.datetime, settings: Settings = Settings()) -> Decision:
    if observed.deleting_since is not None:
        return _release(observed, now, settings)
    if not observed.has_finalizer:
        # First of all: from now on, deleting this object cannot skip the clean-up.
        return Decision().do(AddFinalizer())
    progress = observed.progress
    if not observed.machine_found and progress.phase == DELETING_MACHINE:
        return Decision()  # done: the garbage collector deletes this object with its Machine
    if observed.link_problem:
        return _fail_to_start(observed, observed.link_problem)
    if not observed.machine_found or observed.host is None:
        problem = observed.host_problem or "the Machine does not exist"
        return _fail_to_start(observed, problem)
    if observed.host.teardown is not None and not observed.host.power.holds_key:
        return _held_by_teardown(observed, observed.host, observed.host.teardown)
    if _bmo(settings) and observed.host.disable_power_off and progress.phase != DELETING_MACHINE:
        return _fail_to_start(observed, DISABLE_POWER_OFF.format(host=observed.host.key))
    handler = _HANDLERS.get(progress.phase, _start) if progress.phase else _start
    return handler(observed, observed.host, now, settings)


def _held_by_teardown(observed: Observed, host: HostView, claim: Claim) -> Decision:
    """A teardown claims the host (docs/design.md, invariant 7): nothing is started, no
    key added, no deadline runs (an attempt does not fail, nor escalate to deleting the
    Machine, while it waits); the claim's removal, a host change, wakes us. Holding our
    key, we carry on instead: we took the host first, and stopping now would leave it off."""
    node = observed.node
    stale = claim_stale(claim, node.name if node else None, node.uid if node else None)
    message = hold_message(host.key, claim, stale)
    progress = observed.progress
    decision = Decision()
    if progress.message != message:
        decision.do(SetProgress(replace(progress, message=message)))
        reason = REASON_STALE_CLAIM if stale else REASON_HELD_BY_TEARDOWN
        decision.note(reason, message, warning=stale)
    return decision


DISABLE_POWER_OFF = (
    "host {host} has spec.disablePowerOff: baremetal-operator would reboot it instead of"
    " powering it off, so it cannot be fenced; remediate it another way, or clear"
    " disablePowerOff"
)


def _fail_to_start(observed: Observed, problem: str) -> Decision:
    decision = Decision()
    node = observed.node
    if node is not None and node.out_of_service and observed.progress.phase in (
        POWER_OFF, CONFIRMING, FENCING, EVACUATING,
    ):  # fmt: skip
        decision.do(UntaintNode(node.name))  # before the host is released
    if observed.host is not None and observed.host.power.holds_key:
        decision.do(ReleasePower())
    progress = observed.progress
    if progress.phase != FAILED or progress.message != problem:
        decision.do(SetProgress(replace(progress, phase=FAILED, message=problem)))
        decision.note(names.REASON_CANNOT_REMEDIATE, problem, warning=True)
    return decision


def _start(observed: Observed, host: HostView, now: dt.datetime, settings: Settings) -> Decision:
    """Begin an attempt (a new object, or after backoff, or once a problem is fixed)."""
    progress = observed.progress
    if observed.spec.strategy == Strategy.ESCALATE and (
        progress.retry_count >= observed.spec.delete_after_retries
    ):
        return _escalate(host, progress, now, "no attempts left")
    if host.other_remediation is not None or withdrawal_unseen(host.power):
        if host.other_remediation is not None:
            message = f"host {host.key} is being remediated by {host.other_remediation}; waiting"
        else:
            message = f"waiting for host-power to see our earlier request on {host.key} withdrawn"
        decision = Decision()
        if progress.message != message:
            decision.do(SetProgress(replace(progress, message=message)))
            decision.note(names.REASON_WAITING_FOR_HOST, message)
        return decision
    node = observed.machine_node or progress.node
    attempt = progress.retry_count + 1
    message = f"attempt {attempt}: hard power-off of {host.key} requested"
    started = replace(
        progress,
        phase=POWER_OFF,
        phase_since=now,
        next_attempt_at=None,
        node=node,
        host=host.key,
        # Kept from an earlier attempt: that Node object is gone, so it cannot be the one
        # that comes back, and deletion must still wait for a successor to restore labels.
        fenced_node_uid=progress.fenced_node_uid,
        message=message,
    )
    decision = Decision().do(SetProgress(started), RequestPowerOff())
    decision.note(names.REASON_POWER_OFF_REQUESTED, message)
    return decision.at(now + _seconds(observed.spec.power_off_timeout))


def _power_off(
    observed: Observed, host: HostView, now: dt.datetime, settings: Settings
) -> Decision:
    progress = observed.progress
    decision = Decision()
    if not host.power.holds_key:
        if host.other_remediation is not None:  # raced with another remediation: yield
            return decision.do(SetProgress(replace(progress, phase=None, message="")))
        _request_power_off(host, decision)
    _untaint_unless_off(observed, host, decision, settings)
    if _reported_off(host, settings) and _confirms(settings):
        message = (
            f"{host.key} reported off; confirming with {settings.confirm_reads} BMC reads"
            f" over {settings.confirm_window:g}s before the taint"
        )
        confirming = replace(
            progress, phase=CONFIRMING, phase_since=now, message=message,
            off_reads=0, off_read_since=None, last_read_at=None,
        )  # fmt: skip
        decision.do(SetProgress(confirming))
        return decision.note(names.REASON_HOST_POWERED_OFF, message).at(now)
    if _reported_off(host, settings):
        message = f"{host.key} reported off; fencing Node {progress.node or '(none)'}"
        decision.do(SetProgress(replace(progress, phase=FENCING, phase_since=now, message=message)))
        return decision.note(names.REASON_HOST_POWERED_OFF, message)
    # The timeout measures the BMC and host-power, not this controller's absence: a phase
    # begun before it started watching counts from its start. Else a restart that came
    # after the deadline (down, or slow to start on a loaded machine) would fail the
    # attempt at its first look and release a host that may be off by now, only to power
    # it off again: a second power cycle (as ``_confirming``'s failed reads).
    start = progress.phase_since or now
    if observed.awake_since is not None and observed.awake_since > start:
        start = observed.awake_since
    deadline = start + _seconds(observed.spec.power_off_timeout)
    if host.bmc_error:
        return _attempt_failed(observed, now, settings, f"BMC error: {host.bmc_error}")
    if now >= deadline:
        why = f"{host.key} not reported off within {observed.spec.power_off_timeout:g}s"
        return _attempt_failed(observed, now, settings, why)
    return decision.at(deadline)


def _request_power_off(host: HostView, decision: Decision) -> None:
    """Put our key (back) on the host, unless host-power still lists it as powered off
    for: that acknowledgement was for our key's earlier presence, and would count for this
    request at once (policy.fencing.withdrawal_unseen). Host-power drops it at its next
    reconcile; its status write wakes us."""
    if not withdrawal_unseen(host.power):
        decision.do(RequestPowerOff())


def _untaint_unless_off(
    observed: Observed, host: HostView, decision: Decision, settings: Settings
) -> None:
    """The taint is never on a Node whose host is not reported off for our request (until
    the Node's workloads are gone: then the host may power on under it). In the phases
    before that, a taint found on a host no longer reported off is taken away at once."""
    node = observed.node
    if node is not None and node.out_of_service and not _reported_off(host, settings):
        decision.do(UntaintNode(node.name))


def _power_off_again(
    observed: Observed,
    host: HostView,
    now: dt.datetime,
    settings: Settings,
    why: str,
    warning: bool = False,
) -> Decision:
    """Our key went missing or the host is on again: never fence on an old report."""
    progress = observed.progress
    message = f"{host.key} {why}; asking for power-off again"
    decision = Decision()
    _untaint_unless_off(observed, host, decision, settings)
    again = replace(
        progress, phase=POWER_OFF, phase_since=now, message=message,
        off_reads=0, off_read_since=None, last_read_at=None,
    )  # fmt: skip
    decision.do(SetProgress(again))
    _request_power_off(host, decision)
    return decision.note(names.REASON_POWER_OFF_REQUESTED, message, warning=warning).at(
        now + _seconds(observed.spec.power_off_timeout)
    )


def _confirming(
    observed: Observed, host: HostView, now: dt.datetime, settings: Settings
) -> Decision:
    """Reported off: our own BMC reads must say off too, ``confirm_reads`` times over
    ``confirm_window`` seconds, before the taint (some BMCs say Off before the host has
    stopped). A read that says on starts the power-off over; a failed read is not counted,
    and the attempt fails once powerOffTimeoutSeconds have passed on top of the window.
    Those seconds are time spent reading: a failed read after none for longer than
    powerOffTimeoutSeconds (the controller was down, or restarting on a loaded machine)
    counts them from itself, rather than fail the attempt at its first read and release a
    host that is off only to power it off again (a second power cycle)."""
    progress = observed.progress
    if not _reported_off(host, settings):
        return _power_off_again(observed, host, now, settings, "no longer reported off")
    decision = Decision()
    _untaint_unless_off(observed, host, decision, settings)
    interval = _seconds(read_interval(settings))
    deadline = (progress.phase_since or now) + _seconds(
        observed.spec.power_off_timeout + settings.confirm_window
    )
    read = observed.power_read
    if read is None:
        if now >= deadline:
            why = f"{host.key} not confirmed off within {observed.spec.power_off_timeout:g}s"
            return _attempt_failed(observed, now, settings, why, decision)
        due = progress.last_read_at + interval if progress.last_read_at else now
        return decision.at(min(due, deadline))
    if read.off is False:
        return _power_off_again(
            observed,
            host,
            now,
            settings,
            "read on from its BMC after it was reported off",
            warning=True,
        )
    if read.off is None:
        message = f"reading {host.key}'s BMC failed: {read.error}; reading again"
        previous = progress.last_read_at or progress.phase_since or now
        if (now - previous).total_seconds() > observed.spec.power_off_timeout:
            resumed = replace(progress, phase_since=now, last_read_at=now, message=message)
            return decision.do(SetProgress(resumed)).at(now + interval)
        decision.do(SetProgress(replace(progress, last_read_at=now, message=message)))
        if now >= deadline:
            why = f"{host.key} not confirmed off: BMC read failed: {read.error}"
            return _attempt_failed(observed, now, settings, why, decision)
        return decision.at(now + interval)
    since = progress.off_read_since or now
    reads = progress.off_reads + 1
    held = (now - since).total_seconds()
    if reads >= settings.confirm_reads and held >= settings.confirm_window:
        message = f"{host.key} confirmed off: {reads} BMC reads over {held:g}s"
        confirmed = replace(
            progress, phase=FENCING, phase_since=now, message=message,
            off_reads=reads, off_read_since=since, last_read_at=now,
        )  # fmt: skip
        decision.do(SetProgress(confirmed))
        return decision.note(names.REASON_HOST_CONFIRMED_OFF, message).at(now)
    message = f"{host.key} read off {reads} time(s) over {held:g}s; confirming"
    decision.do(
        SetProgress(
            replace(
                progress, off_reads=reads, off_read_since=since, last_read_at=now,
                message=message,
            )
        )
    )  # fmt: skip
    return decision.at(now + interval)


def _fencing(observed: Observed, host: HostView, now: dt.datetime, settings: Settings) -> Decision:
    progress = observed.progress
    if not _reported_off(host, settings):
        return _power_off_again(observed, host, now, settings, "no longer reported off")
    if _taint(settings):
        return _fence_by_taint(observed, host, now, settings)
    if _bmo(settings) and progress.off_reads < settings.confirm_reads:
        return _unconfirmed(progress, host, now)
    decision = Decision()
    node = observed.node
    fenced_uid = progress.fenced_node_uid
    if node is not None:
        if progress.fenced_node_uid != node.uid:
            fenced_uid = node.uid
            decision.do(SetProgress(replace(progress, fenced_node_uid=node.uid)))
        if observed.backup is None:
            decision.do(BackupNode(Backup(dict(node.labels), dict(node.annotations))))
        decision.do(DeleteNode(node.name, node.uid))
    if progress.node:
        decision.do(DeletePods(progress.node))
    fenced = f"Node {progress.node} deleted" if progress.node else "no Node to fence"
    message = f"{fenced}; power-on of {host.key} requested"
    decision.note(names.REASON_NODE_FENCED, fenced)
    decision.do(
        SetProgress(
            replace(
                progress,
                phase=POWER_ON,
                phase_since=now,
                fenced_node_uid=fenced_uid,
                message=message,
            )
        ),
        ReleasePower(),
    )
    decision.note(names.REASON_POWER_ON_REQUESTED, message)
    return decision.at(now + _seconds(observed.spec.power_on_timeout))


def _fence_by_taint(
    observed: Observed, host: HostView, now: dt.datetime, settings: Settings
) -> Decision:
    """Confirmed off: taint the Node, keep the host off, wait for its workloads to go."""
    progress = observed.progress
    if progress.off_reads < settings.confirm_reads:  # never taint on less (a stale phase)
        return _unconfirmed(progress, host, now)
    decision = Decision()
    node = observed.node
    fenced_uid = progress.fenced_node_uid
    if node is not None and not node.out_of_service:
        fenced_uid = node.uid
        if progress.fenced_node_uid != node.uid:
            decision.do(SetProgress(replace(progress, fenced_node_uid=node.uid)))
        decision.do(TaintNode(node.name))
    if progress.node:
        # Confirmed off: its pods are not running. Deleted at once, as for a deleted Node,
        # rather than after the pod garbage collector's next pass (every 20 s); Kubernetes
        # then detaches their volumes at once (the taint).
        decision.do(DeletePods(progress.node))
    fenced = f"Node {progress.node} tainted out-of-service" if progress.node else "no Node"
    message = f"{fenced}; {host.key} held off until its pods are gone and volumes detached"
    decision.note(names.REASON_NODE_FENCED, fenced)
    evacuating = replace(
        progress, phase=EVACUATING, phase_since=now, fenced_node_uid=fenced_uid, message=message
    )
    return decision.do(SetProgress(evacuating)).at(now)


def _unconfirmed(progress: Progress, host: HostView, now: dt.datetime) -> Decision:
    """Phase fencing without the confirmation on record (a status written around us):
    confirm first."""
    message = f"{host.key} reported off; confirming before fencing"
    unconfirmed = replace(
        progress, phase=CONFIRMING, phase_since=now, message=message,
        off_reads=0, off_read_since=None, last_read_at=None,
    )  # fmt: skip
    return Decision().do(SetProgress(unconfirmed)).at(now)


def _evacuating(
    observed: Observed, host: HostView, now: dt.datetime, settings: Settings
) -> Decision:
    """Tainted and held off: power on only once no pod the taint removes is left on the
    Node and no VolumeAttachment names it (Kubernetes' non-graceful node shutdown). No
    deadline: the host stays off rather than come back under workloads that moved; the
    health check's own timeout decides (deleting this object releases it)."""
    progress = observed.progress
    if not _reported_off(host, settings):
        why = "no longer reported off while its Node is tainted"
        return _power_off_again(observed, host, now, settings, why, warning=True)
    decision = Decision()
    node = observed.node
    if progress.off_reads < settings.confirm_reads:  # a status written around us
        if node is not None and node.out_of_service:
            decision.do(UntaintNode(node.name))
        return decision.then(_fence_by_taint(observed, host, now, settings))
    if node is not None and not node.out_of_service:
        decision.do(TaintNode(node.name))  # removed by someone else: the rule still holds
    left = observed.evacuation if progress.node else Evacuation()
    poll = now + _seconds(settings.evacuation_poll)
    if left is None:  # not looked at for this decision
        return decision.at(poll)
    if not left.done:
        what = ", ".join([*left.pods[:3], *left.attachments[:3]])
        message = (
            f"{host.key} held off: {len(left.pods)} pod(s) and {len(left.attachments)}"
            f" VolumeAttachment(s) still on Node {progress.node} ({what})"
        )
        if progress.message != message:
            decision.do(SetProgress(replace(progress, message=message)))
        return decision.at(poll)
    message = f"Node {progress.node or '(none)'} evacuated; power-on of {host.key} requested"
    decision.do(
        SetProgress(replace(progress, phase=POWER_ON, phase_since=now, message=message)),
        ReleasePower(),
    )
    decision.note(names.REASON_POWER_ON_REQUESTED, message)
    return decision.at(now + _seconds(observed.spec.power_on_timeout))


def _power_on(observed: Observed, host: HostView, now: dt.datetime, settings: Settings) -> Decision:
    progress = observed.progress
    decision = Decision()
    if host.power.holds_key:
        decision.do(ReleasePower())
    node = observed.node
    if node is not None and _is_back(node, progress, settings):
        return _node_back(observed, node, now, settings, decision)
    if not host.online:
        # Remediation never overrides the owner's spec.online: report and wait, no deadline.
        message = f"{host.key} has spec.online=false: remediation will not power it on"
        if progress.message != message:
            decision.do(SetProgress(replace(progress, message=message)))
            decision.note(names.REASON_HOST_HELD_OFF, message, warning=True)
        return decision
    deadline = (progress.phase_since or now) + _seconds(observed.spec.power_on_timeout)
    if now >= deadline:
        name = progress.node or "its Node"
        why = f"{name} not back and Ready within {observed.spec.power_on_timeout:g}s"
        return _attempt_failed(observed, now, settings, why, decision)
    return decision.at(deadline)


def _is_back(node: NodeView, progress: Progress, settings: Settings) -> bool:
    if not node.ready:
        return False
    if settings.fence == FenceMethod.DELETE_NODE:  # a new registration, not the Node we deleted
        return node.uid != progress.fenced_node_uid
    # Tainted, not deleted: the same Node object, which must have turned Ready after the
    # power-on began. Condition times have whole seconds, so a transition in the very second
    # the power-on began is ambiguous and not taken (no host boots that fast). A power
    # cycle shorter than the node-monitor grace period never shows NotReady: that attempt
    # times out.
    began = progress.phase_since
    return bool(node.ready_since and began and node.ready_since > began.replace(microsecond=0))


def _old_uid(progress: Progress, settings: Settings) -> str | None:
    """The Node object we deleted cannot be the one that comes back (a tainted one can)."""
    return progress.fenced_node_uid if settings.fence == FenceMethod.DELETE_NODE else None


def _node_back(
    observed: Observed, node: NodeView, now: dt.datetime, settings: Settings, decision: Decision
) -> Decision:
    progress = observed.progress
    backup = observed.backup
    if backup is not None:
        labels = {k: v for k, v in backup.labels.items() if k not in node.labels}
        annotations = {k: v for k, v in backup.annotations.items() if k not in node.annotations}
        if labels or annotations:
            decision.do(RestoreNode(node.name, labels, annotations))
            restored = ", ".join(sorted([*labels, *annotations]))
            decision.note(names.REASON_NODE_RESTORED, f"restored on {node.name}: {restored}")
    if node.out_of_service:
        decision.do(UntaintNode(node.name))
    message = f"Node {node.name} is back and Ready; waiting for the health check"
    decision.do(
        SetProgress(
            replace(
                progress,
                phase=WAITING,
                phase_since=now,
                last_remediated=now,
                message=message,
            )
        )
    )
    decision.note(names.REASON_NODE_BACK, message)
    return decision.at(now + _seconds(observed.spec.power_on_timeout))


def _waiting(observed: Observed, host: HostView, now: dt.datetime, settings: Settings) -> Decision:
    progress = observed.progress
    decision = Decision()
    if host.power.holds_key:
        decision.do(ReleasePower())
    deadline = (progress.phase_since or now) + _seconds(observed.spec.power_on_timeout)
    if now >= deadline:
        why = f"still unhealthy {observed.spec.power_on_timeout:g}s after the Node came back"
        return _attempt_failed(observed, now, settings, why, decision)
    return decision.at(deadline)


def _backoff(observed: Observed, host: HostView, now: dt.datetime, settings: Settings) -> Decision:
    progress = observed.progress
    decision = Decision()
    if host.power.holds_key:
        decision.do(ReleasePower())
    if progress.next_attempt_at is not None and now < progress.next_attempt_at:
        return decision.at(progress.next_attempt_at)
    return decision.then(_start(observed, host, now, settings))


def _deleting_machine(
    observed: Observed, host: HostView, now: dt.datetime, settings: Settings
) -> Decision:
    return _delete_machine(host, Decision())


def _delete_machine(host: HostView, decision: Decision) -> Decision:
    """Delete the Machine once our marker is on the host (invariant 7): the marker is
    written conditionally on the host as observed, and this decision's deletion follows
    it; a teardown claim that lands first makes the marker's write fail (the next decision
    sees the claim and holds), one that comes later is refused by the marker."""
    if not host.escalation_marked:
        decision.do(MarkEscalation())
    if host.power.holds_key:
        decision.do(ReleasePower())
    return decision.do(DeleteMachine())


def _attempt_failed(
    observed: Observed,
    now: dt.datetime,
    settings: Settings,
    why: str,
    decision: Decision | None = None,
) -> Decision:
    """A failed attempt counts a retry; the host is released (never left off) and either
    the next attempt waits its turn or, for escalate, the Machine goes."""
    decision = decision or Decision()
    node = observed.node
    if (
        node is not None
        and node.out_of_service
        and observed.progress.phase in (POWER_OFF, CONFIRMING, FENCING, EVACUATING)
        and UntaintNode(node.name) not in decision.actions
    ):
        decision.do(UntaintNode(node.name))  # before the host is released
    progress = replace(observed.progress, retry_count=observed.progress.retry_count + 1)
    spec = observed.spec
    if spec.strategy == Strategy.ESCALATE and progress.retry_count >= spec.delete_after_retries:
        assert observed.host is not None  # decide() passes only attempts with a host
        # Fresh: a release decided before would change the host the marker is written on.
        return _escalate(observed.host, progress, now, why)
    wait = retry_wait(progress.retry_count, settings)
    next_at = now + _seconds(wait)
    message = f"attempt {progress.retry_count} failed: {why}; next attempt in {wait:g}s"
    decision.do(
        SetProgress(
            replace(
                progress, phase=BACKOFF, phase_since=now, next_attempt_at=next_at, message=message
            )
        ),
        ReleasePower(),
    )
    return decision.note(names.REASON_ATTEMPT_FAILED, message, warning=True).at(next_at)


def _escalate(host: HostView, progress: Progress, now: dt.datetime, why: str) -> Decision:
    message = (
        f"{why}; {progress.retry_count} failed attempt(s): deleting the Machine so that"
        " its owner replaces it"
    )
    decision = Decision().do(
        SetProgress(
            replace(
                progress, phase=DELETING_MACHINE, phase_since=now, message=message, host=host.key
            )
        )
    )
    decision.note(names.REASON_DELETING_MACHINE, message, warning=True)
    return _delete_machine(host, decision)


def _release(observed: Observed, now: dt.datetime, settings: Settings) -> Decision:
    """The object is being deleted: power back, taint off, labels back, finalizer off."""
    decision = Decision()
    if not observed.has_finalizer:
        return decision
    host = observed.host
    node = observed.node
    if node is not None and node.out_of_service:
        decision.do(UntaintNode(node.name))  # first: never on a host that may power on
    if host is not None and host.power.holds_key:
        decision.do(ReleasePower())
    if host is not None and host.escalation_marked:
        decision.do(ClearEscalation())
    progress = observed.progress
    backup = observed.backup
    fenced_uid = _old_uid(progress, settings)
    node_back = node is not None and node.uid != fenced_uid
    if backup is not None and observed.machine_found and node is not None and node_back:
        labels = {k: v for k, v in backup.labels.items() if k not in node.labels}
        annotations = {k: v for k, v in backup.annotations.items() if k not in node.annotations}
        if labels or annotations:
            decision.do(RestoreNode(node.name, labels, annotations))
    elif backup is not None and observed.machine_found and progress.fenced_node_uid:
        # We deleted the Node; wait (bounded) for it to register again to give back
        # what we took, unless nobody is going to power the host on.
        deadline = (observed.deleting_since or now) + _seconds(observed.spec.power_on_timeout)
        if host is not None and host.online and now < deadline:
            return decision.at(deadline)
        lost = ", ".join(sorted([*backup.labels, *backup.annotations]))
        message = f"Node {progress.node} did not come back; not restored: {lost}"
        decision.note(names.REASON_BACKUP_LOST, message, warning=True)
    decision.do(RemoveFinalizer())
    return decision.note(names.REASON_RELEASED, "remediation removed; host released")


_HANDLERS = {
    Phase.POWER_OFF: _power_off,
    Phase.CONFIRMING: _confirming,
    Phase.FENCING: _fencing,
    Phase.EVACUATING: _evacuating,
    Phase.POWER_ON: _power_on,
    Phase.WAITING: _waiting,
    Phase.BACKOFF: _backoff,
    Phase.DELETING_MACHINE: _deleting_machine,
}
