"""The annotation-driven remediation of metal3's "Annotation for Power Cycling and Deleting
Failed Nodes" design: its truth table, one test per row (and the row the design omits), and
the decisions metalmend builds on it (policy.machineremediation.decide)."""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass, field, replace

import pytest

from metalmend.api import names
from metalmend.api.links import REASON_NODE_OF_ANOTHER_HOST
from metalmend.api.stamps import parse_stamp, stamp
from metalmend.policy import healthcheck as check_policy
from metalmend.policy.fencing import HostPower
from metalmend.policy.machineremediation import (
    BOOT_GRACE,
    KEY,
    TRUTH_TABLE,
    DeleteNode,
    DeletePods,
    Event,
    ForgetRemediationEnd,
    NodeView,
    RefusedClaim,
    ReleasePower,
    RemoveRemediationRequest,
    RequestPowerOff,
    SetLinkCondition,
    Step,
    View,
    WithdrawRequest,
    decide,
    powered_on,
    table_step,
)

S = Step
DESIGN_ROWS = [  # node ref, needs remediation, powered on, reboot annotation -> action
    ((0, 1, 1, 0), S.ADD_REBOOT_ANNOTATION),
    ((1, 1, 1, 0), S.ADD_REBOOT_ANNOTATION),
    ((1, 1, 0, 1), S.DELETE_NODE),
    ((0, 0, 1, 0), S.NOTHING),
    ((0, 0, 1, 1), S.NOTHING),
    ((0, 1, 0, 0), S.NOTHING),
    ((0, 1, 1, 1), S.NOTHING),
    ((1, 0, 0, 0), S.NOTHING),
    ((1, 0, 1, 0), S.NOTHING),
    ((1, 0, 1, 1), S.NOTHING),
    ((1, 1, 0, 0), S.NOTHING),
    ((1, 1, 1, 1), S.NOTHING),
    ((0, 1, 0, 1), S.REMOVE_NEEDS_REMEDIATION),
    ((0, 0, 0, 1), S.REMOVE_REBOOT_ANNOTATION),
    ((1, 0, 0, 1), S.REMOVE_REBOOT_ANNOTATION),
]

ON = HostPower(holds_key=False, powered_on=True, acknowledged=False, power_on_in_flight=False)
HELD_ON = replace(ON, holds_key=True)
HELD_OFF = HostPower(holds_key=True, powered_on=False, acknowledged=True, power_on_in_flight=False)
RELEASED_OFF = replace(HELD_OFF, holds_key=False, acknowledged=False)
N1 = NodeView("n1", "uid-n1")
NOW = dt.datetime(2026, 11, 23, 18, 0, tzinfo=dt.UTC)


def view(**changes: object) -> View:
    """m1 asks for remediation of host h1, whose Node n1 is found and which is on."""
    base = View(
        host="ns/h1", host_found=True, machine="ns/m1", needs_remediation=True,
        node_ref="n1", node=N1, fence_refusal="", power=ON, other_remediation=None,
    )  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def work(decision: object) -> list[object]:
    """The actions that change the world (not the conditions, not the Events)."""
    actions = getattr(decision, "actions", [])
    return [a for a in actions if not isinstance(a, SetLinkCondition | Event)]


@pytest.mark.parametrize(
    ("row", "step"), DESIGN_ROWS, ids=["".join(map(str, r)) for r, _ in DESIGN_ROWS]
)
def test_truth_table_row(row: tuple[int, int, int, int], step: Step) -> None:
    assert table_step(*map(bool, row)) is step


def test_the_row_the_design_omits_does_nothing() -> None:
    assert table_step(False, False, False, False) is S.NOTHING


def test_table_covers_every_combination_once() -> None:
    assert sorted(TRUTH_TABLE) == sorted(itertools.product((0, 1), repeat=4))
    assert len(DESIGN_ROWS) == 15
    assert all(TRUTH_TABLE[row] is step for row, step in DESIGN_ROWS)


def test_node_deleted_only_while_host_off_and_held() -> None:
    for row, step in TRUTH_TABLE.items():
        if step is S.DELETE_NODE:
            assert row[2] == 0
            assert row[3] == 1


# ---- the columns, as decide reads them -------------------------------------------------------


def test_off_counts_only_when_reported_off_for_our_key() -> None:
    assert powered_on(HELD_OFF) is False
    assert powered_on(replace(HELD_OFF, acknowledged=False)) is True  # an old off report
    assert powered_on(replace(HELD_OFF, power_on_in_flight=True)) is True
    assert powered_on(RELEASED_OFF) is False  # without our key an old off is enough to wait


