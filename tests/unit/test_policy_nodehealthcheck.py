"""NodeHealthCheck, pure: the spec as read, the short-circuit (minHealthy rounded up,
maxUnhealthy rounded down), one case per rule of what is done, and zero actions at rest."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from metalmend.api import links
from metalmend.policy.decision import Event
from metalmend.policy.healthcheck import Health, InvalidSpec, NodeCondition, UnhealthyCondition
from metalmend.policy.nodehealthcheck import (
    DEFAULT_CONDITIONS,
    EVENT_NO_HOST,
    EVENT_REMEDIATION_CREATED,
    EVENT_REMEDIATION_REMOVED,
    EVENT_REMEDIATION_SKIPPED,
    PHASE_DISABLED,
    PHASE_ENABLED,
    PHASE_PAUSED,
    PHASE_REMEDIATING,
    Check,
    CreateRemediation,
    DeleteRemediation,
    NodeCheckStatus,
    NodeEvent,
    NodeTarget,
    Remediation,
    SetStatus,
    Template,
    View,
    check_from_spec,
    decide,
    scaled,
    short_circuit,
    verdict,
)

NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
TEMPLATE = Template({"strategy": "reboot"})


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def node(name: str, ready: str = "True", since: float = 3600, **changes: object) -> NodeTarget:
    base: dict[str, object] = dict(
        name=name,
        uid=f"uid-{name}",
        conditions={"Ready": NodeCondition(ready, ago(since))},
        host=f"hosts/{name}",
    )
    base.update(changes)
    return NodeTarget(**base)  # type: ignore[arg-type]


DEFAULT = Check()


def view(*targets: NodeTarget, check: Check = DEFAULT, **changes: object) -> View:
    base: dict[str, object] = dict(check=check, targets=targets, template=TEMPLATE, generation=1)
    base.update(changes)
    return View(**base)  # type: ignore[arg-type]


def settle(v: View) -> View:
    """The view after the decision's status was written (what the watch brings back)."""
    for action in decide(v, NOW).actions:
        if isinstance(action, SetStatus):
            v = replace(v, status=action.status)
    return v


# ---- the spec ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, Check()),
        (
            {"unhealthyConditions": [{"type": "Ready", "status": "False", "duration": "1m30s"}]},
            Check(unhealthy_conditions=(UnhealthyCondition("Ready", "False", 90.0),)),
        ),
        ({"unhealthyConditions": []}, Check(unhealthy_conditions=())),
        ({"minHealthy": "60%"}, Check(min_healthy="60%")),
        ({"maxUnhealthy": 2}, Check(max_unhealthy=2)),
        ({"pauseRequests": ["upgrade by alice"]}, Check(pause_requests=("upgrade by alice",))),
    ],
    ids=["defaults", "duration", "no-conditions", "min-healthy", "max-unhealthy", "paused"],
)
def test_spec_as_read(spec: dict[str, object], expected: Check) -> None:
    assert check_from_spec(spec) == expected
    assert Check().unhealthy_conditions == DEFAULT_CONDITIONS


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"minHealthy": "51%", "maxUnhealthy": 1}, "mutually exclusive"),
        ({"minHealthy": "half"}, "neither a count nor a percentage"),
        ({"maxUnhealthy": -1}, "neither a count nor a percentage"),
        ({"unhealthyConditions": [{"type": "Ready", "status": "False"}]}, "needs a duration"),
        ({"unhealthyConditions": [{"type": "Ready", "status": "x", "duration": "5"}]}, "duration"),
        ({"pauseRequests": "now"}, "list of strings"),
    ],
    ids=["both-limits", "bad-min", "negative-max", "no-duration", "bad-duration", "bad-pauses"],
)
def test_spec_refused(spec: dict[str, object], problem: str) -> None:
    with pytest.raises(InvalidSpec, match=problem):
        check_from_spec(spec)


