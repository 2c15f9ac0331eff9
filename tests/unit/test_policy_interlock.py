"""Invariant 7 (docs/design.md): teardown and remediation never act on the same host at once.
The pure rules of both sides (policy.interlock, and the holds in policy.remediation,
policy.machineremediation and policy.healthcheck), table by table; no I/O."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metalmend.api import names
from metalmend.policy import healthcheck as hc
from metalmend.policy import interlock as il
from metalmend.policy import machineremediation as mr
from metalmend.policy import remediation as r
from metalmend.policy.decision import Event, EventType
from metalmend.policy.fencing import HostPower

NOW = dt.datetime(2026, 11, 23, 18, 0, tzinfo=dt.UTC)
M3_KEY = f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}u-1"
CLAIM = il.Claim("n1", "uid-n1", "alice", NOW - dt.timedelta(hours=1), "drain")
WIRE = CLAIM.to_wire()


# ---- the claim as read: any value claims, fields read with suspicion ------------------------

READS = [
    ("no annotation: no claim", None, None),
    ("teardown's own value reads back", WIRE, CLAIM),
    ("an empty value still claims the host, unreadable", "", il.Claim(readable=False)),
    ("garbage still claims the host, unreadable", "yes please", il.Claim(readable=False, raw="yes please")),
    ("a JSON list is not a claim's fields", "[1, 2]", il.Claim(readable=False, raw="[1, 2]")),
    ("fields of the wrong type read as empty", '{"node": 7, "by": ["x"], "since": "never"}',
     il.Claim(raw='{"node": 7, "by": ["x"], "since": "never"}')),
    ("nesting deep enough to break the parser is unreadable, not a crash", "[" * 100_000,
     il.Claim(readable=False, raw="[" * 100_000)),
]  # fmt: skip


@pytest.mark.parametrize(("value", "claim"), [pytest.param(v, c, id=i) for i, v, c in READS])
def test_a_claim_reads_from_any_value(value: str | None, claim: il.Claim | None) -> None:
    found = il.Claim.from_wire(value)
    if claim is None:
        assert found is None
        return
    assert found is not None
    assert (found.node, found.node_uid, found.by, found.since, found.step, found.readable) == (
        claim.node, claim.node_uid, claim.by, claim.since, claim.step, claim.readable,
    )  # fmt: skip


def test_a_hostile_claim_is_shown_cut_and_without_control_characters() -> None:
    value = json.dumps({"node": "n1\x1b[31m\nEvil", "by": "x" * 10_000, "step": "drain"})
    said = il.Claim.from_wire(value).describe()  # type: ignore[union-attr]
    assert "\x1b" not in said
    assert "\n" not in said
    assert len(said) < 400
    assert "...(cut)" in said
    unreadable = il.Claim.from_wire("\x00" * 5000).describe()  # type: ignore[union-attr]
    assert "\x00" not in unreadable
    assert len(unreadable) < 300


@given(
    st.one_of(
        st.text(max_size=3000),
        st.dictionaries(
            st.sampled_from(["node", "nodeUID", "by", "since", "step", "x"]),
            st.one_of(st.text(max_size=500), st.integers(), st.none(), st.lists(st.text())),
        ).map(json.dumps),
    )
)
def test_any_claim_value_reads_and_describes_in_one_bounded_printable_line(value: str) -> None:
    claim = il.Claim.from_wire(value)
    assert claim is not None
    said = il.hold_message("ns/h1", claim, il.claim_stale(claim, "n1", "u"))
    assert said.isprintable()
    assert len(said) < 1200


def test_the_claim_says_who_since_when_and_which_step() -> None:
    assert CLAIM.describe() == (
        "a teardown of Node n1 (step drain, by alice, since 2026-11-23T17:00:00.000000Z)"
    )


STALE = [
    ("the claimed Node itself: current", ("n1", "uid-n1"), False),
    ("the claimed Node gone (removed from the cluster): current", (None, None), False),
    ("a Node of that name registered again (another uid): stale", ("n1", "uid-new"), True),
    ("another Node on the host: stale", ("n2", "uid-n2"), True),
]  # fmt: skip


@pytest.mark.parametrize(("node", "stale"), [pytest.param(n, s, id=i) for i, n, s in STALE])
def test_a_claim_is_stale_once_its_node_was_replaced(
    node: tuple[str | None, str | None], stale: bool
) -> None:
    assert il.claim_stale(CLAIM, *node) is stale


def test_a_claim_naming_no_node_is_never_called_stale() -> None:
    assert not il.claim_stale(il.Claim(readable=False), "n2", "uid-n2")


# ---- the teardown side: claim, or refuse naming the remediation ----------------------------


def host(**annotations: str) -> il.HostFacts:
    return il.HostFacts("ns/h1", annotations)


def teardown(*hosts: il.HostFacts, step: str = "drain") -> il.TeardownView:
    return il.TeardownView("n1", "uid-n1", step, "alice", hosts)


def m3(phase: str) -> il.RemediationFacts:
    return il.RemediationFacts("ns/m1", phase)


REFUSED = [
    ("a metal3 remediation's reboot key", host(**{M3_KEY: '{"mode":"hard"}'}), M3_KEY),
    ("the annotation flow's reboot key", host(**{names.MACHINE_REMEDIATION_REBOOT: ""}), names.MACHINE_REMEDIATION_REBOOT),
    ("a Metal3Remediation powering the host off", replace(host(), remediations=(m3("power-off"),)), "phase power-off"),
    ("a Metal3Remediation fencing the Node", replace(host(), remediations=(m3("fencing"),)), "phase fencing"),
    ("a Metal3Remediation powering the host on", replace(host(), remediations=(m3("power-on"),)), "phase power-on"),
    ("a Metal3Remediation deleting the Machine", replace(host(), remediations=(m3("deleting-machine"),)), "phase deleting-machine"),
    ("a Machine asking for remediation by annotation", replace(host(), requests=("ns/m1",)), names.EXTERNAL_REMEDIATION),
    ("an escalation marking the host before deleting its Machine", host(**{names.ESCALATING: M3_KEY}), "being escalated"),
    ("an escalation marker written around the protocol still refuses (a tenant's own host)", host(**{names.ESCALATING: "\x1b[31m"}), "being escalated"),
]  # fmt: skip


@pytest.mark.parametrize(("facts", "named"), [pytest.param(h, n, id=i) for i, h, n in REFUSED])
def test_teardown_is_refused_while_a_remediation_holds_the_host_naming_it(
    facts: il.HostFacts, named: str
) -> None:
    decision = il.decide_claims(teardown(facts), NOW)
    assert decision.refused
    assert not decision.claims
    assert named in decision.refusals[0]
    assert named in il.refusal_message("n1", decision.refusals)


FREE = [
    ("a free host", host()),
    ("a Metal3Remediation with no phase yet (it starts by adding its key)", replace(host(), remediations=(m3(""),))),
    ("a Metal3Remediation waiting for the health check", replace(host(), remediations=(m3("waiting"),))),
    ("a Metal3Remediation in backoff (its next attempt adds its key)", replace(host(), remediations=(m3("backoff"),))),
    ("a Metal3Remediation that failed to start", replace(host(), remediations=(m3("failed"),))),
    ("a user's own reboot annotation is no remediation", host(**{"reboot.metal3.io/maintenance": ""})),
    ("another Node's old claim is replaced", host(**{il.TEARDOWN_ANNOTATION: il.Claim("n0", "uid-n0", step="drain").to_wire()})),
    ("an unreadable claim is replaced", host(**{il.TEARDOWN_ANNOTATION: "garbage"})),
]  # fmt: skip


@pytest.mark.parametrize("facts", [pytest.param(h, id=i) for i, h in FREE])
def test_teardown_claims_a_host_no_remediation_holds(facts: il.HostFacts) -> None:
    decision = il.decide_claims(teardown(facts), NOW)
    assert not decision.refused
    [claim] = decision.claims
    written = il.Claim.from_wire(claim.value)
    assert claim.host == "ns/h1"
    assert written == il.Claim("n1", "uid-n1", "alice", NOW, "drain", raw=claim.value)


def test_the_same_step_of_the_same_teardown_writes_nothing_again() -> None:
    decision = il.decide_claims(teardown(host(**{il.TEARDOWN_ANNOTATION: WIRE})), NOW)
    assert not decision.refused
    assert decision.claims == ()


def test_a_later_step_of_the_same_teardown_keeps_its_since_and_names_the_step() -> None:
    view = teardown(host(**{il.TEARDOWN_ANNOTATION: WIRE}), step="decommission: clear-labels")
    [claim] = il.decide_claims(view, NOW).claims
    written = il.Claim.from_wire(claim.value)
    assert written is not None
    assert (written.since, written.step) == (CLAIM.since, "decommission: clear-labels")


def test_a_node_without_host_is_claimed_nowhere_and_not_refused() -> None:
    assert il.decide_claims(teardown(), NOW) == il.ClaimDecision()


def test_one_held_host_of_several_refuses_the_teardown_and_claims_none() -> None:
    held = replace(host(**{M3_KEY: ""}), key="ns/h2")
    decision = il.decide_claims(teardown(host(), held), NOW)
    assert decision.refused
    assert decision.claims == ()


def test_a_remediation_holding_the_host_wins_over_a_claim_written_around_the_protocol() -> None:
    both = host(**{il.TEARDOWN_ANNOTATION: WIRE, M3_KEY: ""})
    assert il.decide_claims(teardown(both), NOW).refused


# ---- metal3-remediation under a claim -----------------------------------------------------

ON = HostPower(holds_key=False, powered_on=True, acknowledged=False, power_on_in_flight=False)
HELD_ON = replace(ON, holds_key=True)


def m3_host(power: HostPower = ON, claim: il.Claim | None = CLAIM) -> r.HostView:
    return r.HostView("ns/h1", True, power, None, "", teardown=claim)


def m3_observed(phase: r.Phase | None = None, **changes: Any) -> r.Observed:
    progress = r.Progress(phase=phase, phase_since=NOW - dt.timedelta(hours=2), node="n1",
                          retry_count=changes.pop("retry_count", 0))  # fmt: skip
    base: dict[str, Any] = dict(
        spec=r.Spec(strategy=r.Strategy.ESCALATE, delete_after_retries=1),
        progress=progress, has_finalizer=True, deleting_since=None, machine_found=True,
        machine_node="n1", host=m3_host(), host_problem="",
        node=r.NodeView("n1", "uid-n1", False, {}, {}, False), backup=None,
    )  # fmt: skip
    base.update(changes)
    return r.Observed(**base)


def work(decision: Any) -> list[str]:
    return [type(a).__name__ for a in decision.actions if not isinstance(a, Event)]


HOLDS = [
    ("a new remediation adds no key", m3_observed()),
    ("backoff over: no next attempt", m3_observed(r.Phase.BACKOFF)),
    ("waiting past its deadline: no failed attempt, no escalation", m3_observed(r.Phase.WAITING)),
    ("retries used up: the Machine is not deleted", m3_observed(r.Phase.FAILED, retry_count=5)),
    ("power-off whose key went missing: not asked again", m3_observed(r.Phase.POWER_OFF)),
    ("power-on past its deadline: no failed attempt", m3_observed(r.Phase.POWER_ON)),
]  # fmt: skip


@pytest.mark.parametrize("seen", [pytest.param(o, id=i) for i, o in HOLDS])
def test_metal3_remediation_acts_on_nothing_while_a_teardown_claims_the_host(
    seen: r.Observed,
) -> None:
    decision = r.decide(seen, NOW)
    assert work(decision) == ["SetProgress"]
    [event] = decision.events
    assert (event.reason, event.type) == (il.REASON_HELD_BY_TEARDOWN, EventType.NORMAL)
    assert "claimed by a teardown of Node n1 (step drain, by alice" in event.message
    assert decision.requeue_at is None  # the claim's removal (a host event) wakes it


def test_metal3_remediation_says_it_waits_once() -> None:
    first = r.decide(m3_observed(), NOW)
    [said] = first.of(r.SetProgress)
    again = r.decide(m3_observed(progress=said.progress), NOW)
    assert again.actions == []


def test_metal3_remediation_holding_its_key_finishes_its_attempt_despite_a_claim() -> None:
    """It took the host first (the claim was written around the protocol): stopping
    half way would leave the host off. It decides as if there were no claim."""
    off = HostPower(holds_key=True, powered_on=False, acknowledged=True, power_on_in_flight=False)
    for phase, power in ((r.Phase.POWER_OFF, HELD_ON), (r.Phase.FENCING, off)):
        claimed = m3_observed(phase, host=m3_host(power))
        free = m3_observed(phase, host=m3_host(power, claim=None))
        assert r.decide(claimed, NOW) == r.decide(free, NOW)
    assert "DeleteNode" in work(r.decide(m3_observed(r.Phase.FENCING, host=m3_host(off)), NOW))


def test_metal3_remediation_warns_of_a_stale_claim() -> None:
    replaced = r.NodeView("n1", "uid-new", True, {}, {}, False)
    decision = r.decide(m3_observed(node=replaced), NOW)
    [event] = decision.events
    assert (event.reason, event.type) == (il.REASON_STALE_CLAIM, EventType.WARNING)
    assert f"remove annotation {il.TEARDOWN_ANNOTATION}" in event.message


def test_a_metal3_remediation_being_deleted_releases_the_host_whatever_the_claim() -> None:
    decision = r.decide(m3_observed(r.Phase.POWER_OFF, deleting_since=NOW), NOW)
    assert "RemoveFinalizer" in work(decision)


# ---- machine-remediation (annotation flow) under a claim ----------------------------------


def mr_view(**changes: Any) -> mr.View:
    base = mr.View(
        host="ns/h1", host_found=True, machine="ns/m1", needs_remediation=True,
        node_ref="n1", node=mr.NodeView("n1", "uid-n1"), fence_refusal="", power=ON,
        other_remediation=None, teardown=CLAIM,
    )  # fmt: skip
    return replace(base, **changes)


def test_the_annotation_flow_asks_no_power_off_while_a_teardown_claims_the_host() -> None:
    decision = mr.decide(mr_view(), NOW)
    assert not decision.of(mr.RequestPowerOff)
    [event] = decision.events
    assert event.reason == il.REASON_HELD_BY_TEARDOWN
    assert "remediation waits" in event.message
    assert mr.decide(mr_view(teardown=None), NOW).of(mr.RequestPowerOff)


def test_the_annotation_flow_holding_its_key_fences_and_releases_despite_a_claim() -> None:
    off = HostPower(holds_key=True, powered_on=False, acknowledged=True, power_on_in_flight=False)
    assert mr.decide(mr_view(power=off), NOW).of(mr.DeleteNode)
    released = mr.decide(mr_view(power=off, needs_remediation=False), NOW)
    assert released.of(mr.ReleasePower)


def test_the_annotation_flow_warns_of_a_stale_claim() -> None:
    decision = mr.decide(mr_view(node=mr.NodeView("n1", "uid-new")), NOW)
    [event] = decision.events
    assert (event.reason, event.type) == (il.REASON_STALE_CLAIM, EventType.WARNING)


# ---- the health check: reports, does not remediate ---------------------------------------

CHECK = hc.Check(unhealthy_conditions=(hc.UnhealthyCondition("Ready", "Unknown", 300),))
HOLD = il.hold_message("ns/h1", CLAIM, False)


def target(ready: str = "Unknown", **changes: Any) -> hc.Target:
    base: dict[str, Any] = dict(
        machine="ns/m1", created=NOW - dt.timedelta(days=1), node_ref="n1", node_exists=True,
        conditions={"Ready": hc.NodeCondition(ready, NOW - dt.timedelta(hours=1))},
        teardown=HOLD,
    )  # fmt: skip
    base.update(changes)
    return hc.Target(**base)


def check_view(*targets: hc.Target, by: hc.RemediateBy = hc.RemediateBy.ANNOTATION) -> hc.View:
    return hc.View(check=CHECK, targets=targets, remediate_by=by)


def written(decision: Any) -> dict[str, dict[str, Any]]:
    [found] = decision.of(hc.SetMachineConditions)
    return {str(c["type"]): dict(c) for c in found.conditions}


@pytest.mark.parametrize("by", list(hc.RemediateBy))
def test_the_health_check_reports_a_torn_down_machine_unhealthy_and_does_not_remediate_it(
    by: hc.RemediateBy,
) -> None:
    template = hc.Template("remediation.metal3.io/v1alpha1", "Metal3Remediation", {})
    view = replace(check_view(target(), by=by), template=template)
    decision = hc.decide(view, NOW)
    assert not decision.of(hc.RequestRemediationByAnnotation)
    assert not decision.of(hc.CreateRemediation)
    conditions = written(decision)
    assert conditions[names.CONDITION_HEALTH_CHECK_SUCCEEDED]["status"] == "False"
    assert names.CONDITION_OWNER_REMEDIATED not in conditions
    held = conditions[il.CONDITION_HOST_AVAILABLE]
    assert (held["status"], held["reason"], held["message"]) == (
        "False", il.REASON_BEING_TORN_DOWN, HOLD,
    )  # fmt: skip
    [told] = [e for e in decision.of(hc.MachineEvent) if e.reason == il.REASON_REMEDIATION_HELD]
    assert told.type == EventType.WARNING
    assert HOLD in told.message


def test_the_health_check_says_it_once() -> None:
    first = hc.decide(check_view(target()), NOW)
    conditions = tuple(written(first).values())
    again = hc.decide(check_view(target(machine_conditions=conditions)), NOW)
    assert not again.of(hc.SetMachineConditions)
    assert not again.of(hc.MachineEvent)


def test_a_healthy_machine_of_a_claimed_host_carries_the_condition_without_a_warning() -> None:
    decision = hc.decide(check_view(target(ready="True")), NOW)
    assert written(decision)[il.CONDITION_HOST_AVAILABLE]["status"] == "False"
    assert not decision.of(hc.MachineEvent)


def test_once_the_claim_is_gone_the_condition_turns_true_and_remediation_is_asked() -> None:
    held = tuple(written(hc.decide(check_view(target()), NOW)).values())
    decision = hc.decide(check_view(target(teardown="", machine_conditions=held)), NOW)
    assert written(decision)[il.CONDITION_HOST_AVAILABLE]["status"] == "True"
    assert decision.of(hc.RequestRemediationByAnnotation)


def test_machines_never_claimed_carry_no_such_condition() -> None:
    decision = hc.decide(check_view(target(teardown="")), NOW)
    assert il.CONDITION_HOST_AVAILABLE not in written(decision)


def test_a_torn_down_machine_still_counts_against_the_short_circuit() -> None:
    evaluation = hc.evaluate(CHECK, [target()], NOW)
    assert (evaluation.unhealthy, evaluation.remediate) == (1, [])