def test_a_requested_machine_on_a_running_host_gets_a_hard_power_off() -> None:
    decision = decide(view(), NOW)
    assert work(decision) == [RequestPowerOff(KEY)]
    assert any("powering off host ns/h1" in e.message for e in decision.events)


def test_the_found_node_is_deleted_with_its_cached_uid_once_reported_off() -> None:
    """Cluster API keeps nodeRef's uid from the first registration: the Node deleted is the
    one found by name (its own uid as precondition), and its pods with it."""
    decision = decide(view(power=HELD_OFF), NOW)
    assert work(decision) == [DeleteNode("n1", "uid-n1"), DeletePods("n1")]


def test_a_node_ref_whose_node_is_gone_counts_as_no_node() -> None:
    """Where Cluster API owns nodeRef it still names the Node this flow deleted: the row is
    "no node ref", so the request is removed and then the host released (never "delete node"
    forever with the host held off)."""
    gone = view(power=HELD_OFF, node=None)  # nodeRef still "n1"
    assert work(decide(gone, NOW)) == [RemoveRemediationRequest(ended_at=NOW)]
    assert work(decide(replace(gone, needs_remediation=False), NOW)) == [ReleasePower(KEY)]


def test_no_reboot_key_while_another_remediation_holds_the_host() -> None:
    decision = decide(view(other_remediation="reboot.metal3.io/metal3-remediation-u1"), NOW)
    assert work(decision) == []
    assert any("being remediated by" in e.message for e in decision.events)


def test_no_reboot_key_until_host_power_saw_the_last_one_withdrawn() -> None:
    decision = decide(view(power=replace(ON, acknowledged=True)), NOW)
    assert work(decision) == []
    assert any("withdrawn" in e.message for e in decision.events)


def test_a_node_of_another_host_is_never_fenced_and_a_held_host_is_released() -> None:
    refused = view(fence_refusal="Node n1 is not host ns/h1's")
    assert work(decide(refused, NOW)) == []
    assert work(decide(replace(refused, power=HELD_OFF), NOW)) == [ReleasePower(KEY)]
    fencing = SetLinkCondition("ns/m1", names.CONDITION_NODE_FENCING,
                               "Node n1 is not host ns/h1's", REASON_NODE_OF_ANOTHER_HOST)  # fmt: skip
    assert fencing in decide(refused, NOW).actions


def test_a_host_whose_machine_is_gone_is_released() -> None:
    orphan = view(machine=None, needs_remediation=False, node_ref=None, node=None, power=HELD_OFF)
    assert work(decide(orphan, NOW)) == [ReleasePower(KEY)]
    assert not decide(orphan, NOW).of(SetLinkCondition)


def test_machines_of_another_namespace_naming_the_host_are_told_why_nothing_happens() -> None:
    claim = RefusedClaim("other/evil", "host of another namespace", "HostInOtherNamespace")
    decision = decide(view(host_found=False, refused_claims=(claim,)), NOW)
    assert decision.actions == [SetLinkCondition("other/evil", names.CONDITION_HOST_LINK,
                                                  claim.refusal, claim.reason)]  # fmt: skip


def test_no_deadline_only_watched_objects_change_the_answer() -> None:
    assert decide(view(), NOW).requeue_at is None


# ---- the end of a remediation: the health check must let the server boot ----------------------


def test_ending_the_request_stamps_when_it_ended_in_the_same_write() -> None:
    """Row 0 1 0 1 removes the request and records its end in one action (one write): the
    health check never sees the request gone without the stamp that makes it wait."""
    decision = decide(view(power=HELD_OFF, node=None), NOW)
    assert work(decision) == [RemoveRemediationRequest(ended_at=NOW)]


def test_the_end_stamp_is_forgotten_once_the_node_is_found_again() -> None:
    """The Node registered again: the wait is over, and a later deletion of that Node must be
    NodeNotFound at once again."""
    back = view(needs_remediation=False, remediation_ended=True)
    assert work(decide(back, NOW)) == [ForgetRemediationEnd()]
    booting = replace(back, node=None)  # still missing: the stamp stays
    assert work(decide(booting, NOW)) == []
    assert work(decide(replace(back, remediation_ended=False), NOW)) == []


def test_the_end_stamp_does_not_change_a_row_of_the_design() -> None:
    for row, step in TRUTH_TABLE.items():
        node, asked, on, held = map(bool, row)
        power = HostPower(holds_key=held, powered_on=on, acknowledged=held and not on,
                          power_on_in_flight=False)  # fmt: skip
        facts = view(node=N1 if node else None, needs_remediation=asked, power=power)
        for stamped in (False, True):
            stamped_view = replace(facts, remediation_ended=stamped)
            assert table_step(node, asked, powered_on(power), held) is step
            table_work = [a for a in work(decide(stamped_view, NOW))
                          if not isinstance(a, ForgetRemediationEnd)]  # fmt: skip
            assert table_work == work(decide(facts, NOW))


