"""The destroy of a node, decided purely (metalmend.destroy.policy.destroy; docs/destroy.md)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest

from metalmend.destroy.policy import destroy as p

NOW = dt.datetime(2026, 11, 23, 21, 0, tzinfo=dt.UTC)
S = p.DestroySettings()
HOST = p.HostFacts(
    key="site/h1", online=True, powered_on=True, power_error="",
    provisioning_state="provisioned", consumer=True, image=False, reboot_keys=(),
)  # fmt: skip
DRIVES = (
    p.DriveFacts("/redfish/v1/Systems/1/Storage/1/Drives/os", "/dev/sda", "OS1"),
    p.DriveFacts("/redfish/v1/Systems/1/Storage/1/Drives/data", "/dev/sdb", "DATA1"),
)
OS_ID, DATA_ID = DRIVES[0].id, DRIVES[1].id


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def at(step: p.Step, **kw: Any) -> p.NodeState:
    return p.NodeState(step=step, host=HOST.key, step_since=kw.pop("since", ago(1)), **kw)


def view(state: p.NodeState, host: p.HostFacts | None = HOST, **kw: Any) -> p.View:
    return p.View("n1", kw.pop("preserve", False), state, host=host, **kw)


def kinds(decision: p.Decision) -> list[str]:
    return [type(a).__name__ for a in decision.actions if not isinstance(a, p.Event)]


def final(decision: p.Decision) -> p.NodeState:
    states = decision.of(p.SetState)
    assert states, decision.actions
    return states[-1].state


def record(erase: p.Erase, drive: p.DriveFacts = DRIVES[0], **kw: Any) -> p.DriveRecord:
    return p.DriveRecord(drive.id, drive.name, drive.serial, kw.pop("role", None), erase, **kw)


def wiping(*records: p.DriveRecord) -> p.NodeState:
    return at(p.Step.WIPE, planned=True, drives=records)


# ---- claim -------------------------------------------------------------------------------


def test_claim_takes_the_hosts_claim_then_records_the_host_and_moves_to_power_off() -> None:
    decision = p.decide(view(p.NodeState()), NOW)
    assert kinds(decision) == ["Claim", "SetState"]
    state = final(decision)
    assert (state.step, state.host, state.outcome) == (
        p.Step.POWER_OFF,
        "site/h1",
        p.Outcome.PENDING,
    )


def test_a_node_under_remediation_is_refused_and_nothing_is_changed() -> None:
    why = "Node n1 is under remediation and cannot be torn down now: host site/h1 holds ..."
    decision = p.decide(view(p.NodeState(), refused=why), NOW)
    assert kinds(decision) == ["SetState"]
    state = final(decision)
    assert state.outcome is p.Outcome.FAILURE
    assert state.messages[-1].message == f"refused: {why}"
    assert state.messages[-1].error


def test_a_node_without_host_fails_saying_why() -> None:
    decision = p.decide(view(p.NodeState(), host=None, host_problem="no Node named n1"), NOW)
    assert final(decision).outcome is p.Outcome.FAILURE
    assert "no Node named n1" in final(decision).messages[-1].message


def test_a_finished_node_decides_nothing() -> None:
    done = replace(at(p.Step.DONE), outcome=p.Outcome.SUCCESS)
    assert p.decide(view(done), NOW).actions == []


# ---- power off ---------------------------------------------------------------------------


def test_power_off_is_asked_through_spec_online_after_recording_the_request() -> None:
    decision = p.decide(view(at(p.Step.POWER_OFF)), NOW)
    assert kinds(decision) == ["SetState", "SetOnline"]  # the fact first
    assert final(decision).power_off_asked == NOW
    assert decision.of(p.SetOnline) == [p.SetOnline("site/h1", False)]


def test_a_host_already_off_is_not_powered_off_again() -> None:
    off = replace(HOST, online=False, powered_on=False)
    decision = p.decide(view(at(p.Step.POWER_OFF), off), NOW)
    assert kinds(decision) == ["SetState"]
    assert final(decision).step is p.Step.WIPE
    assert "already off" in final(decision).messages[-1].message


def test_power_off_waits_for_host_power_to_report_off_without_asking_again() -> None:
    asked = at(p.Step.POWER_OFF, power_off_asked=ago(10))
    decision = p.decide(view(asked, replace(HOST, online=False)), NOW)
    assert decision.actions == []
    assert decision.requeue_at == NOW + dt.timedelta(seconds=S.poll_interval)


def test_power_off_reported_off_moves_to_wipe() -> None:
    asked = at(p.Step.POWER_OFF, power_off_asked=ago(10))
    decision = p.decide(view(asked, replace(HOST, online=False, powered_on=False)), NOW)
    assert final(decision).step is p.Step.WIPE
    assert "host-power reports" in final(decision).messages[-1].message


def test_power_off_not_reported_in_time_fails_naming_host_power_and_its_error() -> None:
    asked = at(p.Step.POWER_OFF, power_off_asked=ago(S.power_off_timeout))
    host = replace(HOST, online=False, power_error="BMC unreachable")
    state = final(p.decide(view(asked, host), NOW))
    assert state.outcome is p.Outcome.FAILURE
    assert "BMC unreachable" in state.messages[-1].message
    assert "host-power" in state.messages[-1].message


# ---- wipe: the plan ----------------------------------------------------------------------

OFF = replace(HOST, online=False, powered_on=False)


def test_by_default_every_drive_is_to_be_erased() -> None:
    decision = p.decide(view(at(p.Step.WIPE), OFF, drives=DRIVES), NOW)
    state = final(decision)
    assert state.planned
    assert [d.erase for d in state.drives] == [p.Erase.PLANNED] * 2
    assert kinds(decision) == ["SetState"]  # nothing erased before the plan is on record


def test_preserve_local_storage_erases_only_the_os_drive_the_hints_choose() -> None:
    seen = view(at(p.Step.WIPE), OFF, drives=DRIVES, preserve=True, os_drive=OS_ID)
    state = final(p.decide(seen, NOW))
    assert [(d.role, d.erase) for d in state.drives] == [
        (p.Role.OS, p.Erase.PLANNED),
        (p.Role.DATA, p.Erase.PRESERVE),
    ]
    assert "preserving /dev/sdb" in state.messages[-1].message


def test_preserve_without_a_decidable_os_drive_erases_nothing_and_says_so() -> None:
    why = "2 drives match spec.rootDeviceHints (rotational=False)"
    seen = view(at(p.Step.WIPE), OFF, drives=DRIVES, preserve=True, os_problem=why)
    decision = p.decide(seen, NOW)
    assert decision.of(p.StartErase) == []
    state = final(decision)
    assert state.outcome is p.Outcome.FAILURE
    assert state.step is p.Step.WIPE
    assert "NOT wiped" in state.messages[-1].message
    assert why in state.messages[-1].message
    assert "nothing was erased" in state.messages[-1].message


def test_a_bmc_that_cannot_erase_is_never_reported_wiped_and_the_host_not_released() -> None:
    seen = view(at(p.Step.WIPE), OFF, cannot_erase="ipmi://10.0.0.9: storage not supported")
    decision = p.decide(seen, NOW)
    state = final(decision)
    assert state.outcome is p.Outcome.FAILURE
    assert state.step is p.Step.WIPE
    assert "drives NOT wiped" in state.messages[-1].message
    assert "not released" in state.messages[-1].message
    assert not decision.of(p.SetProvisioningState)
    assert not decision.of(p.ClearConsumer)


def test_a_bmc_listing_no_drive_is_not_reported_wiped() -> None:
    state = final(p.decide(view(at(p.Step.WIPE), OFF, drives=()), NOW))
    assert state.outcome is p.Outcome.FAILURE


def test_an_unreachable_bmc_is_asked_again_until_bmc_timeout() -> None:
    waiting = p.decide(view(at(p.Step.WIPE), OFF, bmc_error="timed out"), NOW)
    assert waiting.actions == []
    assert waiting.requeue_at == NOW + dt.timedelta(seconds=S.bmc_retry)
    late = at(p.Step.WIPE, since=ago(S.bmc_timeout))
    state = final(p.decide(view(late, OFF, bmc_error="timed out"), NOW))
    assert state.outcome is p.Outcome.FAILURE
    assert "timed out" in state.messages[-1].message


# ---- wipe: the erases ----------------------------------------------------------------------


def test_each_erase_is_recorded_requested_before_it_is_asked_for() -> None:
    state = wiping(record(p.Erase.PLANNED), record(p.Erase.PRESERVE, DRIVES[1]))
    decision = p.decide(view(state, OFF), NOW)
    assert kinds(decision) == ["SetState", "StartErase"]
    assert [d.erase for d in final(decision).drives] == [p.Erase.REQUESTED, p.Erase.PRESERVE]
    assert decision.of(p.StartErase) == [p.StartErase("site/h1", OS_ID)]


def test_an_erase_the_bmc_accepted_is_recorded_running_with_its_monitor() -> None:
    state = wiping(record(p.Erase.REQUESTED, since=ago(1)))
    decision = p.decide(view(state, OFF, accepted={OS_ID: "/redfish/v1/TaskService/Tasks/7"}), NOW)
    assert decision.of(p.StartErase) == []
    drive = final(decision).drives[0]
    assert (drive.erase, drive.monitor) == (p.Erase.RUNNING, "/redfish/v1/TaskService/Tasks/7")


def test_after_a_restart_an_erase_found_running_is_not_started_twice() -> None:
    state = wiping(record(p.Erase.REQUESTED, since=ago(30)))
    seen = {OS_ID: p.SeenErase(p.Seen.RUNNING)}
    decision = p.decide(view(state, OFF, erases=seen), NOW)
    assert decision.of(p.StartErase) == []
    assert final(decision).drives[0].erase is p.Erase.RUNNING


def test_after_a_restart_a_requested_erase_that_is_not_running_is_asked_for_again() -> None:
    state = wiping(record(p.Erase.REQUESTED, since=ago(30)))
    seen = {OS_ID: p.SeenErase(p.Seen.FINISHED)}  # nothing runs on the drive
    decision = p.decide(view(state, OFF, erases=seen), NOW)
    assert decision.of(p.StartErase) == [p.StartErase("site/h1", OS_ID)]


def test_a_requested_erase_the_bmc_did_not_answer_for_is_waited_for() -> None:
    state = wiping(record(p.Erase.REQUESTED, since=ago(30)))
    assert p.decide(view(state, OFF, bmc_error="busy"), NOW).of(p.StartErase) == []


def test_a_running_erase_is_waited_for() -> None:
    state = wiping(record(p.Erase.RUNNING, since=ago(30)))
    decision = p.decide(view(state, OFF, erases={OS_ID: p.SeenErase(p.Seen.RUNNING)}), NOW)
    assert decision.actions == []
    assert decision.requeue_at == NOW + dt.timedelta(seconds=S.poll_interval)


def test_a_drive_is_reported_erased_only_once_the_bmc_reported_its_erase_finished() -> None:
    state = wiping(record(p.Erase.RUNNING, since=ago(30)), record(p.Erase.PRESERVE, DRIVES[1]))
    decision = p.decide(view(state, OFF, erases={OS_ID: p.SeenErase(p.Seen.FINISHED)}), NOW)
    done = final(decision)
    assert [d.erase for d in done.drives] == [p.Erase.ERASED, p.Erase.PRESERVE]
    assert done.step is p.Step.RELEASE
    assert "erased /dev/sda" in done.messages[-1].message
    assert "preserved /dev/sdb" in done.messages[-1].message


def test_an_erase_the_bmc_reports_failed_leaves_the_node_failed_and_not_released() -> None:
    state = wiping(record(p.Erase.RUNNING, since=ago(30)))
    seen = {OS_ID: p.SeenErase(p.Seen.FAILED, "task Exception: media error")}
    done = final(p.decide(view(state, OFF, erases=seen), NOW))
    assert done.outcome is p.Outcome.FAILURE
    assert done.step is p.Step.WIPE
    assert "media error" in done.messages[-1].message


def test_an_erase_running_past_erase_timeout_fails() -> None:
    state = wiping(record(p.Erase.RUNNING, since=ago(S.erase_timeout)))
    done = final(p.decide(view(state, OFF, erases={OS_ID: p.SeenErase(p.Seen.RUNNING)}), NOW))
    assert done.outcome is p.Outcome.FAILURE
    assert "not finished within" in done.messages[-1].message


def test_a_drive_whose_erase_cannot_start_fails_while_others_finish() -> None:
    state = wiping(record(p.Erase.REQUESTED, since=ago(1)), record(p.Erase.ERASED, DRIVES[1]))
    done = final(p.decide(view(state, OFF, start_failed={OS_ID: "action not allowed"}), NOW))
    assert done.outcome is p.Outcome.FAILURE
    assert "action not allowed" in done.messages[-1].message
    assert "erased: /dev/sdb" in done.messages[-1].message


# ---- release -------------------------------------------------------------------------------


def test_release_deprovisions_and_clears_the_consumer() -> None:
    decision = p.decide(view(at(p.Step.RELEASE), OFF), NOW)
    assert decision.of(p.SetProvisioningState) == [
        p.SetProvisioningState("site/h1", p.DEPROVISIONING)
    ]
    assert decision.of(p.ClearConsumer) == [p.ClearConsumer("site/h1")]
    assert decision.of(p.SetState) == []


def test_release_waits_for_host_power_to_remove_the_reboot_annotations() -> None:
    host = replace(OFF, provisioning_state=p.DEPROVISIONING, consumer=False,
                   reboot_keys=("reboot.metal3.io",))  # fmt: skip
    assert p.decide(view(at(p.Step.RELEASE), host), NOW).actions == []
    late = at(p.Step.RELEASE, since=ago(S.release_timeout))
    done = final(p.decide(view(late, host), NOW))
    assert done.outcome is p.Outcome.FAILURE
    assert "reboot.metal3.io" in done.messages[-1].message


def test_a_clean_deprovisioned_host_is_made_available_and_the_node_succeeds() -> None:
    host = replace(OFF, provisioning_state=p.DEPROVISIONING, consumer=False)
    decision = p.decide(view(at(p.Step.RELEASE), host), NOW)
    assert kinds(decision) == ["SetProvisioningState", "SetState"]
    assert decision.of(p.SetProvisioningState)[0].state == "available"
    assert final(decision).outcome is p.Outcome.SUCCESS


def test_a_host_turned_on_again_during_release_is_turned_off() -> None:
    host = replace(HOST, provisioning_state=p.DEPROVISIONING, consumer=False)
    assert p.SetOnline("site/h1", False) in p.decide(view(at(p.Step.RELEASE), host), NOW).actions


# ---- the task's result -----------------------------------------------------------------------

OK = p.NodeState(step=p.Step.DONE, outcome=p.Outcome.SUCCESS)
BAD = p.NodeState(step=p.Step.WIPE, outcome=p.Outcome.FAILURE)
BUSY = p.NodeState(step=p.Step.WIPE)


@pytest.mark.parametrize(
    ("nodes", "status"),
    [
        pytest.param({"a": OK, "b": OK}, p.ResultStatus.SUCCESS, id="every-node-destroyed"),
        pytest.param({"a": OK, "b": BAD}, p.ResultStatus.PARTIAL_SUCCESS, id="some-destroyed"),
        pytest.param({"a": BAD}, p.ResultStatus.FAILURE, id="none-destroyed"),
        pytest.param({"a": OK, "b": BUSY}, p.ResultStatus.INCOMPLETE, id="a-node-still-at-work"),
    ],
)
def test_task_result(nodes: dict[str, p.NodeState], status: p.ResultStatus) -> None:
    assert p.task_result(nodes).status is status


def test_node_state_round_trips_and_hostile_wire_reads_as_a_fresh_record() -> None:
    state = wiping(record(p.Erase.RUNNING, since=ago(3), monitor="/t/1", role=p.Role.OS))
    state = state.say(NOW, "hello", error=True)
    assert p.NodeState.from_wire(state.to_wire()) == state
    assert p.NodeState.from_wire("junk") == p.NodeState()
    hostile = {"step": 7, "drives": [{"id": 1}, "x"], "messages": [{"message": "m", "ts": "no"}]}
    assert p.NodeState.from_wire(hostile) == p.NodeState()