# ---- the short-circuit ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "expected", "healthy", "allowed"),
    [
        (Check(), 4, 3, True),  # default minHealthy 51% of 4 = 2.04 -> 3 (rounded up)
        (Check(), 4, 2, False),
        (Check(), 0, 0, True),  # nothing selected: nothing to remediate anyway
        (Check(min_healthy=2), 3, 2, True),
        (Check(min_healthy=2), 3, 1, False),
        (Check(min_healthy="100%"), 3, 3, True),
        (Check(min_healthy="100%"), 3, 2, False),
        (Check(max_unhealthy=1), 5, 4, True),
        (Check(max_unhealthy=1), 5, 3, False),
        (Check(max_unhealthy="40%"), 5, 3, True),  # 40% of 5 = 2
        (Check(max_unhealthy="40%"), 4, 2, False),  # 40% of 4 = 1.6 -> 1 (rounded down)
    ],
)
def test_short_circuit(check: Check, expected: int, healthy: int, allowed: bool) -> None:
    assert short_circuit(check, expected, healthy)[0] is allowed


def test_percentages_round_as_kubernetes_int_or_string() -> None:
    assert scaled("51%", 4, round_up=True) == 3
    assert scaled("51%", 4) == 2
    assert scaled("7", 100) == 7
    assert scaled(True, 4) is None
    assert scaled("5.5%", 4) is None


# ---- verdicts: the MachineHealthCheck's condition rule ---------------------------------------


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        (node("a"), Health.HEALTHY),
        (node("a", ready="False", since=301), Health.UNHEALTHY),
        (node("a", ready="Unknown", since=299), Health.WAITING),
        (node("a", deleting=True), Health.WAITING),
        (node("a", conditions={}), Health.HEALTHY),  # no Ready yet: nothing matches
    ],
    ids=["ready", "not-ready-long", "unknown-short", "deleting", "no-conditions"],
)
def test_verdict(target: NodeTarget, kind: Health) -> None:
    assert verdict(Check(), target, NOW).kind == kind


def test_a_waiting_node_sets_the_deadline_of_its_condition() -> None:
    decision = decide(view(node("a"), node("b", ready="False", since=100)), NOW)
    assert decision.requeue_at == ago(100) + dt.timedelta(seconds=300)


# ---- what is done -----------------------------------------------------------------------


def test_an_unhealthy_node_with_a_host_gets_a_remediation() -> None:
    v = view(node("a"), node("b"), node("c", ready="False", since=600))
    decision = decide(v, NOW)
    assert decision.of(CreateRemediation) == [
        CreateRemediation("c", "uid-c", "hosts/c", {"strategy": "reboot"})
    ]
    assert [e.reason for e in decision.events] == [EVENT_REMEDIATION_CREATED]
    (status,) = decision.of(SetStatus)
    assert status.status.observed_nodes == 3
    assert status.status.healthy_nodes == 2
    assert [u["name"] for u in status.status.unhealthy_nodes] == ["c"]
    assert decision.actions.index(status) < decision.actions.index(
        decision.of(CreateRemediation)[0]
    )


def test_a_node_without_a_host_is_reported_never_remediated() -> None:
    lost = node("c", ready="False", since=600, host="", host_problem="no metal3 providerID")
    v = view(node("a"), node("b"), lost)
    decision = decide(v, NOW)
    assert decision.of(CreateRemediation) == []
    assert EVENT_NO_HOST in [e.reason for e in decision.events]
    assert any(e.reason == EVENT_NO_HOST and "providerID" in e.message
               for e in decision.of(NodeEvent))  # fmt: skip
    # reported once: the status lists it, and the next evaluation says nothing again
    again = decide(settle(v), NOW)
    assert again.actions == []


def test_a_remediation_in_flight_is_reported_and_not_made_again() -> None:
    flight = Remediation("hosts", "c", "r-1", ago(60))
    v = view(node("a"), node("b"), node("c", ready="False", since=600, remediation=flight))
    decision = decide(v, NOW)
    assert decision.of(CreateRemediation) == []
    (status,) = decision.of(SetStatus)
    assert status.status.phase == PHASE_REMEDIATING
    assert status.status.in_flight == {"c": "2026-11-20T11:59:00.000000Z"}
    (entry,) = status.status.unhealthy_nodes
    assert entry["remediations"][0]["resource"]["uid"] == "r-1"


