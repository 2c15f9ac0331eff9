"""NodeHealthCheck, pure: the spec as read, the short-circuit (minHealthy rounded up,
maxUnhealthy rounded down), one case per rule of what is done, and zero actions at rest."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from metalmend.api import links
from metalmend.api.names import NHC_CONFIRMED_HEALTHY, NHC_HEALTHY_DELAY, NHC_TIMED_OUT
from metalmend.api.stamps import stamp
from metalmend.policy.decision import Decision, Event
from metalmend.policy.healthcheck import Health, InvalidSpec, NodeCondition, UnhealthyCondition
from metalmend.policy.nodehealthcheck import (
    DEFAULT_CONDITIONS,
    EVENT_ENABLED,
    EVENT_NO_HOST,
    EVENT_NO_TEMPLATE_LEFT,
    EVENT_REMEDIATION_CREATED,
    EVENT_REMEDIATION_REMOVED,
    EVENT_REMEDIATION_SKIPPED,
    EVENT_REMEDIATION_TIMED_OUT,
    PHASE_DISABLED,
    PHASE_ENABLED,
    PHASE_PAUSED,
    PHASE_REMEDIATING,
    Action,
    AnnotateRemediation,
    Check,
    ClearNodeAnnotation,
    CreateRemediation,
    DeleteRemediation,
    NodeCheckStatus,
    NodeEvent,
    NodeTarget,
    Remediation,
    SetStatus,
    Step,
    Template,
    TemplateRef,
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
    templates = tuple(TEMPLATE for _ in check.steps)
    base: dict[str, object] = dict(check=check, targets=targets, templates=templates, generation=1)
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
    v = view(node("a"), node("b"), node("c", ready="False", since=600, remediations=(flight,)))
    decision = decide(v, NOW)
    assert decision.of(CreateRemediation) == []
    (status,) = decision.of(SetStatus)
    assert status.status.phase == PHASE_REMEDIATING
    assert status.status.in_flight == {"c": "2026-11-20T11:59:00.000000Z"}
    (entry,) = status.status.unhealthy_nodes
    assert entry["remediations"][0]["resource"]["uid"] == "r-1"


def test_a_node_healthy_again_has_its_remediation_deleted_exactly() -> None:
    flight = Remediation("hosts", "c", "r-1", ago(60))
    decision = decide(view(node("a"), node("c", remediations=(flight,))), NOW)
    assert decision.of(DeleteRemediation) == [DeleteRemediation("c", "hosts", "c", "r-1")]
    assert EVENT_REMEDIATION_REMOVED in [e.reason for e in decision.events]


def test_a_remediation_being_deleted_is_not_deleted_again() -> None:
    going = Remediation("hosts", "c", "", ago(60))
    assert decide(view(node("a"), node("c", remediations=(going,))), NOW).of(DeleteRemediation) == []


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
        {"templates": (), "template_missing": "remediation template ns/t not found"},
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
    v = view(node("a"), node("b"), node("c", ready="False", since=600, remediations=(flight,)))
    assert decide(settle(v), NOW).actions == []


def test_status_round_trips_its_wire_format() -> None:
    flight = Remediation("hosts", "c", "r-1", ago(60))
    v = view(node("a"), node("c", ready="False", since=600, remediations=(flight,)))
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
    gone = NodeTarget(name="c", uid="", remediations=(flight,), exists=False)
    decision = decide(view(node("a"), node("b"), gone), NOW)
    assert decision.of(DeleteRemediation) == []
    assert decision.of(CreateRemediation) == []
    (status,) = decision.of(SetStatus)
    assert list(status.status.in_flight) == ["c"]
    assert (status.status.observed_nodes, status.status.healthy_nodes) == (3, 2)


# ---- escalatingRemediations and healthyDelay (NHC's, node-healthcheck-operator) -------------

M3T, FRT = "Metal3RemediationTemplate", "FenceRemediationTemplate"
M3, FR = "Metal3Remediation", "FenceRemediation"


def esc(kind: str, name: str, order: int, timeout: str = "5m") -> dict[str, object]:
    ref = {"kind": kind, "namespace": "hosts", "name": name}
    return {"remediationTemplate": ref, "order": order, "timeout": timeout}


@pytest.mark.parametrize(
    ("spec", "steps", "delay"),
    [
        ({}, (Step(),), None),
        (
            {"remediationTemplate": {"kind": FRT, "namespace": "hosts", "name": "f"}},
            (Step(TemplateRef(FRT, "hosts", "f")),),
            None,
        ),
        (
            {"remediationTemplate": {"namespace": "hosts", "name": "m"}},  # kind defaulted
            (Step(TemplateRef(M3T, "hosts", "m")),),
            None,
        ),
        (
            {"escalatingRemediations": [esc(M3T, "m", 2, "10m"), esc(FRT, "f", 1, "60s")]},
            (Step(TemplateRef(FRT, "hosts", "f"), 1, 60.0),
             Step(TemplateRef(M3T, "hosts", "m"), 2, 600.0)),
            None,
        ),
        ({"healthyDelay": "90s"}, (Step(),), 90.0),
        ({"healthyDelay": "0"}, (Step(),), 0.0),
        ({"healthyDelay": "-1s"}, (Step(),), -1.0),
    ],
    ids=["default", "fence-template", "kind-defaulted", "escalation-sorted", "delay", "zero",
         "negative"],
)
def test_remediation_steps_and_healthy_delay_as_read(
    spec: dict[str, object], steps: tuple[Step, ...], delay: float | None
) -> None:
    check = check_from_spec(spec)
    assert (check.steps, check.healthy_delay) == (steps, delay)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            {"remediationTemplate": {"namespace": "hosts", "name": "m"},
             "escalatingRemediations": [esc(FRT, "f", 1)]},
            "mutually exclusive",
        ),
        ({"escalatingRemediations": [esc(FRT, "f", 1), esc(M3T, "m", 1)]}, "order must be unique"),
        ({"escalatingRemediations": [esc(FRT, "f", 1), esc(FRT, "g", 2)]}, "one template per kind"),
        ({"escalatingRemediations": [esc(FRT, "f", 1, "59s")]}, "at least one minute"),
        ({"escalatingRemediations": []}, "non-empty"),
        ({"remediationTemplate": {"kind": "SelfNodeRemediationTemplate", "namespace": "n",
                                  "name": "s"}}, "kind"),
        ({"remediationTemplate": {"kind": FRT, "apiVersion": "remediation.metal3.io/v1alpha1",
                                  "namespace": "n", "name": "s"}}, "apiVersion"),
        ({"remediationTemplate": {"name": "s"}}, "namespace and a name"),
        ({"healthyDelay": "soon"}, "duration"),
    ],
    ids=["both", "duplicate-order", "duplicate-kind", "short-timeout", "empty", "other-kind",
         "wrong-api", "no-namespace", "bad-delay"],
)  # fmt: skip
def test_remediation_steps_refused(spec: dict[str, object], problem: str) -> None:
    with pytest.raises(InvalidSpec, match=problem):
        check_from_spec(spec)


ESCALATION = Check(
    max_unhealthy=1,
    steps=(
        Step(TemplateRef(FRT, "hosts", "fence"), 1, 300.0),
        Step(TemplateRef(M3T, "hosts", "metal3"), 2, 600.0),
    ),
)
SICK = {"ready": "False", "since": 3600}


def rem(kind: str, started: float, **changes: object) -> Remediation:
    base: dict[str, object] = dict(
        namespace="hosts", name="c", uid=f"{kind}-uid", started=ago(started), kind=kind
    )
    base.update(changes)
    return Remediation(**base)  # type: ignore[arg-type]


def row(kind: str, started: float, timed_out: float | None = None) -> dict[str, object]:
    api = ("remediation.metalmend.dev/v1alpha1" if kind == FR
           else "remediation.metal3.io/v1alpha1")  # fmt: skip
    found: dict[str, object] = {
        "resource": {"apiVersion": api, "kind": kind, "namespace": "hosts", "name": "c",
                     "uid": f"{kind}-uid"},
        "started": stamp(ago(started)),
    }  # fmt: skip
    if timed_out is not None:
        found["timedOut"] = stamp(ago(timed_out))
    return found


def with_status(v: View, *rows: dict[str, object]) -> View:
    status = NodeCheckStatus(unhealthy_nodes=({"name": "c", "remediations": list(rows)},))
    return replace(v, status=status)


def annotated(decision: Decision[Action]) -> list[tuple[str, str, str]]:
    return [(a.kind, a.key, a.value) for a in decision.of(AnnotateRemediation)]


def created(decision: Decision[Action]) -> list[tuple[str, str]]:
    return [(a.kind, a.template) for a in decision.of(CreateRemediation)]


@pytest.mark.parametrize(
    ("remediations", "rows", "made", "marks", "reasons", "requeue"),
    [
        # nothing yet: the lowest order's object
        ((), (), [(FR, "fence")], [], [EVENT_REMEDIATION_CREATED], None),
        # within its timeout: wait until it expires
        ((rem(FR, 100),), (), [], [], [], ago(100) + dt.timedelta(seconds=300)),
        # timed out: annotated, and the next step's object made in the same decision
        ((rem(FR, 300),), (), [(M3, "metal3")],
         [(FR, NHC_TIMED_OUT, stamp(NOW))],
         [EVENT_REMEDIATION_TIMED_OUT, EVENT_REMEDIATION_CREATED], None),
        # Succeeded=False before the timeout: escalated at once
        ((rem(FR, 10, succeeded=False),), (), [(M3, "metal3")],
         [(FR, NHC_TIMED_OUT, stamp(NOW))],
         [EVENT_REMEDIATION_TIMED_OUT, EVENT_REMEDIATION_CREATED], None),
        # Succeeded=True but the Node still unhealthy at the timeout: no annotation (NHC's)
        ((rem(FR, 400, succeeded=True),), (), [(M3, "metal3")], [],
         [EVENT_REMEDIATION_TIMED_OUT, EVENT_REMEDIATION_CREATED], None),
        # a restart after the status said timed out, before the annotation: put back
        ((rem(FR, 400),), (row(FR, 400, 50),), [(M3, "metal3")],
         [(FR, NHC_TIMED_OUT, stamp(ago(50)))], [EVENT_REMEDIATION_CREATED], None),
        # a restart after the annotation, before the status: the annotation is enough
        ((rem(FR, 400, timed_out=ago(50)), rem(M3, 40)), (), [], [], [],
         ago(40) + dt.timedelta(seconds=600)),
        # the timed-out object was deleted by someone: the status remembers the step
        ((rem(M3, 40),), (row(FR, 400, 50),), [], [], [], ago(40) + dt.timedelta(seconds=600)),
        # the last step times out: no template left, said once
        ((rem(FR, 1000, timed_out=ago(700)), rem(M3, 700)), (), [],
         [(M3, NHC_TIMED_OUT, stamp(NOW))], [EVENT_REMEDIATION_TIMED_OUT, EVENT_NO_TEMPLATE_LEFT],
         None),
        # all timed out already: nothing more
        ((rem(FR, 1000, timed_out=ago(700)), rem(M3, 700, timed_out=ago(60))), (), [], [], [],
         None),
    ],
    ids=["first", "within-timeout", "timed-out", "failed", "succeeded-but-unhealthy",
         "status-first", "annotation-first", "object-gone", "last-times-out", "exhausted"],
)  # fmt: skip
def test_escalation(
    remediations: tuple[Remediation, ...],
    rows: tuple[dict[str, object], ...],
    made: list[tuple[str, str]],
    marks: list[tuple[str, str, str]],
    reasons: list[str],
    requeue: dt.datetime | None,
) -> None:
    v = view(node("a"), node("b"), node("c", **SICK, remediations=remediations), check=ESCALATION)
    v = with_status(v, *rows) if rows else v
    decision = decide(v, NOW)
    assert created(decision) == made
    assert annotated(decision) == marks
    assert [e.reason for e in decision.events if e.reason != EVENT_ENABLED] == reasons
    assert decision.requeue_at == requeue


def test_escalation_state_is_in_the_status_and_a_restart_resumes_it() -> None:
    """Step 1 times out: the status says so (timedOut) with the object's start; read back
    (a restart), nothing is done again until step 2's object is seen, then it waits."""
    first = rem(FR, 300)
    v = view(node("a"), node("b"), node("c", **SICK, remediations=(first,)), check=ESCALATION)
    decision = decide(v, NOW)
    (status,) = decision.of(SetStatus)
    (entry,) = status.status.unhealthy_nodes
    assert entry["remediations"] == [{**row(FR, 300), "timedOut": stamp(NOW)}]
    assert status.status.phase == PHASE_REMEDIATING
    # read back before the watch brings step 2's object or the annotation: the status alone
    again = replace(v, status=status.status)
    assert annotated(decide(again, NOW)) == [(FR, NHC_TIMED_OUT, stamp(NOW))]
    assert created(decide(again, NOW)) == [(M3, "metal3")]
    # both objects seen: nothing to do but wait for step 2's timeout
    both = replace(again, targets=(node("a"), node("b"), node("c", **SICK, remediations=(
        replace(first, timed_out=NOW), rem(M3, 0, template="metal3"),
    ))))  # fmt: skip
    settled = settle(both)
    assert decide(settled, NOW).actions == []
    assert decide(settled, NOW).requeue_at == NOW + dt.timedelta(seconds=600)
    (entry,) = settled.status.unhealthy_nodes
    assert [r["resource"]["kind"] for r in entry["remediations"]] == [FR, M3]
    assert [r.get("timedOut") for r in entry["remediations"]] == [stamp(NOW), None]


