"""Decommissioning a Node, decided purely (docs/teardown.md, docs/decide-act.md).

Airship's node teardown spec ("Promenade Decommission Node", airship-specs
``specs/approved/workflow_node-teardown.rst``): drain the Node, clear its labels, remove
its etcd members, wait until the etcd clusters are stable (polled every 30 s, up to
``etcd-ready-timeout``, not counting the Node being torn down), then shut its kubelet down.

- The steps run in that order, each only once the one before succeeded: a kubelet is not
  stopped under pods that did not leave, an etcd member is not removed from a Node still
  serving workloads.
- shutdown-kubelet's failure does not fail the decommission: the spec says it "should not
  hold up the process, as the Drydock dismantling of the node will shut the kubelet down";
  it is reported in the answer (an error entry of a 200).
- Any other step's failure (its 4xx included) is a 500 DisassociateStepFailure with one
  message per step: what succeeded, what failed and why, what was not attempted.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Step(StrEnum):
    DRAIN = "drain"
    CLEAR_LABELS = "clear-labels"
    REMOVE_ETCD = "remove-etcd"
    ETCD_READY = "etcd-ready"
    SHUTDOWN_KUBELET = "shutdown-kubelet"


ORDER = tuple(Step)
# The one step whose failure does not stop or fail a decommission.
MAY_FAIL = frozenset({Step.SHUTDOWN_KUBELET})


@dataclass(frozen=True)
class StepResult:
    step: Step
    ok: bool
    summary: str  # one line: what was done, or why it failed (the step's own reason)


def next_step(done: Sequence[StepResult]) -> Step | None:
    """The step to run now, or None: all ran, or one that must succeed failed."""
    if any(not r.ok and r.step not in MAY_FAIL for r in done):
        return None
    ran = {r.step for r in done}
    return next((step for step in ORDER if step not in ran), None)


@dataclass(frozen=True)
class Verdict:
    code: int
    reason: str
    message: str
    lines: tuple[tuple[str, bool], ...]  # (message, error): one per step


def verdict(node: str, done: Sequence[StepResult]) -> Verdict:
    """The answer once ``next_step`` is None."""
    ran = {r.step for r in done}
    lines = [(f"{r.step}: {r.summary}", not r.ok) for r in done]
    failed = [r for r in done if not r.ok and r.step not in MAY_FAIL]
    if failed:
        first = failed[0].step
        lines += [(f"{s}: not attempted ({first} failed)", False) for s in ORDER if s not in ran]
        return Verdict(
            500,
            "DisassociateStepFailure",
            f"Node {node} was not decommissioned: {first} failed",
            tuple(lines),
        )
    if any(not r.ok for r in done):
        return Verdict(
            200,
            "Success",
            f"Node {node} decommissioned; its kubelet was not seen stopped (dismantling the"
            " server will stop it)",
            tuple(lines),
        )
    return Verdict(200, "Success", f"Node {node} decommissioned", tuple(lines))


# ---- waiting for etcd to be stable -----------------------------------------------------


@dataclass(frozen=True)
class ClusterState:
    """One etcd cluster's health as reported, not counting the Node being torn down."""

    name: str
    healthy: bool
    detail: str


@dataclass(frozen=True)
class EtcdReady:
    stable: bool  # every cluster meets its minimum functionality
    done: bool  # stop waiting: stable, or the deadline passed
    summary: str
    look_again_at: dt.datetime | None = None


def etcd_ready(
    clusters: Sequence[ClusterState], now: dt.datetime, deadline: dt.datetime, poll: float
) -> EtcdReady:
    """Stable once every cluster is healthy; else look again after ``poll`` seconds, the
    last time at the deadline."""
    unstable = [c for c in clusters if not c.healthy]
    if not unstable:
        names = ", ".join(c.name for c in clusters) or "no etcd cluster in the design"
        return EtcdReady(True, True, f"etcd stable: {names}")
    why = "; ".join(f"cluster {c.name}: {c.detail}" for c in unstable)
    if now >= deadline:
        return EtcdReady(False, True, f"etcd not stable by etcd-ready-timeout: {why}")
    return EtcdReady(False, False, why, min(now + dt.timedelta(seconds=poll), deadline))