def test_a_node_healthy_again_has_its_remediation_deleted_exactly() -> None:
    flight = Remediation("hosts", "c", "r-1", ago(60))
    decision = decide(view(node("a"), node("c", remediation=flight)), NOW)
    assert decision.of(DeleteRemediation) == [DeleteRemediation("c", "hosts", "c", "r-1")]
    assert EVENT_REMEDIATION_REMOVED in [e.reason for e in decision.events]


def test_a_remediation_being_deleted_is_not_deleted_again() -> None:
    going = Remediation("hosts", "c", "", ago(60))
    assert decide(view(node("a"), node("c", remediation=going)), NOW).of(DeleteRemediation) == []


@pytest.mark.parametrize(
    ("check", "phase"),
    [(Check(min_healthy=3), PHASE_ENABLED), (Check(pause_requests=("me",)), PHASE_PAUSED)],
    ids=["short-circuited", "paused"],
)
def test_skipped_remediation_says_why_once(check: Check, phase: str) -> None:
    v = view(node("a"), node("b"), node("c", ready="False", since=600), check=check)
    decision = decide(v, NOW)
    assert decision.of(CreateRemediation) == []
    assert [e.reason for e in decision.events] == [EVENT_REMEDIATION_SKIPPED]
    (status,) = decision.of(SetStatus)
    assert status.status.phase == phase
    assert decide(settle(v), NOW).actions == []


def test_waiting_nodes_count_against_min_healthy() -> None:
    """Two Nodes go NotReady seconds apart: the second, not expired yet, is not healthy, so
    51% of 3 (2) is not met when the first expires (NHC would count it healthy)."""
    v = view(node("a"), node("b", ready="Unknown", since=10), node("c", ready="Unknown", since=400))
    assert decide(v, NOW).of(CreateRemediation) == []


def test_a_teardown_holds_remediation_off() -> None:
    held = node("c", ready="False", since=600, teardown="host hosts/c is being torn down")
    decision = decide(view(node("a"), node("b"), held), NOW)
    assert decision.of(CreateRemediation) == []
    assert [e.reason for e in decision.events] == [EVENT_REMEDIATION_SKIPPED]


@pytest.mark.parametrize(
    "changes",
    [
        {"spec_error": "minHealthy and maxUnhealthy are mutually exclusive"},
        {"template": None, "template_missing": "remediation template ns/t not found"},
    ],
    ids=["invalid-spec", "template-missing"],
)
def test_disabled_says_why_and_writes_once(changes: dict[str, object]) -> None:
    v = view(node("a"), node("c", ready="False", since=600), **changes)
    decision = decide(v, NOW)
    assert decision.of(CreateRemediation) == []
    (status,) = decision.of(SetStatus)
    assert status.status.phase == PHASE_DISABLED
    (condition,) = status.status.conditions
    assert condition["type"] == "Disabled"
    assert condition["status"] == "True"
    assert [type(a) for a in decision.actions] == [SetStatus, Event]
    assert decide(settle(v), NOW).actions == []


def test_at_rest_nothing_is_written() -> None:
    flight = Remediation("hosts", "c", "r-1", ago(60))
    v = view(node("a"), node("b"), node("c", ready="False", since=600, remediation=flight))
    assert decide(settle(v), NOW).actions == []


def test_status_round_trips_its_wire_format() -> None:
    flight = Remediation("hosts", "c", "r-1", ago(60))
    v = view(node("a"), node("c", ready="False", since=600, remediation=flight))
    (status,) = decide(v, NOW).of(SetStatus)
    wire = status.status.to_wire({"other": 1})
    assert wire["other"] == 1
    assert NodeCheckStatus.from_wire(wire) == status.status