def test_no_escalation_while_remediation_is_held() -> None:
    """Short-circuited or paused: no timeout is handled and nothing new made (as NHC)."""
    held = Check(min_healthy=3, steps=ESCALATION.steps)
    v = view(node("a"), node("b"), node("c", **SICK, remediations=(rem(FR, 900),)), check=held)
    decision = decide(v, NOW)
    assert created(decision) == []
    assert annotated(decision) == []


DELAYED = Check(healthy_delay=120.0)


@pytest.mark.parametrize(
    ("check", "remediation", "confirmed", "deleted", "marks", "delayed", "requeue"),
    [
        (Check(), rem(M3, 600), False, True, [], False, None),
        (Check(healthy_delay=0.0), rem(M3, 600), False, True, [], False, None),
        # first healthy look: the delay starts (annotated), the object stays
        (DELAYED, rem(M3, 600), False, False, [(M3, NHC_HEALTHY_DELAY, stamp(NOW))], True,
         NOW + dt.timedelta(seconds=120)),
        (DELAYED, rem(M3, 600, healthy_since=ago(60)), False, False, [], True,
         ago(60) + dt.timedelta(seconds=120)),
        (DELAYED, rem(M3, 600, healthy_since=ago(120)), False, True, [], True, None),
        # negative: never automatically
        (Check(healthy_delay=-1.0), rem(M3, 600), False, False, [], False, None),
        # the Node's manually-confirmed-healthy annotation cuts any delay short
        (Check(healthy_delay=-1.0), rem(M3, 600), True, True, [], False, None),
        (DELAYED, rem(M3, 600, healthy_since=ago(10)), True, True, [], True, None),
    ],
    ids=["unset", "zero", "starts", "running", "expired", "never", "confirmed-never",
         "confirmed-delayed"],
)  # fmt: skip
def test_healthy_delay(
    check: Check,
    remediation: Remediation,
    confirmed: bool,
    deleted: bool,
    marks: list[tuple[str, str, str]],
    delayed: bool,
    requeue: dt.datetime | None,
) -> None:
    target = node("c", remediations=(remediation,), confirmed_healthy=confirmed)
    decision = decide(view(node("a"), node("b"), target, check=check), NOW)
    assert bool(decision.of(DeleteRemediation)) is deleted
    assert annotated(decision) == marks
    assert decision.requeue_at == requeue
    (status,) = decision.of(SetStatus)
    # not healthy until its remediations are gone; listed with when it was seen healthy
    assert status.status.healthy_nodes == 2
    (entry,) = status.status.unhealthy_nodes
    assert entry["conditionsHealthyTimestamp"] == stamp(NOW)
    assert entry.get("healthyDelayed", False) is delayed
    assert decision.of(ClearNodeAnnotation) == []


def test_the_confirmed_healthy_annotation_is_removed_once_the_remediations_are_gone() -> None:
    decision = decide(view(node("a"), node("c", confirmed_healthy=True)), NOW)
    assert decision.of(ClearNodeAnnotation) == [ClearNodeAnnotation("c", NHC_CONFIRMED_HEALTHY)]
    (status,) = decision.of(SetStatus)
    assert status.status.healthy_nodes == 2


def test_the_healthy_timestamp_is_kept_across_evaluations() -> None:
    target = node("c", remediations=(rem(M3, 600, healthy_since=ago(60)),))
    v = view(node("a"), target, check=DELAYED)
    first = settle(v)
    later = decide(first, NOW + dt.timedelta(seconds=30))
    assert later.of(SetStatus) == [], "nothing new to say while the delay runs"
