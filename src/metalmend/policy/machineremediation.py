"""The annotation-driven machine remediation of metal3's "Annotation for Power Cycling and
Deleting Failed Nodes" design (metal3-docs, cluster-api-provider-baremetal's
remediation-annotation design), as one pure decision (docs/decide-act.md).

A Machine asks for remediation with the annotation ``host.metal3.io/external-remediation``;
its host (found through ``metal3.io/BareMetalHost``) is power-cycled with the reboot key
``reboot.metal3.io/machine-remediation``. No other state exists: after a crash, the
annotations alone say where the remediation is, so the table below resumes it.

The design's truth table, row for row. "node ref" is whether the Node that the Machine's
``status.nodeRef`` names is *found* (in the cache, and the host's own Node by the tenancy
rules of api/links.py), not whether nodeRef is set: where Cluster API owns nodeRef it never
clears it, so a Node this flow deleted is still named there, and reading the column as "set"
would delete that gone Node forever, with the host held off. "powered on" is the host as the
host controller reports it; see ``powered_on`` for what "off" has to mean before a Node is
deleted.

| node ref | needs remediation | powered on | reboot key | action                     |
|:-:|:-:|:-:|:-:|---|
| 0 | 1 | 1 | 0 | add reboot annotation                                       |
| 1 | 1 | 1 | 0 | add reboot annotation                                       |
| 1 | 1 | 0 | 1 | delete node                                                 |
| 0 | 0 | 1 | 0 | nothing                                                     |
| 0 | 0 | 1 | 1 | nothing                                                     |
| 0 | 1 | 0 | 0 | nothing                                                     |
| 0 | 1 | 1 | 1 | nothing                                                     |
| 1 | 0 | 0 | 0 | nothing                                                     |
| 1 | 0 | 1 | 0 | nothing                                                     |
| 1 | 0 | 1 | 1 | nothing                                                     |
| 1 | 1 | 0 | 0 | nothing                                                     |
| 1 | 1 | 1 | 1 | nothing                                                     |
| 0 | 1 | 0 | 1 | remove needs-remediation annotation                         |
| 0 | 0 | 0 | 1 | remove reboot annotation                                    |
| 1 | 0 | 0 | 1 | remove reboot annotation                                    |
| 0 | 0 | 0 | 0 | nothing (the row the design omits)                          |

Around the table, metalmend's own safety rules (docs/remediation.md): the reboot key is
added only when no other remediation holds the host, no teardown claims it
(policy.interlock, docs/design.md invariant 7) and host-power has seen an earlier
withdrawal of it; a Node the tenancy rules refuse is never fenced, and a host held off for
it is released.

And one liveness rule: row 0 1 0 1 removes the request *and* stamps the Machine
``metalmend.dev/remediation-ended-at`` in the same write. The server is about to boot,
its Node deleted; a health check that still finds that Node missing would ask again at
once, and row 0 1 1 0 would power-cycle the host as soon as it is read on, before its
kubelet registers: a loop that never lets it boot. The check reads the stamp and waits
``nodeStartupTimeout`` from it (policy.healthcheck, rule 3). Once the Node that nodeRef
names is found again, the wait is over and the stamp is removed, so that a later deletion
of that Node is NodeNotFound at once again.

That stamp works only for a check that reads it. OpenShift's MachineHealthCheck does not
(openshift/machine-api-operator ``pkg/controller/machinehealthcheck``, ``needsRemediation``:
a Machine whose nodeRef names a missing Node is unhealthy at once), so on an OpenShift
Machine (``checker_reads_end`` False) it puts the request back as soon as it is removed.
Rule "same failure": while the end stamp is fresh (less than ``BOOT_GRACE``, OpenShift's
default ``nodeStartupTimeout``) a request on such a Machine is the failure just remediated,
seen again, not a new one: with our key still held, the host is released (the design's row
would remove the request again, and the two would take turns); with the Node missing,
nothing (no second power cycle while the server boots; looked at again when the grace
ends); with the Node registered again, the request is withdrawn together with the stamp
(the design's row 1 1 1 0 would power-cycle the server that just came back). After the
grace, the table applies: a server that never registers is power-cycled again.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum

from metalmend.api import names
from metalmend.api.links import REASON_NODE_OF_ANOTHER_HOST
from metalmend.policy.decision import Decision
from metalmend.policy.decision import Event as Event  # one of this policy's actions
from metalmend.policy.fencing import HostPower, reported_off, withdrawal_unseen
from metalmend.policy.interlock import (
    REASON_HELD_BY_TEARDOWN,
    REASON_STALE_CLAIM,
    Claim,
    claim_stale,
    hold_message,
)
from metalmend.policy.tenancy import SetLinkCondition as SetLinkCondition  # an action here too

KEY = names.MACHINE_REMEDIATION_REBOOT
# How long after a remediation ended a request on a Machine whose check does not read the
# end stamp is taken for the same failure (OpenShift's default nodeStartupTimeout).
BOOT_GRACE = dt.timedelta(minutes=10)
CLOCK_SKEW = dt.timedelta(seconds=60)  # an end stamp later than now by more is not ours


class Step(StrEnum):
    """The design's "action" column."""

    NOTHING = "nothing"
    ADD_REBOOT_ANNOTATION = "add reboot annotation"
    DELETE_NODE = "delete node"
    REMOVE_NEEDS_REMEDIATION = "remove needs-remediation annotation"
    REMOVE_REBOOT_ANNOTATION = "remove reboot annotation"