# ---- a Node's host, as the Node names it (api/links.py) -------------------------------------


HOST = links.HostFacts(key="hosts/h1", uid="u-1", consumer_ref=None)


@pytest.mark.parametrize(
    ("annotations", "provider", "names_it"),
    [
        ({"metalmend.dev/baremetalhost": "hosts/h1"}, None, True),
        ({"metalmend.dev/baremetalhost": "hosts/h1"}, "k3s://n1", True),
        ({"metalmend.dev/baremetalhost": "hosts/h1"}, "metal3://hosts/h2", False),
        ({}, "metal3://hosts/h1", True),
        ({}, "metal3://hosts/h1/m3m-1", True),
        ({}, "metal3://u-1", True),
        ({}, "metal3://u-2", False),
        ({}, "metal3://other/h1", False),
        ({}, None, False),
        ({"metalmend.dev/baremetalhost": "h1"}, None, False),  # the namespace is required
    ],
)
def test_a_node_names_its_host(
    annotations: dict[str, str], provider: str | None, names_it: bool
) -> None:
    assert links.node_names_host(annotations, provider, HOST) is names_it


# ---- storm recovery (stormCooldownDuration) ---------------------------------------------------


def storm_view(*targets: NodeTarget, cooldown: float = 60) -> View:
    return view(*targets, check=Check(min_healthy=2, storm_cooldown=cooldown))


def test_a_storm_then_a_cooldown_before_new_remediations() -> None:
    # a storm: minHealthy 2, and only 1 of 3 healthy
    stormy = storm_view(node("a"), node("b", ready="False", since=600),
                        node("c", ready="False", since=600))  # fmt: skip
    decision = decide(stormy, NOW)
    assert decision.of(CreateRemediation) == []
    (status,) = decision.of(SetStatus)
    storm = {c["type"]: c for c in status.status.conditions}["StormActive"]
    assert storm["status"] == "True"
    # b comes back: 2 healthy, allowed again; the storm ends now and c waits the cooldown
    after = replace(stormy, status=status.status, targets=(
        node("a"), node("b"), node("c", ready="False", since=600),
    ))  # fmt: skip
    decision = decide(after, NOW)
    assert decision.of(CreateRemediation) == []
    assert decision.requeue_at == NOW + dt.timedelta(seconds=60)
    (status,) = decision.of(SetStatus)
    assert "cooling down" in (status.status.reason or "")
    ended = {c["type"]: c for c in status.status.conditions}["StormActive"]
    assert ended["status"] == "False"
    # later, read back (a restart in between changes nothing): after the cooldown, remediate
    settled = replace(after, status=status.status)
    assert decide(settled, NOW + dt.timedelta(seconds=30)).actions == [], "nothing at rest"
    later = decide(settled, NOW + dt.timedelta(seconds=61))
    assert [a.node for a in later.of(CreateRemediation)] == ["c"]


def test_without_a_storm_the_cooldown_changes_nothing() -> None:
    decision = decide(storm_view(node("a"), node("b"), node("c", ready="False", since=600)), NOW)
    assert [a.node for a in decision.of(CreateRemediation)] == ["c"]
    (status,) = decision.of(SetStatus)
    assert "StormActive" not in {c["type"] for c in status.status.conditions}


def test_a_remediation_whose_node_is_gone_is_reported_never_deleted() -> None:
    """Fencing by deletion removed the Node: its remediation goes on (the server is
    booting), is listed in flight, and the Node counts as not healthy."""
    flight = Remediation("hosts", "c", "r-1", ago(60))
    gone = NodeTarget(name="c", uid="", remediation=flight, exists=False)
    decision = decide(view(node("a"), node("b"), gone), NOW)
    assert decision.of(DeleteRemediation) == []
    assert decision.of(CreateRemediation) == []
    (status,) = decision.of(SetStatus)
    assert list(status.status.in_flight) == ["c"]
    assert (status.status.observed_nodes, status.status.healthy_nodes) == (3, 2)
