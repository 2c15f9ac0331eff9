"""MachineHealthCheck evaluation: one case per rule, percent rounding, range edges, and
properties over random pools."""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metalmend.policy.decision import Decision
from metalmend.policy.healthcheck import (
    Action,
    Check,
    CheckStatus,
    CreateRemediation,
    DeleteRemediation,
    MachineEvent,
    NodeCondition,
    RemediateBy,
    RequestRemediationByAnnotation,
    SetMachineConditions,
    SetStatus,
    Settings,
    StopUntilEdited,
    Target,
    Template,
    UnhealthyCondition,
    View,
    WithdrawAnnotation,
    decide,
    evaluate,
    max_unhealthy,
    merge_conditions,
    parse_duration,
    verdict,
    verdict_due,
)

NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
READY_UNKNOWN_5M = UnhealthyCondition("Ready", "Unknown", 300)
READY_FALSE_5M = UnhealthyCondition("Ready", "False", 300)
CHECK = Check(unhealthy_conditions=(READY_UNKNOWN_5M, READY_FALSE_5M))


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def target(name: str = "m", ready: str = "True", since: float = 3600, **changes: object) -> Target:
    base = dict(
        machine=f"ns/{name}",
        created=ago(7200),
        node_ref=name,
        node_exists=True,
        conditions={"Ready": NodeCondition(ready, ago(since))},
    )
    base.update(changes)
    return Target(**base)  # type: ignore[arg-type]