_S = Step
# (node ref, needs remediation, powered on, reboot annotation) -> action, in the design's order
TRUTH_TABLE: dict[tuple[int, int, int, int], Step] = {
    (0, 1, 1, 0): _S.ADD_REBOOT_ANNOTATION,
    (1, 1, 1, 0): _S.ADD_REBOOT_ANNOTATION,
    (1, 1, 0, 1): _S.DELETE_NODE,
    (0, 0, 1, 0): _S.NOTHING,
    (0, 0, 1, 1): _S.NOTHING,
    (0, 1, 0, 0): _S.NOTHING,
    (0, 1, 1, 1): _S.NOTHING,
    (1, 0, 0, 0): _S.NOTHING,
    (1, 0, 1, 0): _S.NOTHING,
    (1, 0, 1, 1): _S.NOTHING,
    (1, 1, 0, 0): _S.NOTHING,
    (1, 1, 1, 1): _S.NOTHING,
    (0, 1, 0, 1): _S.REMOVE_NEEDS_REMEDIATION,
    (0, 0, 0, 1): _S.REMOVE_REBOOT_ANNOTATION,
    (1, 0, 0, 1): _S.REMOVE_REBOOT_ANNOTATION,
    (0, 0, 0, 0): _S.NOTHING,  # omitted by the design: nothing asked, nothing held
}


def table_step(node_ref: bool, needs_remediation: bool, powered_on: bool, reboot: bool) -> Step:
    """The design's row for these four facts."""
    return TRUTH_TABLE[(int(node_ref), int(needs_remediation), int(powered_on), int(reboot))]


def powered_on(power: HostPower) -> bool:
    """The "powered on" column. While our reboot key is set, only a report of the host off
    *for this key* counts as off (policy.fencing): a Node is deleted on it. Without our key,
    an old ``poweredOn: false`` is enough: nothing is fenced on it, the host is only waited
    for (or released)."""
    if not power.holds_key:
        return power.powered_on is not False
    return not reported_off(power)


# ---- the view: what observe() read from the caches -----------------------------------------


@dataclass(frozen=True)
class NodeView:
    """The Node the Machine's nodeRef names, as found in the cache (by name: Cluster API
    keeps nodeRef's uid from the first registration, a Node registered again has a new one)."""

    name: str
    uid: str


@dataclass(frozen=True)
class RefusedClaim:
    """A Machine that names this host but may not use it (another namespace, a malformed
    annotation: api/links.py) and asks for remediation: it is told why nothing happens."""

    machine: str  # "namespace/name"
    refusal: str
    reason: str


