"""The health check and Cluster API's Cluster (issue 11 point 2): what is read of a
Cluster's conditions, hostile values included, and what the verdicts make of it, as
Cluster API release 1.9's ``machinehealthcheck_targets.go`` does."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metalmend.api.resources import Machine
from metalmend.controllers.clusters import (
    Cluster,
    Readiness,
    is_control_plane,
    paused,
    watched,
)
from metalmend.controllers.healthcheck import target_of
from metalmend.policy.healthcheck import (
    Check,
    Health,
    NodeCondition,
    Target,
    UnhealthyCondition,
    evaluate,
    verdict,
)

NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
CHECK = Check()  # nodeStartupTimeout: 10m


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def rfc3339(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, status: str = "True", since: Any = None) -> dict[str, Any]:
    found: dict[str, Any] = {"type": kind, "status": status}
    if since is not None:
        found["lastTransitionTime"] = rfc3339(since) if isinstance(since, dt.datetime) else since
    return found


def ready(infrastructure: float | None = 60, control_plane: float | None = 120) -> Readiness:
    conditions = []
    if infrastructure is not None:
        conditions.append(condition("InfrastructureReady", since=ago(infrastructure)))
    if control_plane is not None:
        conditions.append(condition("ControlPlaneInitialized", since=ago(control_plane)))
    return Readiness.from_wire("ns/c", {"conditions": conditions}, NOW)


def machine(labels: dict[str, str] | None = None, created: float = 7200, **status: Any) -> Any:
    return Machine.from_dict(
        {
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
            "metadata": {"name": "m", "namespace": "ns", "labels": labels or {},
                         "creationTimestamp": rfc3339(ago(created))},
            "spec": {"clusterName": "c"},
            "status": status,
        }
    )  # fmt: skip


# ---- reading the Cluster's conditions ------------------------------------------------------


def test_a_ready_cluster_counts_from_the_later_of_its_two_conditions() -> None:
    assert ready(infrastructure=60, control_plane=120).ready_at == ago(60)
    assert ready(infrastructure=300, control_plane=120).ready_at == ago(120)
    assert ready().not_ready(control_plane_machine=False) == ""


def test_only_true_conditions_count() -> None:
    status = {
        "conditions": [
            condition("InfrastructureReady", "False", ago(10)),
            condition("ControlPlaneInitialized", since=ago(500)),
        ]
    }
    found = Readiness.from_wire("ns/c", status, NOW)
    assert (found.infrastructure_ready, found.control_plane_initialized) == (False, True)
    assert found.ready_at == ago(500)


def test_the_first_condition_of_a_type_is_the_one_read() -> None:
    status = {
        "conditions": [
            condition("InfrastructureReady", "False", ago(10)),
            condition("InfrastructureReady", since=ago(20)),
        ]
    }
    assert not Readiness.from_wire("ns/c", status, NOW).infrastructure_ready


def test_a_cluster_without_infrastructure_ready_holds_every_machine_off() -> None:
    found = ready(infrastructure=None)
    assert "InfrastructureReady is not True" in found.not_ready(control_plane_machine=False)
    assert "InfrastructureReady is not True" in found.not_ready(control_plane_machine=True)


def test_an_uninitialized_control_plane_holds_off_all_but_control_plane_machines() -> None:
    """So that the first control-plane Machine can be remediated (Cluster API's exception)."""
    found = ready(control_plane=None)
    assert "ControlPlaneInitialized is not True" in found.not_ready(control_plane_machine=False)
    assert found.not_ready(control_plane_machine=True) == ""
    assert found.ready_at == ago(60)


def test_a_cluster_without_status_is_not_ready() -> None:
    found = Readiness.from_wire("ns/c", None, NOW)
    assert found == Readiness("ns/c")
    assert found.not_ready(control_plane_machine=False)


@pytest.mark.parametrize(
    "since",
    ["yesterday", "", 12345, None, "9999-12-31T23:59:59Z", rfc3339(NOW + dt.timedelta(hours=1))],
    ids=["not a time", "empty", "a number", "absent", "year 9999", "an hour ahead"],
)
def test_a_hostile_or_future_transition_time_reads_as_absent(since: Any) -> None:
    """The condition still says True (the Cluster is ready), but its time cannot hold the
    startup timeout off: the Machine's own times count."""
    status = {"conditions": [condition("InfrastructureReady", since=since),
                             condition("ControlPlaneInitialized", since=since)]}  # fmt: skip
    found = Readiness.from_wire("ns/c", status, NOW)
    assert found.infrastructure_ready
    assert found.control_plane_initialized
    assert found.ready_at is None


def test_a_time_within_the_clock_skew_allowance_is_believed() -> None:
    soon = NOW + dt.timedelta(seconds=30)
    status = {"conditions": [condition("InfrastructureReady", since=soon),
                             condition("ControlPlaneInitialized", since=ago(100))]}  # fmt: skip
    assert Readiness.from_wire("ns/c", status, NOW).ready_at == soon


@pytest.mark.parametrize(
    "status",
    [
        "ready", [], {"conditions": "InfrastructureReady"}, {"conditions": [None, 3, "x"]},
        {"conditions": [{"type": "InfrastructureReady", "status": True}]},
        {"conditions": [{"type": "InfrastructureReady", "status": "true"}]},
        {"conditions": [{"type": ["InfrastructureReady"], "status": "True"}]},
    ],
    ids=["a string", "a list", "conditions a string", "entries not objects",
         "status a boolean", "status lower case", "type a list"],
)  # fmt: skip
def test_conditions_of_the_wrong_shape_read_as_absent(status: Any) -> None:
    found = Readiness.from_wire("ns/c", status, NOW)
    assert not found.infrastructure_ready
    assert found.ready_at is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip
CONDITION = st.fixed_dictionaries(
    {"type": st.sampled_from(["InfrastructureReady", "ControlPlaneInitialized", "Ready"]) | JSON,
     "status": st.sampled_from(["True", "False", "Unknown"]) | JSON,
     "lastTransitionTime": st.datetimes(timezones=st.just(dt.UTC)).map(rfc3339) | JSON},
)  # fmt: skip


@given(status=JSON | st.fixed_dictionaries({"conditions": st.lists(CONDITION | JSON)}))
def test_any_cluster_status_reads_without_raising(status: Any) -> None:
    found = Readiness.from_wire("ns/c", status, NOW)
    assert found.ready_at is None or found.ready_at <= NOW + dt.timedelta(seconds=60)
    found.not_ready(control_plane_machine=False)


def test_only_the_two_conditions_wake_the_checks() -> None:
    def cluster(*conditions: dict[str, Any], **metadata: Any) -> Any:
        return Cluster.from_dict({"metadata": metadata or {"name": "c"},
                                  "status": {"conditions": list(conditions)}})  # fmt: skip

    infra = condition("InfrastructureReady", since=ago(5))
    other = condition("Paused", "False", ago(5))
    assert watched(cluster(infra)) == watched(cluster(infra, other))
    assert watched(cluster(infra)) == watched(cluster(infra, name="c", labels={"x": "y"}))
    assert watched(cluster(infra)) != watched(cluster())
    assert watched(None) != watched(cluster(infra))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [({"paused": True}, True), ({"paused": False}, False), ({"paused": "true"}, False),
     ({}, False), (None, False), ("paused", False)],
    ids=["paused", "not paused", "a string", "no field", "no spec", "spec a string"],
)  # fmt: skip
def test_only_spec_paused_true_pauses_a_clusters_checks(spec: Any, expected: bool) -> None:
    found = Cluster.from_dict({"metadata": {"name": "c"}, "spec": spec})
    assert paused(found) is expected
    unpaused = Cluster.from_dict({"metadata": {"name": "c"}, "spec": {}})
    assert (watched(found) != watched(unpaused)) is expected


