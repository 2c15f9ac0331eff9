"""FenceRemediation: the fence-first remediation (policy.remediation) as an object any
health checker can create from a FenceRemediationTemplate, by the external remediation
contract (docs/remediation.md, "As a remediation template"). Pure: what is remediated
(a Machine or a Node), NodeHealthCheck's timed-out annotation, and the ``Processing`` /
``Succeeded`` / ``PermanentNodeDeletionExpected`` conditions health checkers read.

The fencing itself is policy.remediation.decide, unchanged.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from metalmend.api import links, names
from metalmend.policy import remediation
from metalmend.policy.remediation import Decision, Observed, Phase, Settings, Strategy

MACHINE_GROUP = links.MACHINE_GROUP
MACHINE_GROUPS = links.MACHINE_GROUPS  # Cluster API's and OpenShift's Machines

PROCESSING = "Processing"
SUCCEEDED = "Succeeded"
PERMANENT_NODE_DELETION = "PermanentNodeDeletionExpected"
CONDITION_TYPES = (PROCESSING, SUCCEEDED, PERMANENT_NODE_DELETION)


@dataclass(frozen=True)
class Owner:
    kind: str
    api_version: str
    name: str


@dataclass(frozen=True)
class Target:
    """What the object remediates: a Cluster API Machine (Cluster API's MachineHealthCheck
    names the object after it and owns it) or a Node (NodeHealthCheck: named after the Node,
    or ``generateName`` with the node-name annotation)."""

    kind: str  # "Machine" or "Node"
    name: str
    api_version: str = ""  # a Machine's: Cluster API's or OpenShift's group


def target(name: str, annotations: Mapping[str, str], owners: Sequence[Owner]) -> Target:
    for owner in owners:
        if owner.kind == "Machine" and owner.api_version.split("/")[0] in MACHINE_GROUPS:
            return Target("Machine", owner.name, owner.api_version)
    node = annotations.get(names.NHC_NODE_NAME)
    return Target("Node", node if node else name)


def timed_out(annotations: Mapping[str, str]) -> bool:
    """NodeHealthCheck gave up on this remediation (an escalation timeout): stop, release
    everything held, and do nothing more until the object is deleted."""
    return names.NHC_TIMED_OUT in annotations


def decide(
    observed: Observed,
    now: dt.datetime,
    settings: Settings | None = None,
    *,
    stopped: bool = False,
    stopped_at: dt.datetime | None = None,
) -> Decision:
    """policy.remediation.decide, with the timed-out annotation read as a deletion that
    leaves the object in place: the same clean-up (taint off first, host released, labels
    back), the finalizer off at the end, and from then on nothing (no finalizer is added
    back, so nothing starts again)."""
    if stopped and observed.deleting_since is None:
        if not observed.has_finalizer:
            return Decision()
        observed = replace(observed, deleting_since=stopped_at or now)
    return remediation.decide(observed, now, settings or Settings())


def decide_seen(seen: remediation.Seen, now: dt.datetime, settings: Settings) -> Decision:
    """One reconcile of either remediation kind, from its snapshot (pure): the snapshot
    read (``remediation.view``) and decided by policy.remediation.decide; once a
    NodeHealthCheck gave up on it (``timed_out``: it escalated to its next remediation),
    stopped and everything released, as a deletion would (``decide`` here)."""
    observed = remediation.view(seen)
    if not timed_out(seen.annotations):
        return remediation.decide(observed, now, settings)
    return decide(observed, now, settings, stopped=True, stopped_at=seen.created)


def _condition(type_: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def wanted_conditions(
    phase: str | None, strategy: Strategy, message: str, stopped: bool, deleting: bool
) -> list[dict[str, str]]:
    """The three conditions for a remediation in ``phase`` (without transition times)."""
    if stopped:
        text = "the health checker timed out this remediation; host released"
        return [
            _condition(PROCESSING, "False", "TimedOut", text),
            _condition(SUCCEEDED, "False", "TimedOut", text),
            _condition(PERMANENT_NODE_DELETION, "False", "TimedOut", text),
        ]
    deleting_machine = phase == Phase.DELETING_MACHINE
    permanent = _condition(
        PERMANENT_NODE_DELETION,
        "True" if deleting_machine else "False",
        "MachineDeleted" if deleting_machine else (
            "MayDeleteMachine" if strategy == Strategy.ESCALATE else "PowerCycleOnly"
        ),
        "the Machine is deleted so that its owner replaces it" if deleting_machine
        else "the Node is fenced and its server powered back on",
    )  # fmt: skip
    if phase == Phase.WAITING:
        done = "the server was fenced and powered on, and its Node is Ready again"
        return [
            _condition(PROCESSING, "False", "Remediated", done),
            _condition(SUCCEEDED, "True", "Remediated", done),
            permanent,
        ]
    if phase == Phase.FAILED:
        text = message or "the remediation cannot start"
        return [
            _condition(PROCESSING, "False", "CannotRemediate", text),
            _condition(SUCCEEDED, "False", "CannotRemediate", text),
            permanent,
        ]
    if deleting_machine:
        text = "the Machine is deleted so that its owner replaces it"
        return [
            _condition(PROCESSING, "False", "MachineDeleted", text),
            _condition(SUCCEEDED, "True", "MachineDeleted", text),
            permanent,
        ]
    text = message or (f"phase {phase}" if phase else "starting")
    reason = "Releasing" if deleting else "Remediating"
    return [
        _condition(PROCESSING, "False" if deleting else "True", reason, text),
        _condition(SUCCEEDED, "Unknown", reason, text),
        permanent,
    ]


def conditions(
    present: Sequence[Mapping[str, Any]], wanted: Sequence[Mapping[str, str]], now: dt.datetime
) -> list[dict[str, Any]]:
    """``present`` with the wanted conditions set: a condition whose status is unchanged
    keeps its lastTransitionTime; other types are kept. Equal to ``present`` (compare with
    ==) when nothing changed: the caller writes nothing then."""
    by_type = {str(c.get("type")): dict(c) for c in present if isinstance(c, Mapping)}
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for want in wanted:
        old = by_type.get(want["type"])
        same = old is not None and old.get("status") == want["status"]
        since = old.get("lastTransitionTime") if old is not None and same else None
        by_type[want["type"]] = {**want, "lastTransitionTime": since or stamp}
    order = [t for t in CONDITION_TYPES if t in by_type]
    order += sorted(t for t in by_type if t not in CONDITION_TYPES)
    return [by_type[t] for t in order]