VERDICTS = [
    ("a Ready Node is healthy", target(), "healthy", None),
    ("Ready=Unknown for longer than its timeout is unhealthy", target(ready="Unknown", since=301), "unhealthy", "UnhealthyNode"),
    ("Ready=False for longer than its timeout is unhealthy", target(ready="False", since=600), "unhealthy", "UnhealthyNode"),
    ("a condition exactly at its timeout is unhealthy", target(ready="Unknown", since=300), "unhealthy", "UnhealthyNode"),
    ("a condition within its timeout is waiting, not healthy", target(ready="Unknown", since=299), "waiting", "ConditionPending"),
    ("a status no rule names is healthy", target(ready="Maybe", since=9999), "healthy", None),
    ("nodeRef naming a missing Node is unhealthy at once", target(node_exists=False), "unhealthy", "NodeNotFound"),
    ("a deleted Node is unhealthy at once even with a startup timeout left", target(node_exists=False, created=ago(1)), "unhealthy", "NodeNotFound"),
    ("no nodeRef past nodeStartupTimeout (10m by default) is unhealthy", target(node_ref=None, created=ago(601)), "unhealthy", "NodeStartupTimeout"),
    ("no nodeRef within nodeStartupTimeout is waiting", target(node_ref=None, created=ago(60)), "waiting", "NodeStartup"),
    ("startup counts from the Machine's infrastructure becoming ready", target(node_ref=None, created=ago(9999), infrastructure_ready_at=ago(60)), "waiting", "NodeStartup"),
    ("startup counts from the Cluster becoming ready", target(node_ref=None, created=ago(9999), cluster_ready_at=ago(60)), "waiting", "NodeStartup"),
    ("startup counts from the latest of creation and readiness", target(node_ref=None, created=ago(30), infrastructure_ready_at=ago(9999), cluster_ready_at=ago(700)), "waiting", "NodeStartup"),
    ("startup past the timeout after infrastructure ready is unhealthy", target(node_ref=None, created=ago(9999), infrastructure_ready_at=ago(700)), "unhealthy", "NodeStartupTimeout"),
    ("a failureReason is unhealthy at once whatever the Node says", target(failure="FailureReason: UpdateError"), "unhealthy", "MachineHasFailure"),
    ("a failureMessage is unhealthy at once even without a Node yet", target(node_ref=None, created=ago(1), failure="FailureMessage: provisioning failed"), "unhealthy", "MachineHasFailure"),
    ("the remediate-machine annotation is unhealthy at once", target(remediation_requested=True), "unhealthy", "HasRemediateMachineAnnotation"),
    ("the remediate-machine annotation comes before a failure", target(remediation_requested=True, failure="FailureReason: x"), "unhealthy", "HasRemediateMachineAnnotation"),
    ("a manual request waits while the remediated server boots", target(remediation_requested=True, node_exists=False, remediation_ended_at=ago(60)), "waiting", "WaitingForNodeAfterRemediation"),
    ("a failure waits while the remediated server boots", target(failure="FailureReason: x", node_exists=False, remediation_ended_at=ago(60)), "waiting", "WaitingForNodeAfterRemediation"),
    ("a manual request without nodeRef waits the startup time after a remediation", target(remediation_requested=True, node_ref=None, created=ago(9999), remediation_ended_at=ago(60)), "waiting", "NodeStartup"),
    ("a manual request is unhealthy again once the remediated server had its time", target(remediation_requested=True, node_exists=False, remediation_ended_at=ago(601)), "unhealthy", "HasRemediateMachineAnnotation"),
    ("a manual request with the Node back is unhealthy at once", target(remediation_requested=True, remediation_ended_at=ago(60)), "unhealthy", "HasRemediateMachineAnnotation"),
    ("a Machine being deleted is never healthy", target(deleting=True), "waiting", "MachineDeleting"),
    ("a Machine being deleted with a missing Node is still unhealthy", target(deleting=True, node_exists=False), "unhealthy", "NodeNotFound"),
    ("a Node missing within nodeStartupTimeout after a remediation ended is waiting for it", target(node_exists=False, remediation_ended_at=ago(599)), "waiting", "WaitingForNodeAfterRemediation"),
    ("a Node missing nodeStartupTimeout after a remediation ended is unhealthy", target(node_exists=False, remediation_ended_at=ago(600)), "unhealthy", "NodeNotFound"),
    ("a remediation end stamped in the future is read as absent", target(node_exists=False, remediation_ended_at=ago(-3600)), "unhealthy", "NodeNotFound"),
    ("a remediation end within clock skew ahead is believed", target(node_exists=False, remediation_ended_at=ago(-30)), "waiting", "WaitingForNodeAfterRemediation"),
    ("a Node found is judged by its conditions whatever the remediation end says", target(ready="Unknown", since=400, remediation_ended_at=ago(1)), "unhealthy", "UnhealthyNode"),
    ("without nodeRef startup counts from the end of the last remediation", target(node_ref=None, created=ago(9999), remediation_ended_at=ago(60)), "waiting", "NodeStartup"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("state", "kind", "reason"), [pytest.param(t, k, r, id=i) for i, t, k, r in VERDICTS]
)
def test_verdicts(state: Target, kind: str, reason: str | None) -> None:
    result = verdict(CHECK, state, NOW)
    assert result.kind == kind
    if reason is not None:
        assert result.reason == reason


def test_node_startup_timeout_zero_disables_it() -> None:
    result = verdict(Check(node_startup_timeout=0), target(node_ref=None, created=ago(99999)), NOW)
    assert result.kind == "waiting"
    assert result.deadline is None


def test_after_a_remediation_node_startup_timeout_zero_waits_for_the_node_without_limit() -> None:
    """0 disables the startup timeout (Cluster API): a remediated server is like a new
    Machine, it waits for its Node as long as it takes (no deadline, never NodeNotFound)."""
    booting = target(node_exists=False, remediation_ended_at=ago(99999))
    result = verdict(Check(node_startup_timeout=0), booting, NOW)
    assert (result.kind, result.reason, result.deadline) == ("waiting", "WaitingForNodeAfterRemediation", None)  # fmt: skip
    assert "no limit" in result.message


def test_the_wait_after_a_remediation_is_looked_at_again_at_its_exact_end() -> None:
    booting = target(node_exists=False, remediation_ended_at=ago(100))
    decision = decide(view(booting, remediate_by=RemediateBy.ANNOTATION), NOW)
    assert decision.requeue_at == ago(100) + dt.timedelta(seconds=600)
    assert decision.of(RequestRemediationByAnnotation) == []
    assert conditions_written(decision, "ns/m") == {}  # waiting: nothing new to say
    expired = verdict(CHECK, booting, NOW + dt.timedelta(seconds=500))
    assert expired.reason == "NodeNotFound"
    assert "not registered again within 10m" in expired.message


def test_a_remediation_end_stamp_beyond_the_calendar_or_from_the_past_never_crashes() -> None:
    """The stamp is tenant-writable: any time it can hold evaluates (the controller reads a
    value that is not a time as absent)."""
    for moment in (dt.datetime.min.replace(tzinfo=dt.UTC), dt.datetime.max.replace(tzinfo=dt.UTC)):
        for check in (CHECK, Check(node_startup_timeout=0), Check(node_startup_timeout=1e12)):
            for node_ref in ("m", None):
                evaluate(check, [target(node_ref=node_ref, node_exists=False, remediation_ended_at=moment)], NOW)  # fmt: skip


def test_next_deadline_is_the_earliest_expiry() -> None:
    pool = [
        target("a", ready="Unknown", since=200),
        target("b", ready="False", since=250),
        target("c"),
    ]
    result = evaluate(CHECK, pool, NOW)
    assert result.next_deadline == ago(250) + dt.timedelta(seconds=300)  # b expires first
    assert result.remediate == []


DEADLOCK_5S = UnhealthyCondition("KernelDeadlock", "True", 5)


@pytest.mark.parametrize(
    ("conditions", "due"),
    [
        pytest.param({"Ready": NodeCondition("True", ago(3600))}, None,
                     id="healthy: no verdict to come"),
        pytest.param({"Ready": NodeCondition("Unknown", ago(200))}, 100.0,
                     id="Unknown for 200 s of 300: due in 100 s"),
        pytest.param({"Ready": NodeCondition("False", ago(400))}, 0.0,
                     id="past its timeout: due now"),
        pytest.param({"Ready": NodeCondition("Unknown", ago(0)),
                      "KernelDeadlock": NodeCondition("True", ago(1))}, 4.0,
                     id="two held: the soonest"),
        pytest.param({"KernelDeadlock": NodeCondition("False", ago(10))}, None,
                     id="a condition the check names, in another status"),
        pytest.param({"DiskPressure": NodeCondition("True", ago(10))}, None,
                     id="a condition the check does not name"),
    ],
)  # fmt: skip
def test_a_node_change_says_when_its_verdict_is_due(
    conditions: dict[str, NodeCondition], due: float | None
) -> None:
    """How long a Node's change may wait before the check looks (controllers.healthcheck
    never waits past it): the soonest expiry of the unhealthy conditions it holds."""
    check = Check(unhealthy_conditions=(READY_UNKNOWN_5M, READY_FALSE_5M, DEADLOCK_5S))
    assert verdict_due(check, conditions, NOW) == due


def test_a_verdict_due_agrees_with_the_verdict_it_announces() -> None:
    """At the moment verdict_due names, the Node's Machine is unhealthy; a moment before,
    it is not yet."""
    state = target(ready="Unknown", since=120)
    due = verdict_due(CHECK, state.conditions, NOW)
    assert due == 180.0
    assert verdict(CHECK, state, NOW + dt.timedelta(seconds=due)).kind == "unhealthy"
    assert verdict(CHECK, state, NOW + dt.timedelta(seconds=due - 1)).kind == "waiting"


def test_a_timeout_beyond_the_calendar_never_falls_due() -> None:
    check = Check(unhealthy_conditions=(UnhealthyCondition("Ready", "Unknown", 1e300),))
    assert verdict_due(check, {"Ready": NodeCondition("Unknown", ago(5))}, NOW) is None


@pytest.mark.parametrize(
    ("value", "expected", "limit"),
    [
        pytest.param("40%", 6, 2, id="40% of 6 rounds down to 2"),
        pytest.param("40%", 5, 2, id="40% of 5 is 2"),
        pytest.param("33%", 3, 0, id="33% of 3 rounds down to 0"),
        pytest.param("100%", 7, 7, id="100% is all"),
        pytest.param(None, 4, 4, id="default is 100%"),
        pytest.param(3, 10, 3, id="an integer is a count"),
        pytest.param("2", 10, 2, id="a numeric string is a count"),
        pytest.param("abc", 10, None, id="garbage is refused"),
    ],
)
def test_max_unhealthy(value: int | str | None, expected: int, limit: int | None) -> None:
    assert max_unhealthy(value, expected) == limit


def pool(unhealthy: int, total: int) -> list[Target]:
    return [
        target(f"m{i}", ready="Unknown" if i < unhealthy else "True", since=400)
        for i in range(total)
    ]


SHORT_CIRCUIT = [
    ("within maxUnhealthy: remediate", Check(CHECK.unhealthy_conditions, max_unhealthy="40%"), 2, 5, True, 0),
    ("over maxUnhealthy: blocked", Check(CHECK.unhealthy_conditions, max_unhealthy="40%"), 3, 5, False, 0),
    ("remediations allowed is what is left", Check(CHECK.unhealthy_conditions, max_unhealthy=3), 1, 5, True, 2),
    ("unhealthyRange lower edge", Check(CHECK.unhealthy_conditions, unhealthy_range="[1-2]"), 1, 5, True, 1),
    ("unhealthyRange upper edge", Check(CHECK.unhealthy_conditions, unhealthy_range="[1-2]"), 2, 5, True, 0),
    ("above unhealthyRange: blocked", Check(CHECK.unhealthy_conditions, unhealthy_range="[1-2]"), 3, 5, False, 0),
    ("below unhealthyRange: blocked", Check(CHECK.unhealthy_conditions, unhealthy_range="[2-3]"), 1, 5, False, 0),
    ("unhealthyRange takes precedence over maxUnhealthy", Check(CHECK.unhealthy_conditions, max_unhealthy=0, unhealthy_range="[1-3]"), 2, 5, True, 1),
]  # fmt: skip


@pytest.mark.parametrize(
    ("check", "bad", "total", "allowed", "left"),
    [pytest.param(c, b, t, a, r, id=i) for i, c, b, t, a, r in SHORT_CIRCUIT],
)
def test_short_circuit(check: Check, bad: int, total: int, allowed: bool, left: int) -> None:
    result = evaluate(check, pool(bad, total), NOW)
    assert result.unhealthy == bad
    assert result.allowed is allowed
    assert result.remediations_allowed == left
    assert len(result.remediate) == (bad if allowed else 0)
    assert bool(result.blocked_reason) is not allowed


def test_a_range_with_max_below_min_is_a_spec_error() -> None:
    result = evaluate(Check(CHECK.unhealthy_conditions, unhealthy_range="[3-1]"), pool(2, 5), NOW)
    assert not result.allowed
    assert "max is below min" in result.spec_error
    assert result.remediate == []


def test_targets_being_remediated_count_against_the_limit() -> None:
    """A limit must not be bypassed by remediations in flight (OCP MAO #898)."""
    check = Check(CHECK.unhealthy_conditions, max_unhealthy=1)
    targets = pool(2, 5)
    targets[0] = Target(**{**targets[0].__dict__, "remediating": True})
    result = evaluate(check, targets, NOW)
    assert result.unhealthy == 2
    assert not result.allowed
    assert result.remediate == []


def test_conditions_not_yet_expired_count_against_the_limit() -> None:
    """A partition: three Nodes go Unknown seconds apart. When the first one's timeout
    expires, the other two count too, and the short-circuit holds. As Cluster API
    (healthCheckTargets: a target whose condition has not lasted its timeout is neither
    healthy nor unhealthy, and unhealthy = expected - currentHealthy)."""
    check = Check(CHECK.unhealthy_conditions, max_unhealthy="40%")
    targets = [
        target("a", ready="Unknown", since=301),
        target("b", ready="Unknown", since=299),
        target("c", ready="Unknown", since=298),
        target("d"),
        target("e"),
    ]
    result = evaluate(check, targets, NOW)
    assert result.unhealthy == 3
    assert not result.allowed
    assert result.remediate == []


def test_targets_waiting_for_a_node_count_as_not_healthy() -> None:
    targets = [*pool(0, 3), target("new", node_ref=None, created=ago(30))]
    result = evaluate(CHECK, targets, NOW)
    assert (result.expected, result.healthy, result.unhealthy) == (4, 3, 1)
    assert result.remediate == []


def test_already_remediating_is_not_remediated_twice_and_healthy_again_is_withdrawn() -> None:
    sick = Target(**{**target("a", ready="Unknown", since=400).__dict__, "remediating": True})
    well = Target(**{**target("b").__dict__, "remediating": True})
    result = evaluate(CHECK, [sick, well], NOW)
    assert result.remediate == []
    assert result.withdraw == ["ns/b"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5m", 300), ("300s", 300), ("1h30m", 5400), ("0", 0), ("1.5h", 5400), ("250ms", 0.25)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


# ---- properties ------------------------------------------------------------------------

targets_strategy = st.lists(
    st.builds(
        lambda i, ready, since, remediating, has_node, found, ended: target(
            f"m{i}",
            ready=ready,
            since=since,
            remediating=remediating,
            node_ref=f"m{i}" if has_node else None,
            node_exists=found,
            remediation_ended_at=ago(ended) if ended is not None else None,
        ),
        st.integers(0, 10_000),
        st.sampled_from(["True", "False", "Unknown"]),
        st.integers(0, 1000),
        st.booleans(),
        st.booleans(),
        st.booleans(),
        st.one_of(st.none(), st.integers(-7200, 7200)),
    ),
    max_size=30,
    unique_by=lambda t: t.machine,
)
checks = st.builds(
    lambda m, r: Check(CHECK.unhealthy_conditions, max_unhealthy=m, unhealthy_range=r),
    st.one_of(st.none(), st.integers(0, 10), st.sampled_from(["0%", "40%", "50%", "100%"])),
    st.one_of(
        st.none(), st.builds(lambda a, b: f"[{a}-{b}]", st.integers(0, 10), st.integers(0, 10))
    ),
)


@settings(max_examples=300, deadline=None)
@given(check=checks, targets=targets_strategy)
def test_remediation_never_exceeds_what_the_short_circuit_allows(
    check: Check, targets: list[Target]
) -> None:
    result = evaluate(check, targets, NOW)
    if not result.allowed:
        assert result.remediate == []
    assert len(result.remediate) <= result.unhealthy
    assert all(result.verdicts[m].kind == "unhealthy" for m in result.remediate)
    assert result.healthy + result.unhealthy == result.expected == len(targets)


@settings(max_examples=200, deadline=None)
@given(check=checks, targets=targets_strategy, seed=st.integers())
def test_verdicts_do_not_depend_on_the_order_of_inputs(
    check: Check, targets: list[Target], seed: int
) -> None:
    shuffled = list(targets)
    random.Random(seed).shuffle(shuffled)
    first, second = evaluate(check, targets, NOW), evaluate(check, shuffled, NOW)
    assert first.verdicts == second.verdicts
    assert first.remediate == second.remediate
    assert first.withdraw == second.withdraw
    assert first.next_deadline == second.next_deadline


# ---- decide: what is written, requested and said -----------------------------------------


def view(*targets: Target, check: Check = CHECK, **changes: object) -> View:
    base: dict[str, object] = {"check": check, "targets": targets}
    base.update(changes)
    return View(**base)  # type: ignore[arg-type]


def conditions_written(decision: Decision[Action], machine: str) -> dict[str, dict[str, object]]:
    found = [a for a in decision.of(SetMachineConditions) if a.machine == machine]
    assert len(found) <= 1
    return {str(c["type"]): dict(c) for c in found[0].conditions} if found else {}


TEMPLATE = Template("remediation.metal3.io/v1alpha1", "Metal3Remediation", {"strategy": "reboot"})


def test_health_check_succeeded_false_is_written_on_every_unhealthy_machine_while_blocked() -> None:
    """Issue 11 point 7: the operator sees which Machines failed exactly when nothing is
    remediated (Cluster API patches every unhealthy target, also when short-circuited)."""
    blocked = Check(CHECK.unhealthy_conditions, max_unhealthy=1)
    decision = decide(view(*pool(3, 5), check=blocked), NOW)
    for i in range(3):
        written = conditions_written(decision, f"ns/m{i}")
        assert written["HealthCheckSucceeded"]["status"] == "False"
        assert written["HealthCheckSucceeded"]["reason"] == "UnhealthyNode"
        assert "OwnerRemediated" not in written
    assert decision.of(CreateRemediation) == []


def test_health_check_succeeded_false_is_written_with_a_remediation_template() -> None:
    sick = replace(target("a", ready="Unknown", since=400), uid="u-a")
    decision = decide(view(sick, remediate_by=RemediateBy.TEMPLATE, template=TEMPLATE), NOW)
    written = conditions_written(decision, "ns/a")
    assert written["HealthCheckSucceeded"]["status"] == "False"
    assert "OwnerRemediated" not in written
    create = decision.of(CreateRemediation)
    assert create == [
        CreateRemediation("ns/a", "u-a", TEMPLATE.api_version, "Metal3Remediation", TEMPLATE.spec)
    ]
    # facts first: the condition is written before the remediation object is created
    assert decision.actions.index(decision.of(SetMachineConditions)[0]) < decision.actions.index(
        create[0]
    )


def test_a_machine_being_deleted_never_gets_owner_remediated() -> None:
    """Issue 11 point 5 (Cluster API sets OwnerRemediated only on Machines not being
    deleted, and never counts them healthy)."""
    going = target("a", node_exists=False, deleting=True)
    decision = decide(view(going, target("b")), NOW)
    written = conditions_written(decision, "ns/a")
    assert written["HealthCheckSucceeded"]["status"] == "False"
    assert "OwnerRemediated" not in written
    assert [e.reason for e in decision.of(MachineEvent)] == []
    status = decision.of(SetStatus)[0].status
    assert (status.expected_machines, status.current_healthy) == (2, 1)


def test_a_healthy_machine_being_deleted_is_not_counted_healthy_nor_marked() -> None:
    decision = decide(view(target("a", deleting=True)), NOW)
    assert conditions_written(decision, "ns/a") == {}
    assert decision.of(SetStatus)[0].status.current_healthy == 0


def test_the_remediate_machine_annotation_requests_remediation_within_the_short_circuit() -> None:
    """Issue 11 point 8: a manual request, still subject to the short-circuit."""
    asked = target("a", remediation_requested=True)
    allowed = decide(view(asked, target("b")), NOW)
    assert conditions_written(allowed, "ns/a")["OwnerRemediated"]["status"] == "False"
    blocked = decide(view(asked, target("b"), check=Check(CHECK.unhealthy_conditions, max_unhealthy=0)), NOW)  # fmt: skip
    written = conditions_written(blocked, "ns/a")
    assert written["HealthCheckSucceeded"]["reason"] == "HasRemediateMachineAnnotation"
    assert "OwnerRemediated" not in written


def test_a_node_deleted_under_its_machine_is_remediated_at_once_with_startup_timeout_zero() -> None:
    """Issue 11 point 3: nodeRef is never cleared, so the deleted Node is found missing at
    once, even where nodeStartupTimeout 0 would make a Machine without nodeRef wait forever."""
    check = Check(CHECK.unhealthy_conditions, node_startup_timeout=0)
    decision = decide(view(target("a", node_exists=False), check=check), NOW)
    assert conditions_written(decision, "ns/a")["OwnerRemediated"]["status"] == "False"
    assert decision.requeue_at is None


def test_events_as_cluster_api_names_them_beside_ours() -> None:
    """Issue 11 point 10."""
    decision = decide(view(target("a", ready="Unknown", since=400), target("b", ready="Unknown", since=100)), NOW)  # fmt: skip
    on_machines = {(e.target, e.reason) for e in decision.of(MachineEvent)}
    assert on_machines == {("ns/a", "MachineMarkedUnhealthy"), ("ns/b", "DetectedUnhealthy")}
    assert "RemediationRequested" in [e.reason for e in decision.events]
    blocked = decide(view(*pool(3, 5), check=Check(CHECK.unhealthy_conditions, max_unhealthy=1)), NOW)  # fmt: skip
    assert [e.reason for e in blocked.events] == ["TooManyUnhealthy", "RemediationRestricted"]
    assert all(e.type == "Warning" for e in blocked.events)


def test_being_blocked_is_announced_only_when_it_becomes_so() -> None:
    blocked_check = Check(CHECK.unhealthy_conditions, max_unhealthy=1)
    first = decide(view(*pool(3, 5), check=blocked_check), NOW)
    status = first.of(SetStatus)[0].status
    again = decide(view(*pool(3, 5), check=blocked_check, status=status), NOW)
    assert again.events == []
    assert again.of(SetStatus) == []  # nothing changed: nothing written


def test_nothing_is_written_when_nothing_changed() -> None:
    first = decide(view(target("a"), target("b")), NOW)
    healthy = [
        replace(t, machine_conditions=conditions)
        for t, conditions in zip(
            (target("a"), target("b")), (a.conditions for a in first.of(SetMachineConditions)), strict=True
        )
    ]  # fmt: skip
    again = decide(
        view(*healthy, status=first.of(SetStatus)[0].status), NOW + dt.timedelta(hours=1)
    )
    assert again.actions == []


def test_remediation_by_template_is_withdrawn_with_the_object_uid() -> None:
    well = replace(target("a"), remediating=True, remediation_uid="r-1")
    decision = decide(view(well, remediate_by=RemediateBy.TEMPLATE, template=TEMPLATE), NOW)
    assert decision.of(DeleteRemediation) == [
        DeleteRemediation("ns/a", TEMPLATE.api_version, "Metal3Remediation", "r-1")
    ]
    being_deleted = replace(well, remediation_uid="")  # already going: not deleted again
    assert decide(view(being_deleted, remediate_by=RemediateBy.TEMPLATE, template=TEMPLATE), NOW).of(DeleteRemediation) == []  # fmt: skip


def test_remediation_by_annotation_is_requested_and_withdrawn() -> None:
    sick = target("a", ready="Unknown", since=400)
    well = replace(target("b"), remediating=True)
    decision = decide(view(sick, well, remediate_by=RemediateBy.ANNOTATION), NOW)
    assert decision.of(RequestRemediationByAnnotation) == [RequestRemediationByAnnotation("ns/a")]
    assert decision.of(WithdrawAnnotation) == [WithdrawAnnotation("ns/b")]
    assert "OwnerRemediated" not in conditions_written(decision, "ns/a")


def test_an_invalid_spec_is_reported_and_stops_until_edited() -> None:
    decision = decide(View(None, spec_error="unhealthyConditions[0] needs a timeout"), NOW)
    status = decision.of(SetStatus)[0].status
    allowed = {c["type"]: c for c in status.conditions}["RemediationAllowed"]
    assert (allowed["status"], allowed["reason"]) == ("False", "InvalidSpec")
    assert [e.reason for e in decision.events] == ["InvalidSpec"]
    assert isinstance(decision.actions[-1], StopUntilEdited)


def test_a_missing_template_is_reported_and_looked_for_again() -> None:
    missing = view(target("a"), remediate_by=RemediateBy.TEMPLATE, template_missing="not found")
    decision = decide(missing, NOW, Settings(template_retry=30))
    assert decision.requeue_at == NOW + dt.timedelta(seconds=30)
    assert [e.reason for e in decision.events] == ["RemediationTemplateNotFound"]
    assert decision.of(CreateRemediation) == []


def test_requeue_at_is_the_exact_earliest_expiry() -> None:
    decision = decide(view(target("a", ready="Unknown", since=200), target("b", node_ref=None, created=ago(590))), NOW)  # fmt: skip
    assert decision.requeue_at == ago(590) + dt.timedelta(seconds=600)


def test_check_status_keeps_the_fields_it_does_not_own_and_reads_garbage_as_absent() -> None:
    wire = {"expectedMachines": 3, "targets": ["a"], "conditions": [{"type": "X"}], "other": 1}
    status = CheckStatus.from_wire(wire)
    assert status.to_wire(wire) == wire
    assert CheckStatus.from_wire({"expectedMachines": "3", "targets": 5, "conditions": "x"}) == CheckStatus()  # fmt: skip
    assert CheckStatus.from_wire(None) == CheckStatus()


@settings(max_examples=200, deadline=None)
@given(check=checks, targets=targets_strategy, by=st.sampled_from(list(RemediateBy)))
def test_decide_never_requests_more_than_the_short_circuit_allows(
    check: Check, targets: list[Target], by: RemediateBy
) -> None:
    result = evaluate(check, targets, NOW)
    decision = decide(view(*targets, check=check, remediate_by=by, template=TEMPLATE), NOW)
    requested = {e.target for e in decision.of(MachineEvent) if e.reason == "MachineMarkedUnhealthy"}  # fmt: skip
    assert requested == set(result.remediate)
    if not result.allowed:
        assert requested == set()
    for action in decision.of(SetMachineConditions):
        kinds = {c["type"]: c["status"] for c in action.conditions}
        if kinds.get("OwnerRemediated") == "False":
            assert by == RemediateBy.CONDITIONS


def test_conditions_keep_their_order_so_another_writer_sees_no_change() -> None:
    """Cluster API writes a Machine's conditions in its own order (Ready first): a
    HealthCheckSucceeded already as wanted must not reorder the list on every reconcile."""
    theirs = (
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-20T10:00:00Z"},
        {"type": "HealthCheckSucceeded", "status": "True", "lastTransitionTime": "2026-11-20T10:00:00Z"},
        {"type": "BootstrapReady", "status": "True", "lastTransitionTime": "2026-11-20T10:00:00Z"},
    )  # fmt: skip
    assert merge_conditions(theirs, {"HealthCheckSucceeded": ("True", "", "")}, NOW) == theirs
    decision = decide(view(replace(target("a"), machine_conditions=theirs)), NOW)
    assert decision.of(SetMachineConditions) == []