# ---- the health check and this flow together (policy.healthcheck x this policy) ---------------

BOOT = dt.timedelta(seconds=150)  # power-on to the kubelet registering its Node


@dataclass
class Site:
    """One Machine, its host and its Node, moved only by the two policies' actions, a
    host-power that obeys the reboot key within a second, and a kubelet that registers a
    new Node ``boot`` after the host comes on (never, when None)."""

    boot: dt.timedelta | None = BOOT
    now: dt.datetime = NOW
    annotations: dict[str, str] = field(default_factory=dict)  # the Machine's
    node: bool = True
    sick: bool = True  # the Node's KernelDeadlock=True, since long
    held: bool = False  # the reboot key is on the host
    on: bool = True
    acknowledged: bool = False  # poweredOffFor lists the key
    on_since: dt.datetime = NOW - dt.timedelta(days=1)
    power_offs: list[dt.datetime] = field(default_factory=list)
    openshift: bool = False  # OpenShift's check: asks while the Node is missing or sick

    def health_check(self, startup: float) -> None:
        if self.openshift:  # needsRemediation: no end stamp read, nothing ever withdrawn
            if not self.node or self.sick:
                self.annotations.setdefault(names.EXTERNAL_REMEDIATION, "")
            return
        rule = check_policy.UnhealthyCondition("KernelDeadlock", "True", 60)
        conditions = {}
        if self.node:
            status = "True" if self.sick else "False"
            conditions = {"KernelDeadlock": check_policy.NodeCondition(status, NOW - dt.timedelta(days=1))}  # fmt: skip
        target = check_policy.Target(
            machine="ns/m1", created=NOW - dt.timedelta(days=1), node_ref="n1",
            node_exists=self.node, conditions=conditions,
            remediating=names.EXTERNAL_REMEDIATION in self.annotations,
            remediation_ended_at=parse_stamp(self.annotations.get(names.REMEDIATION_ENDED_AT)),
        )  # fmt: skip
        check = check_policy.Check((rule,), node_startup_timeout=startup)
        view = check_policy.View(check, (target,), remediate_by=check_policy.RemediateBy.ANNOTATION)
        for action in check_policy.decide(view, self.now).actions:
            if isinstance(action, check_policy.RequestRemediationByAnnotation):
                self.annotations[names.EXTERNAL_REMEDIATION] = ""
            elif isinstance(action, check_policy.WithdrawAnnotation):
                self.annotations.pop(names.EXTERNAL_REMEDIATION, None)

    def machine_remediation(self) -> None:
        power = HostPower(self.held, self.on, self.acknowledged, power_on_in_flight=False)
        facts = view(
            needs_remediation=names.EXTERNAL_REMEDIATION in self.annotations,
            node=N1 if self.node else None, power=power,
            remediation_ended=names.REMEDIATION_ENDED_AT in self.annotations,
            remediation_ended_at=parse_stamp(self.annotations.get(names.REMEDIATION_ENDED_AT)),
            checker_reads_end=not self.openshift,
        )  # fmt: skip
        for action in work(decide(facts, self.now)):
            match action:
                case RequestPowerOff():
                    self.held = True
                case DeleteNode():
                    self.node = False
                case RemoveRemediationRequest(ended_at=ended):
                    self.annotations.pop(names.EXTERNAL_REMEDIATION)
                    self.annotations[names.REMEDIATION_ENDED_AT] = stamp(ended)
                case ReleasePower():
                    self.held = False
                case ForgetRemediationEnd():
                    self.annotations.pop(names.REMEDIATION_ENDED_AT)
                case WithdrawRequest():
                    self.annotations.pop(names.EXTERNAL_REMEDIATION)
                    self.annotations.pop(names.REMEDIATION_ENDED_AT)

    def second(self) -> None:
        """One second of hardware: host-power obeys the key, the kubelet boots."""
        self.now += dt.timedelta(seconds=1)
        if self.held and self.on:
            self.on, self.acknowledged = False, True
            self.power_offs.append(self.now)
        elif not self.held and not self.on:
            self.on, self.acknowledged, self.on_since = True, False, self.now
        elif self.on and not self.node and self.boot and self.now - self.on_since >= self.boot:
            self.node, self.sick = True, False  # a new Node, healthy

    def run(self, seconds: int, startup: float) -> None:
        for _ in range(seconds):  # the check reacts at once, before and after each step
            self.health_check(startup)
            self.machine_remediation()
            self.health_check(startup)
            self.second()