@dataclass(frozen=True)
class View:
    host: str  # "namespace/name" of the BareMetalHost (the key reconciled)
    host_found: bool
    machine: str | None  # the Machine that names the host ("namespace/name"); None: none
    needs_remediation: bool  # that Machine carries host.metal3.io/external-remediation
    node_ref: str | None  # the Node name in its status.nodeRef, as written
    node: NodeView | None  # that Node, found in the cache: the "node ref" column
    fence_refusal: str  # why that Node may not be fenced for this host ("": it may)
    power: HostPower  # the host's power facts for our key (holds_key: "reboot key" column)
    other_remediation: str | None  # the reboot key of another remediation on the host
    refused_claims: tuple[RefusedClaim, ...] = ()
    # that Machine carries names.REMEDIATION_ENDED_AT (any value: it is only ever removed)
    remediation_ended: bool = False
    # a teardown's claim on the host (policy.interlock): the reboot key is not added
    teardown: Claim | None = None
    # names.REMEDIATION_ENDED_AT as a time (None: absent or not a time)
    remediation_ended_at: dt.datetime | None = None
    # the Machine's health check reads that stamp (metalmend's own, for Cluster API
    # Machines); False for OpenShift's Machines, whose check does not (rule "same failure")
    checker_reads_end: bool = True


# ---- actions, carried out in order by controllers.machineremediation -----------------------


@dataclass(frozen=True)
class RequestPowerOff:
    """Add reboot key ``key`` ({"mode":"hard"}) to the host, only if the host is unchanged
    since observed (two remediations that both saw it free cannot both take it)."""

    key: str = KEY


@dataclass(frozen=True)
class DeleteNode:
    name: str
    uid: str  # precondition: never delete a Node that registered since we looked


@dataclass(frozen=True)
class DeletePods:
    """The pods bound to a fenced Node: the host is off, they are not running; deleting them
    now lets their controllers start them elsewhere at once."""

    node: str


@dataclass(frozen=True)
class RemoveRemediationRequest:
    """Remove ``host.metal3.io/external-remediation`` from the Machine and stamp
    ``metalmend.dev/remediation-ended-at`` with ``ended_at``, in one write: the health
    check never sees the request gone without the stamp that makes it wait for the Node."""

    ended_at: dt.datetime


@dataclass(frozen=True)
class WithdrawRequest:
    """Remove ``host.metal3.io/external-remediation`` and ``metalmend.dev/remediation-ended-at``
    from the Machine in one write: its Node registered again after a remediation, and the
    request was put back while it was missing (rule "same failure")."""


@dataclass(frozen=True)
class ForgetRemediationEnd:
    """Remove ``metalmend.dev/remediation-ended-at`` from the Machine: its Node is back."""


@dataclass(frozen=True)
class ReleasePower:
    """Remove reboot key ``key``: the host controller powers the host on (if spec.online)."""

    key: str = KEY


Action = (
    SetLinkCondition | RequestPowerOff | DeleteNode | DeletePods | RemoveRemediationRequest
    | ReleasePower | ForgetRemediationEnd | WithdrawRequest | Event
)  # fmt: skip


def decide(view: View, now: dt.datetime) -> Decision[Action]:
    """What to do for one host. No deadline: the design has no timeouts, and every fact it
    reads changes by a watched object (host, Machine, Node). ``now`` is only written (when
    a remediation ends), never compared."""
    decision: Decision[Action] = Decision()
    for claim in view.refused_claims:
        decision.do(SetLinkCondition(claim.machine, names.CONDITION_HOST_LINK, claim.refusal,
                                     claim.reason))  # fmt: skip
    if not view.host_found:
        return decision
    if view.machine is not None:  # clears what an earlier refusal said, reports a new one
        why = view.fence_refusal if view.needs_remediation else ""
        decision.do(
            SetLinkCondition(view.machine, names.CONDITION_HOST_LINK, "", ""),
            SetLinkCondition(view.machine, names.CONDITION_NODE_FENCING, why,
                             REASON_NODE_OF_ANOTHER_HOST),
        )  # fmt: skip
    if (grace_ends := same_failure(view, now)) is not None:
        return decision.then(_let_it_boot(view, grace_ends))
    step = table_step(
        view.node is not None, view.needs_remediation, powered_on(view.power),
        view.power.holds_key,
    )  # fmt: skip
    decision.then(_carry_out(step, view, now))
    if view.machine is not None and view.remediation_ended and view.node is not None:
        decision.do(ForgetRemediationEnd())  # the Node registered again: the wait is over
    return decision