# ---- what the health check makes of it --------------------------------------------------


def test_a_machine_created_long_ago_waits_while_its_cluster_became_ready_recently() -> None:
    """The bare-metal case of issue 11 point 2: a BareMetalHost provisioned for longer
    than nodeStartupTimeout is not replaced; its timeout counts from the Cluster."""
    found = target_of(machine(created=7200), None, NOW, False, cluster=ready(60, 120))
    assert found.cluster_ready_at == ago(60)
    assert found.cluster_not_ready == ""
    result = verdict(CHECK, found, NOW)
    assert (result.kind, result.reason) == (Health.WAITING, "NodeStartup")
    assert result.deadline == ago(60) + dt.timedelta(minutes=10)


def test_the_same_machine_without_a_known_cluster_times_out_from_its_creation() -> None:
    found = target_of(machine(created=7200), None, NOW, False)
    assert found.cluster_ready_at is None
    assert found.cluster_not_ready == ""
    result = verdict(CHECK, found, NOW)
    assert (result.kind, result.reason) == (Health.UNHEALTHY, "NodeStartupTimeout")
    assert "after creation" in result.message


def test_a_machine_whose_cluster_became_ready_over_the_timeout_ago_is_unhealthy() -> None:
    found = target_of(machine(created=7200), None, NOW, False, cluster=ready(700, 900))
    result = verdict(CHECK, found, NOW)
    assert (result.kind, result.reason) == (Health.UNHEALTHY, "NodeStartupTimeout")
    assert "its Cluster became ready" in result.message