def test_a_remediated_server_is_power_cycled_once_and_given_time_to_boot() -> None:
    """The check asks; machine-remediation powers off, deletes the Node, ends the request;
    the server boots (150 s). Without the end stamp, the check found the deleted Node
    missing and asked again at once: the request was removed and re-added while the host
    stayed off, or, once the host was read on, row 0 1 1 0 powered it off again before its
    kubelet registered. Either way it never booted."""
    site = Site()
    site.run(600, startup=600)
    assert len(site.power_offs) == 1
    assert site.node
    assert site.on
    assert not site.held
    assert site.annotations == {}  # request gone, stamp forgotten once the Node came back


def test_a_server_that_never_registers_is_power_cycled_again_each_node_startup_timeout() -> None:
    site = Site(boot=None)
    site.run(1000, startup=300)
    gaps = [b - a for a, b in itertools.pairwise(site.power_offs)]
    assert len(site.power_offs) >= 3
    assert all(gap >= dt.timedelta(seconds=300) for gap in gaps)


def test_node_startup_timeout_zero_lets_a_remediated_server_wait_for_its_node_forever() -> None:
    site = Site(boot=None)
    site.run(3000, startup=0)
    assert len(site.power_offs) == 1
    assert site.on
    assert not site.held


# ---- rule "same failure": a check that does not read the end stamp (OpenShift's) ----------------

ENDED = NOW - dt.timedelta(seconds=30)


def asked_again(**changes: object) -> View:
    """m1 (an OpenShift Machine) asks again 30 s after its last remediation ended."""
    base = view(remediation_ended=True, remediation_ended_at=ENDED, checker_reads_end=False)
    return replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("node", "power", "expected"),
    [
        pytest.param(None, HELD_OFF, [ReleasePower()],
                     id="asked again before the release: the host is released, not re-stamped"),
        pytest.param(None, ON, [], id="asked again while it boots: no second power cycle"),
        pytest.param(None, RELEASED_OFF, [], id="asked again before it reads on: nothing"),
        pytest.param(N1, ON, [WithdrawRequest()],
                     id="its Node back: the request made while it was missing is withdrawn"),
        pytest.param(N1, HELD_OFF, [DeleteNode("n1", "uid-n1"), DeletePods("n1"), ForgetRemediationEnd()],
                     id="a cycle of its own under way: the table"),
    ],
)  # fmt: skip
def test_same_failure_rule(node: NodeView | None, power: HostPower, expected: list[object]) -> None:
    assert work(decide(asked_again(node=node, power=power), NOW)) == expected


def test_same_failure_while_booting_looks_again_when_the_grace_ends() -> None:
    assert decide(asked_again(node=None), NOW).requeue_at == ENDED + BOOT_GRACE


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        pytest.param({}, [RequestPowerOff()], id="no stamp"),
        pytest.param({"remediation_ended_at": ENDED, "checker_reads_end": True},
                     [RequestPowerOff()], id="a check that reads the stamp: the table"),
        pytest.param({"remediation_ended_at": NOW - BOOT_GRACE}, [RequestPowerOff()],
                     id="after the grace: a server that never registered is cycled again"),
        pytest.param({"remediation_ended_at": NOW + dt.timedelta(minutes=5)}, [RequestPowerOff()],
                     id="a stamp from the future is not machine-remediation's"),
        pytest.param({"remediation_ended_at": ENDED, "needs_remediation": False}, [],
                     id="nothing asked: the table (row 0 0 1 0)"),
    ],
)  # fmt: skip
def test_same_failure_rule_does_not_apply(
    changes: dict[str, object], expected: list[object]
) -> None:
    facts = replace(view(node=None, checker_reads_end=False), **changes)  # type: ignore[arg-type]
    assert work(decide(facts, NOW)) == expected


def test_openshifts_check_asking_again_at_once_gets_one_power_cycle() -> None:
    """OpenShift's check puts the request back as soon as it is removed while the Node is
    missing, and never withdraws it: before the rule, the host was power-cycled again as
    soon as it read on, before its kubelet registered, and again after each power-on."""
    site = Site(openshift=True)
    site.run(600, startup=600)
    assert len(site.power_offs) == 1
    assert site.node
    assert site.on
    assert not site.held
    assert site.annotations == {}  # the request withdrawn once the Node came back


def test_openshifts_check_and_a_server_that_never_registers_cycles_each_grace() -> None:
    site = Site(openshift=True, boot=None)
    site.run(2000, startup=600)
    gaps = [b - a for a, b in itertools.pairwise(site.power_offs)]
    assert len(site.power_offs) >= 2
    assert all(gap >= BOOT_GRACE for gap in gaps)
