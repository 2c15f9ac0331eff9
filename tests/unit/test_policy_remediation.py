"""Metal3Remediation decisions, phase by phase (pure: no I/O)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest

from metalmend.policy import remediation as r
from metalmend.policy.fencing import (
    HostPower,
    host_power,
    other_remediation,
    reported_off,
    withdrawal_unseen,
)
from metalmend.policy.interlock import Claim

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
UID = "u-1"
KEY = f"reboot.metal3.io/metal3-remediation-{UID}"


def sec(n: float) -> dt.timedelta:
    return dt.timedelta(seconds=n)


OFF_FOR_US = HostPower(
    holds_key=True, powered_on=False, acknowledged=True, power_on_in_flight=False
)
ON = HostPower(holds_key=False, powered_on=True, acknowledged=False, power_on_in_flight=False)
# our key gone, but host-power has not seen it removed: still listed in poweredOffFor
WITHDRAWAL_UNSEEN = replace(OFF_FOR_US, holds_key=False)


def host(power: HostPower = ON, **kw: Any) -> r.HostView:
    fields: dict[str, Any] = dict(
        key="ns/h1", online=True, power=power, other_remediation=None, bmc_error=""
    )
    fields.update(kw)
    return r.HostView(**fields)


def node(uid: str = "n-1", ready: bool = False, **kw: Any) -> r.NodeView:
    fields: dict[str, Any] = dict(
        name="node-1",
        uid=uid,
        ready=ready,
        labels={"role": "worker", "zone": "a"},
        annotations={"team": "storage"},
        out_of_service=False,
    )
    fields.update(kw)
    return r.NodeView(**fields)


def observed(phase: str = "", **kw: Any) -> r.Observed:
    progress = kw.pop("progress", r.Progress(phase=phase, phase_since=T0, node="node-1"))
    fields: dict[str, Any] = dict(
        spec=r.Spec(power_off_timeout=60, power_on_timeout=300),
        progress=progress,
        has_finalizer=True,
        deleting_since=None,
        machine_found=True,
        machine_node="node-1",
        host=host(),
        host_problem="",
        node=node(),
        backup=None,
    )
    fields.update(kw)
    return r.Observed(**fields)


def kinds(decision: r.Decision) -> list[str]:
    return [type(a).__name__ for a in decision.actions if not isinstance(a, r.Event)]


def progress_of(decision: r.Decision) -> r.Progress:
    return [a for a in decision.actions if isinstance(a, r.SetProgress)][-1].progress


# ---- the evidence that the host is off --------------------------------------------------------


def test_reported_off_needs_host_power_to_have_read_off_for_our_own_key() -> None:
    assert reported_off(OFF_FOR_US)
    # off, but read for another key (or before ours was added): not for us
    assert not reported_off(replace(OFF_FOR_US, acknowledged=False))
    assert not reported_off(replace(OFF_FOR_US, holds_key=False))
    assert not reported_off(replace(OFF_FOR_US, power_on_in_flight=True))
    assert not reported_off(replace(OFF_FOR_US, powered_on=None))


def test_host_power_reads_our_key_in_powered_off_for() -> None:
    other = "reboot.metal3.io/machine-remediation"
    status: dict[str, Any] = {"poweredOn": False, "poweredOffFor": [other]}
    assert not reported_off(host_power(status, {KEY: "", other: ""}, KEY))  # not ours
    status["poweredOffFor"] = [KEY]
    assert reported_off(host_power(status, {KEY: ""}, KEY))
    assert withdrawal_unseen(host_power(status, {}, KEY))
    in_flight = {**status, "lastPowerCommand": {"action": "on", "at": "2026-03-01T12:00:00Z"}}
    assert not reported_off(host_power(in_flight, {KEY: ""}, KEY))
    assert not reported_off(host_power({"poweredOffFor": "garbage"}, {KEY: ""}, KEY))


def test_other_remediation_keys() -> None:
    annotations = {
        KEY: "",
        "reboot.metal3.io/maintenance": "",
        "reboot.metal3.io/machine-remediation": "",
    }
    assert other_remediation(annotations, KEY) == "reboot.metal3.io/machine-remediation"
    assert other_remediation({KEY: "", "reboot.metal3.io/x": ""}, KEY) is None


# ---- starting --------------------------------------------------------------------------------


def test_finalizer_comes_first() -> None:
    decision = r.decide(observed(has_finalizer=False), T0)
    assert kinds(decision) == ["AddFinalizer"]


def test_new_object_asks_for_power_off_after_recording_the_phase() -> None:
    decision = r.decide(observed(progress=r.Progress()), T0)
    assert kinds(decision) == ["SetProgress", "RequestPowerOff"]
    progress = progress_of(decision)
    assert (progress.phase, progress.node, progress.phase_since) == (r.POWER_OFF, "node-1", T0)
    assert decision.requeue_at == T0 + sec(60)


def test_another_remediation_on_the_host_waits() -> None:
    busy = host(other_remediation="reboot.metal3.io/machine-remediation")
    decision = r.decide(observed(progress=r.Progress(), host=busy), T0)
    assert kinds(decision) == ["SetProgress"]
    assert "machine-remediation" in progress_of(decision).message
    assert progress_of(decision).phase is None


def test_a_key_still_listed_from_before_is_added_again_only_once_host_power_saw_it_go() -> None:
    # The previous attempt's key was removed and host-power has not reconciled since: its
    # acknowledgement would count for the new request at once.
    decision = r.decide(observed(progress=r.Progress(), host=host(WITHDRAWAL_UNSEEN)), T0)
    assert "RequestPowerOff" not in kinds(decision)
    assert "host-power" in progress_of(decision).message
    assert progress_of(decision).phase is None
    seen = r.decide(observed(progress=r.Progress(), host=host(ON)), T0)  # listing dropped
    assert kinds(seen) == ["SetProgress", "RequestPowerOff"]


def test_power_off_does_not_put_back_a_key_still_acknowledged_from_before() -> None:
    decision = r.decide(observed(r.POWER_OFF, host=host(WITHDRAWAL_UNSEEN)), T0 + sec(5))
    assert kinds(decision) == []  # waits (host-power's status write wakes it), no fencing
    fencing = r.decide(observed(r.FENCING, host=host(WITHDRAWAL_UNSEEN)), T0 + sec(5))
    assert "RequestPowerOff" not in kinds(fencing)
    assert "DeleteNode" not in kinds(fencing)
    assert progress_of(fencing).phase == r.POWER_OFF


def test_no_host_fails_with_a_message() -> None:
    decision = r.decide(observed(host=None, host_problem="host ns/h1 not found"), T0)
    assert progress_of(decision).phase == r.FAILED
    assert progress_of(decision).message == "host ns/h1 not found"
    again = r.decide(observed(host=None, host_problem="host ns/h1 not found",
                              progress=progress_of(decision)), T0)  # fmt: skip
    assert again.actions == []  # nothing written twice


# ---- power-off -------------------------------------------------------------------------------


def test_power_off_re_asserts_the_key_after_a_crash() -> None:
    decision = r.decide(observed(r.POWER_OFF, host=host(ON)), T0 + sec(5))
    assert kinds(decision) == ["RequestPowerOff"]
    assert decision.requeue_at == T0 + sec(60)


def test_an_off_report_not_for_our_key_is_not_trusted() -> None:
    stale = replace(OFF_FOR_US, acknowledged=False)
    decision = r.decide(observed(r.POWER_OFF, host=host(stale)), T0 + sec(5))
    assert kinds(decision) == []


def test_reported_off_moves_to_fencing() -> None:
    decision = r.decide(observed(r.POWER_OFF, host=host(OFF_FOR_US)), T0 + sec(5))
    assert progress_of(decision).phase == r.FENCING


def test_power_off_timeout_is_a_failed_attempt_and_releases_the_host() -> None:
    held = replace(ON, holds_key=True)
    decision = r.decide(observed(r.POWER_OFF, host=host(held)), T0 + sec(60))
    assert kinds(decision) == ["SetProgress", "ReleasePower"]
    progress = progress_of(decision)
    assert (progress.phase, progress.retry_count) == (r.BACKOFF, 1)
    assert progress.next_attempt_at == T0 + sec(60 + 30)


@pytest.mark.parametrize(
    ("awake", "now", "failed"),
    [
        (None, 60, True),  # no start known: the phase's own deadline
        (-30, 60, True),  # awake before the phase began: the phase's own deadline
        (300, 305, False),  # started long after the deadline: a whole timeout from its start
        (300, 359, False),
        (300, 360, True),  # ... and not one second more
    ],
)
def test_the_power_off_timeout_counts_from_the_controllers_start_when_that_is_later(
    awake: float | None, now: float, failed: bool
) -> None:
    """The timeout measures the BMC and host-power, not this controller's absence: a
    controller that starts (or takes the lead) after the deadline does not fail the attempt
    at its first look, which would release a host that may be off by now and power it off
    again (a second power cycle)."""
    held = replace(ON, holds_key=True)
    since = None if awake is None else T0 + sec(awake)
    decision = r.decide(
        observed(r.POWER_OFF, host=host(held), awake_since=since), T0 + sec(now)
    )
    if failed:
        assert kinds(decision) == ["SetProgress", "ReleasePower"]
        assert progress_of(decision).phase == r.BACKOFF
    else:
        assert kinds(decision) == []
        assert decision.requeue_at == T0 + sec(awake or 0) + sec(60)


def test_bmc_error_is_a_failed_attempt() -> None:
    held = replace(ON, holds_key=True)
    decision = r.decide(
        observed(r.POWER_OFF, host=host(held, bmc_error="connection refused")), T0 + sec(1)
    )
    assert progress_of(decision).retry_count == 1
    assert "connection refused" in progress_of(decision).message


# ---- fencing -----------------------------------------------------------------------------------


def test_fencing_backs_up_deletes_the_node_and_its_pods_then_powers_on() -> None:
    decision = r.decide(observed(r.FENCING, host=host(OFF_FOR_US)), T0 + sec(5))
    assert kinds(decision) == [
        "SetProgress",  # the uid of the Node about to be deleted
        "BackupNode",
        "DeleteNode",
        "DeletePods",
        "SetProgress",
        "ReleasePower",
    ]
    assert decision.actions[1] == r.BackupNode(
        r.Backup({"role": "worker", "zone": "a"}, {"team": "storage"})
    )
    assert r.DeleteNode("node-1", "n-1") in decision.actions
    progress = progress_of(decision)
    assert (progress.phase, progress.fenced_node_uid) == (r.POWER_ON, "n-1")


def test_fencing_never_overwrites_an_existing_backup() -> None:
    backup = r.Backup({"role": "worker"}, {})
    decision = r.decide(observed(r.FENCING, host=host(OFF_FOR_US), backup=backup), T0)
    assert "BackupNode" not in kinds(decision)


def test_fencing_resumes_after_the_node_is_gone() -> None:
    decision = r.decide(observed(r.FENCING, host=host(OFF_FOR_US), node=None), T0)
    assert kinds(decision) == ["DeletePods", "SetProgress", "ReleasePower"]


def test_fencing_refuses_when_the_host_is_no_longer_reported_off() -> None:
    decision = r.decide(observed(r.FENCING, host=host(ON)), T0)
    assert kinds(decision) == ["SetProgress", "RequestPowerOff"]
    assert progress_of(decision).phase == r.POWER_OFF


def test_out_of_service_taint_instead_of_deletion() -> None:
    """The taint, and the host kept off (tests/unit/test_policy_fencing_taint.py: the rest)."""
    settings = r.Settings(fence=r.FenceMethod.OUT_OF_SERVICE_TAINT)
    confirmed = r.Progress(phase=r.FENCING, phase_since=T0, node="node-1", off_reads=3)
    decision = r.decide(observed(progress=confirmed, host=host(OFF_FOR_US)), T0, settings)
    assert kinds(decision) == ["SetProgress", "TaintNode", "DeletePods", "SetProgress"]
    assert progress_of(decision).phase == r.EVACUATING


# ---- power-on ----------------------------------------------------------------------------------


def fenced(**kw: Any) -> r.Progress:
    fields: dict[str, Any] = dict(
        phase=r.POWER_ON, phase_since=T0, node="node-1", fenced_node_uid="n-1"
    )
    fields.update(kw)
    return r.Progress(**fields)


def test_the_deleted_node_in_a_stale_cache_is_not_the_node_back() -> None:
    decision = r.decide(observed(progress=fenced(), node=node("n-1", ready=True)), T0 + sec(5))
    assert kinds(decision) == []
    assert decision.requeue_at == T0 + sec(300)


def test_node_back_restores_only_what_it_lacks() -> None:
    back = node("n-2", ready=True, labels={"zone": "b"}, annotations={})
    backup = r.Backup({"role": "worker", "zone": "a"}, {"team": "storage"})
    decision = r.decide(observed(progress=fenced(), node=back, backup=backup), T0 + sec(40))
    assert decision.actions[0] == r.RestoreNode("node-1", {"role": "worker"}, {"team": "storage"})
    progress = progress_of(decision)
    assert (progress.phase, progress.last_remediated) == (r.WAITING, T0 + sec(40))


def test_host_held_off_by_its_owner_is_not_powered_on() -> None:
    decision = r.decide(
        observed(progress=fenced(), node=None, host=host(online=False)), T0 + sec(900)
    )
    assert kinds(decision) == ["SetProgress"]
    assert "spec.online=false" in progress_of(decision).message
    assert progress_of(decision).retry_count == 0  # not counted as a failure


def test_power_on_timeout_counts_a_retry() -> None:
    decision = r.decide(observed(progress=fenced(), node=None), T0 + sec(300))
    assert progress_of(decision).retry_count == 1
    assert progress_of(decision).phase == r.BACKOFF


def test_retry_waits_grow_and_are_capped() -> None:
    settings = r.Settings(retry_base=10, retry_cap=100)
    assert [r.retry_wait(n, settings) for n in range(1, 7)] == [10, 20, 40, 80, 100, 100]


def test_backoff_then_next_attempt() -> None:
    progress = r.Progress(
        phase=r.BACKOFF, retry_count=2, next_attempt_at=T0 + sec(60), node="node-1"
    )
    waiting = r.decide(observed(progress=progress), T0 + sec(10))
    assert kinds(waiting) == []
    assert waiting.requeue_at == T0 + sec(60)
    started = r.decide(observed(progress=progress), T0 + sec(60))
    assert kinds(started) == ["SetProgress", "RequestPowerOff"]
    assert progress_of(started).retry_count == 2


def test_waiting_too_long_is_another_failed_attempt() -> None:
    progress = fenced(phase=r.WAITING)
    decision = r.decide(observed(progress=progress, node=node("n-2", ready=True)), T0 + sec(300))
    assert progress_of(decision).phase == r.BACKOFF


# ---- escalate ----------------------------------------------------------------------------------


def test_escalate_deletes_the_machine_after_the_last_retry() -> None:
    spec = r.Spec(strategy="escalate", delete_after_retries=2, power_on_timeout=300)
    decision = r.decide(
        observed(spec=spec, progress=fenced(retry_count=1), node=None), T0 + sec(300)
    )
    assert kinds(decision) == ["SetProgress", "MarkEscalation", "DeleteMachine"]
    assert progress_of(decision).phase == r.DELETING_MACHINE
    assert progress_of(decision).retry_count == 2


def test_escalation_marks_the_host_before_the_machine_goes_and_releases_our_key() -> None:
    """Invariant 7: the marker is written conditionally on the host as observed, before
    the deletion; a teardown claim that lands first makes it fail, one that comes later
    is refused by it."""
    spec = r.Spec(strategy="escalate", delete_after_retries=1)
    held = host(replace(ON, holds_key=True))
    decision = r.decide(observed(r.POWER_OFF, spec=spec, host=held), T0 + sec(121))
    assert kinds(decision) == ["SetProgress", "MarkEscalation", "ReleasePower", "DeleteMachine"]
    assert progress_of(decision).host == "ns/h1"


def test_an_escalation_already_marked_deletes_the_machine_without_writing_the_host_again() -> None:
    marked = replace(host(ON), escalation_marked=True)
    decision = r.decide(observed(r.DELETING_MACHINE, host=marked), T0)
    assert kinds(decision) == ["DeleteMachine"]


def test_an_escalation_held_by_a_teardown_claim_does_not_delete_the_machine() -> None:
    claim = Claim("n-1", "uid-n-1", "alice", T0 - sec(60), "drain")
    claimed = replace(host(ON), teardown=claim)
    decision = r.decide(observed(r.DELETING_MACHINE, host=claimed), T0)
    assert "DeleteMachine" not in kinds(decision)
    assert "MarkEscalation" not in kinds(decision)


def test_deletion_removes_our_escalation_marker() -> None:
    marked = replace(host(ON), escalation_marked=True)
    decision = r.decide(observed(r.DELETING_MACHINE, host=marked, deleting_since=T0), T0)
    assert kinds(decision) == ["ClearEscalation", "RemoveFinalizer"]


def test_escalate_with_zero_retries_deletes_at_once() -> None:
    spec = r.Spec(strategy="escalate", delete_after_retries=0)
    decision = r.decide(observed(spec=spec, progress=r.Progress()), T0)
    assert "DeleteMachine" in kinds(decision)
    assert "RequestPowerOff" not in kinds(decision)


def test_reboot_strategy_never_deletes_the_machine() -> None:
    spec = r.Spec(strategy="reboot", delete_after_retries=0, power_on_timeout=300)
    decision = r.decide(
        observed(spec=spec, progress=fenced(retry_count=50), node=None), T0 + sec(300)
    )
    assert "DeleteMachine" not in kinds(decision)


# ---- deletion ----------------------------------------------------------------------------------


def test_deleted_while_powering_off_releases_the_host() -> None:
    held = replace(ON, holds_key=True)
    decision = r.decide(observed(r.POWER_OFF, host=host(held), deleting_since=T0), T0)
    assert kinds(decision) == ["ReleasePower", "RemoveFinalizer"]


def test_deleted_after_fencing_waits_for_the_node_to_restore_labels() -> None:
    backup = r.Backup({"role": "worker"}, {})
    gone = observed(progress=fenced(), node=None, backup=backup, deleting_since=T0)
    decision = r.decide(gone, T0 + sec(10))
    assert kinds(decision) == []
    assert decision.requeue_at == T0 + sec(300)
    back = replace(gone, node=node("n-2", ready=False, labels={}))
    decision = r.decide(back, T0 + sec(20))
    assert kinds(decision) == ["RestoreNode", "RemoveFinalizer"]
    late = r.decide(gone, T0 + sec(300))
    assert kinds(late) == ["RemoveFinalizer"]
    assert any(isinstance(a, r.Event) and a.type == "Warning" for a in late.actions)


def test_deleted_with_a_tainted_node_removes_the_taint() -> None:
    tainted = node(out_of_service=True)
    decision = r.decide(observed(r.POWER_ON, node=tainted, deleting_since=T0), T0)
    assert "UntaintNode" in kinds(decision)
    assert kinds(decision)[-1] == "RemoveFinalizer"


def test_after_the_machine_is_deleted_nothing_flips_to_failed() -> None:
    progress = r.Progress(phase=r.DELETING_MACHINE)
    assert r.decide(observed(progress=progress, machine_found=False), T0).actions == []


def test_machine_deleted_first_still_releases_the_host() -> None:
    held = replace(ON, holds_key=True)
    gone = observed(r.POWER_OFF, machine_found=False, host=host(held), deleting_since=T0)
    assert kinds(r.decide(gone, T0)) == ["ReleasePower", "RemoveFinalizer"]
    orphan = observed(r.POWER_OFF, machine_found=False, host=host(held))
    assert kinds(r.decide(orphan, T0))[0] == "ReleasePower"


def test_the_host_is_recorded_when_an_attempt_starts() -> None:
    assert progress_of(r.decide(observed(progress=r.Progress()), T0)).host == "ns/h1"