def same_failure(view: View, now: dt.datetime) -> dt.datetime | None:
    """When rule "same failure" applies to this view: the end of its grace; else None."""
    ended = view.remediation_ended_at
    if (
        view.checker_reads_end
        or view.machine is None
        or not view.needs_remediation
        or view.fence_refusal
        or ended is None
        or ended > now + CLOCK_SKEW
        or now >= ended + BOOT_GRACE
        or (view.node is not None and view.power.holds_key)  # a cycle of its own: the table
    ):
        return None
    return ended + BOOT_GRACE


def _let_it_boot(view: View, grace_ends: dt.datetime) -> Decision[Action]:
    decision: Decision[Action] = Decision()
    if view.node is not None:
        decision.do(WithdrawRequest())
        message = (
            f"Node {view.node.name} registered again after the remediation ended:"
            " the request made while it was missing is withdrawn"
        )
        return _tell(decision, message)
    if view.power.holds_key:
        decision.do(ReleasePower())
        message = (
            f"remediation asked again while Node {view.node_ref} is missing after the one"
            f" that ended: not a new power cycle; powering host {view.host} on"
        )
        return _tell(decision, message)
    return decision.at(grace_ends)  # booting: its Node (a watched object) ends the wait


def _carry_out(step: Step, view: View, now: dt.datetime) -> Decision[Action]:
    decision: Decision[Action] = Decision()
    if view.fence_refusal and step in (Step.ADD_REBOOT_ANNOTATION, Step.DELETE_NODE):
        # The nodeRef names a Node of another host: no power-cycle for it, and a host
        # already held off for it is released, never left off (the condition says why).
        return decision.do(ReleasePower()) if view.power.holds_key else decision
    match step:
        case Step.ADD_REBOOT_ANNOTATION:
            if view.teardown is not None:  # docs/design.md, invariant 7
                return _held_by_teardown(decision, view, view.teardown)
            if view.other_remediation:
                return _tell(decision, f"host {view.host} is being remediated by"
                                       f" {view.other_remediation}; waiting")  # fmt: skip
            if withdrawal_unseen(view.power):  # host-power's status write wakes us
                return _tell(decision, f"waiting for host-power to see {KEY} withdrawn")
            decision.do(RequestPowerOff())
            return _tell(decision, f"powering off host {view.host} (hard)")
        case Step.DELETE_NODE if view.node is not None:
            node = view.node
            decision.do(DeleteNode(node.name, node.uid), DeletePods(node.name))
            return _tell(decision, f"host {view.host} reported off: Node {node.name} deleted")
        case Step.REMOVE_NEEDS_REMEDIATION:
            decision.do(RemoveRemediationRequest(ended_at=now))
            gone = f"Node {view.node_ref} gone" if view.node_ref else "no Node"
            return _tell(decision, f"{gone}: remediation request removed")
        case Step.REMOVE_REBOOT_ANNOTATION:
            decision.do(ReleasePower())
            return _tell(decision, f"powering host {view.host} back on")
    return decision


def _held_by_teardown(decision: Decision[Action], view: View, claim: Claim) -> Decision[Action]:
    """A teardown claims the host: the power-off is not asked for; the claim's removal (a
    host change) wakes us. Only adding the key waits: with our key held (we took the host
    first) the rows carry on, so a host is never left off."""
    node = view.node
    stale = claim_stale(claim, node.name if node else None, node.uid if node else None)
    reason = REASON_STALE_CLAIM if stale else REASON_HELD_BY_TEARDOWN
    return decision.note(reason, hold_message(view.host, claim, stale), warning=stale)


def _tell(decision: Decision[Action], message: str) -> Decision[Action]:
    """An Event on the Machine (on the host when no Machine names it any more)."""
    return decision.note(names.REASON_MACHINE_REMEDIATION, message)