def test_a_machine_of_a_cluster_not_ready_is_not_judged_and_not_counted_healthy() -> None:
    found = target_of(machine(), None, NOW, False, cluster=ready(infrastructure=None))
    result = verdict(CHECK, found, NOW)
    assert (result.kind, result.reason) == (Health.WAITING, "WaitingForCluster")
    assert "ns/c: InfrastructureReady is not True" in result.message
    assert result.deadline is None  # the Cluster's change wakes the check
    evaluation = evaluate(CHECK, [found], NOW)
    assert (evaluation.healthy, evaluation.unhealthy, evaluation.remediate) == (0, 1, [])


def test_a_cluster_not_ready_blocks_remediation_that_cluster_api_would_allow() -> None:
    """Where metalmend differs from Cluster API 1.9 on purpose (docs/healthcheck.md, "The
    Cluster"): upstream counts a Machine with a Node that it did not judge, because its
    Cluster is not ready, as healthy (``needsRemediation`` returns early, then
    ``healthCheckTargets`` marks it HealthCheckSucceeded=True). Two such Machines and one
    whose Node was deleted, maxUnhealthy 1: upstream's unhealthy = 3 - 2 = 1 and it
    remediates; here 3 - 0 = 3 and the short-circuit holds."""
    held = "Cluster ns/c: InfrastructureReady is not True yet"
    judged_not = [
        Target(f"ns/m{i}", ago(7200), f"n{i}", True, cluster_not_ready=held) for i in (1, 2)
    ]
    deleted = Target("ns/m3", ago(7200), "n3", False, cluster_not_ready=held)
    evaluation = evaluate(Check(max_unhealthy=1), [*judged_not, deleted], NOW)
    assert (evaluation.healthy, evaluation.unhealthy, evaluation.remediate) == (0, 3, [])


def test_a_control_plane_machine_is_judged_before_the_control_plane_is_initialized() -> None:
    cp = machine(labels={"cluster.x-k8s.io/control-plane": ""}, created=7200)
    assert is_control_plane(cp)
    found = target_of(cp, None, NOW, False, cluster=ready(infrastructure=700, control_plane=None))
    assert found.cluster_not_ready == ""
    assert verdict(CHECK, found, NOW).reason == "NodeStartupTimeout"
    worker = target_of(machine(created=7200), None, NOW, False, cluster=ready(700, None))
    assert verdict(CHECK, worker, NOW).reason == "WaitingForCluster"


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        ({"failureReason": "CreateError"}, "MachineHasFailure"),
        ({"nodeRef": {"kind": "Node", "name": "gone"}}, "NodeNotFound"),
    ],
    ids=["a failure", "a deleted Node"],
)
def test_a_failure_or_a_deleted_node_is_unhealthy_even_while_the_cluster_is_not_ready(
    status: dict[str, Any], reason: str
) -> None:
    """Cluster API judges these before it looks at the Cluster."""
    found = target_of(machine(**status), None, NOW, False, cluster=ready(None, None))
    assert verdict(CHECK, found, NOW).reason == reason


@given(
    node=st.sampled_from(["none", "missing", "found"]),
    failure=st.booleans(),
    requested=st.booleans(),
    created=st.floats(0, 1e6),
    unhealthy_for=st.floats(0, 1e6),
)
def test_a_cluster_not_ready_leaves_only_the_upstream_rules_that_come_before_it(
    node: str, failure: bool, requested: bool, created: float, unhealthy_for: float
) -> None:
    """Whatever else: a Machine held by its Cluster is never healthy, and is unhealthy
    only by a manual request, a failure or a deleted Node (Cluster API's order)."""
    found = Target(
        machine="ns/m",
        created=ago(created),
        node_ref=None if node == "none" else "n",
        node_exists=node == "found",
        conditions={"Ready": NodeCondition("False", ago(unhealthy_for))},
        failure="FailureReason: x" if failure else "",
        remediation_requested=requested,
        cluster_not_ready="Cluster ns/c: InfrastructureReady is not True yet",
    )
    check = Check(unhealthy_conditions=(UnhealthyCondition("Ready", "False", 60),))
    result = verdict(check, found, NOW)
    assert result.kind != Health.HEALTHY
    if result.kind == Health.UNHEALTHY:
        assert result.reason in (
            "HasRemediateMachineAnnotation",
            "MachineHasFailure",
            "NodeNotFound",
        )
    else:
        assert (result.reason, result.deadline) == ("WaitingForCluster", None)
