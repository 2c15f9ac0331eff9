"""One reconcile of host-power, decided whole (``policy.hostpower.decide_reconcile``): a
host gone or handed over, the retry schedule, a busy or failing BMC, a command the BMC did
not carry out, a write the API server refused, and the memory kept between reconciles.
No I/O: a snapshot in, a decision out. Each id reads as the rule it proves."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from metalmend.api import names
from metalmend.api.power import PowerAction, PowerState
from metalmend.policy.decision import EventType
from metalmend.policy.hostpower import (
    OUTCOME_BACKOFF,
    OUTCOME_BMC_ERROR,
    OUTCOME_BUSY,
    OUTCOME_REFUSED,
    BmcBusy,
    BmcFailed,
    Event,
    HostObject,
    LastCommand,
    LetGo,
    Log,
    Memory,
    Observed,
    PowerRead,
    PowerSettings,
    PowerStatus,
    ReconcileDecision,
    Remember,
    RemoveAnnotations,
    ReportRefusal,
    RetrySettings,
    Schedule,
    SendEnded,
    SendPower,
    SetStatus,
    Step,
    WriteFailure,
    WriteRefused,
    decide_reconcile,
    reads_bmc,
    user_inputs,
)

NOW = dt.datetime(2026, 11, 20, 12, 0, 0, tzinfo=dt.UTC)
KEY = "ns/worker-0"
UID = "uid-0"
SETTINGS = PowerSettings(soft_timeout=180, poll_interval=20, transition_poll=1, command_retry=30)
RETRY = RetrySettings()
SPEC: dict[str, Any] = {
    "online": True,
    "bmc": {"address": "ipmi://127.0.0.1", "credentialsName": "b"},
}
ON_STATUS = {"poweredOn": True, "operationalStatus": "OK"}
SENT = LastCommand(PowerAction.ON, NOW - dt.timedelta(seconds=5))


def after(seconds: float) -> dt.datetime:
    return NOW + dt.timedelta(seconds=seconds)


def cached(
    spec: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
) -> HostObject:
    return HostObject(UID, spec or SPEC, annotations or {}, ON_STATUS if status is None else status)


def schedule(
    due_in: float, unwritten: tuple[str, str, bool] | None = None, auth: int = 0
) -> Schedule:
    """A failing host's schedule, made on the host as ``cached()`` has it."""
    return Schedule(1, auth, after(due_in), user_inputs(SPEC, {}), unwritten)


def observed(**changes: Any) -> Observed:
    base = Observed(key=KEY, now=NOW, host=cached(), hosts=1, jitter=0.0)
    return dataclasses.replace(base, **changes)


def of(decision: ReconcileDecision, kind: type[Any]) -> list[Any]:
    return [a for a in decision.actions if isinstance(a, kind)]


def kinds(decision: ReconcileDecision) -> list[str]:
    return [type(a).__name__ for a in decision.actions]


def remembered(decision: ReconcileDecision) -> Memory:
    """The memory the decision leaves (its last Remember)."""
    memories = of(decision, Remember)
    assert memories, f"no Remember in {kinds(decision)}"
    return memories[-1].memory


def reasons(decision: ReconcileDecision) -> list[str]:
    return [a.reason for a in of(decision, Event)]


# ---- whether the BMC is read -------------------------------------------------------------

READS = [
    ("a host not cached is not read", observed(host=None), False),
    ("a host handed to another replica is not read", observed(draining=True), False),
    ("a host with no schedule is read", observed(), True),
    ("a failing host is not read before its next attempt",
     observed(memory=Memory(schedule=schedule(30))), False),
    ("a failing host is read once its next attempt is due",
     observed(memory=Memory(schedule=schedule(0))), True),
    ("a user's new request (spec.online) reads a failing host at once",
     observed(host=cached(spec={**SPEC, "online": False}), memory=Memory(schedule=schedule(30))),
     True),
    ("a reboot annotation added reads a failing host at once",
     observed(host=cached(annotations={names.REBOOT: ""}), memory=Memory(schedule=schedule(30))),
     True),
    ("an unrelated annotation waits for the schedule",
     observed(host=cached(annotations={"note": "x"}), memory=Memory(schedule=schedule(30))),
     False),
    ("after refused logins, flipping spec.online waits for the schedule (each try is a login)",
     observed(host=cached(spec={**SPEC, "online": False}),
              memory=Memory(schedule=dataclasses.replace(
                  schedule(30, auth=1), inputs=(("bmc.address", "ipmi://127.0.0.1"),
                                                ("bmc.credentialsName", "b"))))),
     False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("snapshot", "expected"), [c[1:] for c in READS], ids=[c[0] for c in READS]
)
def test_whether_the_bmc_is_read(snapshot: Observed, expected: bool) -> None:
    assert reads_bmc(snapshot) is expected


# ---- the decision, by situation ------------------------------------------------------------

FAILED = BmcFailed("power management error", "connection refused")
BUSY = BmcBusy("BMC 127.0.0.1 busy with 2 other calls", retry_after=2.0, others=2)
WAITING = Memory(waiting=True)

CASES: list[tuple[str, Observed, list[str], dt.datetime | None, str | None]] = [
    # id, snapshot, the actions' kinds in order, requeue_at, outcome
    ("a host gone: its schedule and command sent are forgotten, nothing else",
     observed(host=None, memory=Memory(schedule=schedule(30), sent=SENT)),
     ["Remember"], None, None),
    ("a host handed over: both shard labels removed, then forgotten",
     observed(draining=True, memory=Memory(schedule=schedule(30), waiting=True)),
     ["LetGo", "Remember"], None, None),
    ("a failing host waits for its schedule: nothing read, nothing written",
     observed(memory=Memory(schedule=schedule(30))), [], after(30), OUTCOME_BACKOFF),
    ("a failing host waiting writes a failure a conflict left unwritten, without the BMC",
     observed(memory=Memory(schedule=schedule(30, ("power management error", "x", False)))),
     ["WriteFailure"], after(30), OUTCOME_BACKOFF),
    ("a busy BMC asked for a change: waits, said once, the key keeps its priority",
     observed(bmc=BUSY), ["Remember", "Event", "Log"], after(2), OUTCOME_BUSY),
    ("a busy BMC at a routine poll says nothing",
     observed(bmc=BUSY, background=True), ["Remember", "Log"], after(2), OUTCOME_BUSY),
    ("a busy BMC already told says nothing again",
     observed(bmc=BUSY, memory=WAITING), ["Remember", "Log"], after(2), OUTCOME_BUSY),
    ("a BMC busy with this namespace's own calls says nothing",
     observed(bmc=dataclasses.replace(BUSY, others=0)), ["Remember", "Log"], after(2),
     OUTCOME_BUSY),
    ("a failed read: scheduled (1 s), written, told and logged",
     observed(bmc=FAILED), ["Remember", "WriteFailure", "Event", "Log"], after(1),
     OUTCOME_BMC_ERROR),
    ("a refused login: the next attempt in 5 minutes",
     observed(bmc=dataclasses.replace(FAILED, authentication=True)),
     ["Remember", "WriteFailure", "Event", "Log"], after(300), OUTCOME_BMC_ERROR),
    ("a host on as wanted: its status, then the memory (no schedule); the idle poll",
     observed(bmc=PowerRead(PowerState.ON), memory=Memory(schedule=schedule(0))),
     ["SetStatus", "Remember"], None, None),
    ("a host off that must be on: status, command, memory, then the Events",
     observed(bmc=PowerRead(PowerState.OFF)),
     ["SetStatus", "SendPower", "Remember", "Event", "Event"], after(0.1), None),
    ("a host no longer waiting for other calls forgets it first",
     observed(bmc=PowerRead(PowerState.ON), memory=WAITING),
     ["Remember", "SetStatus", "Remember"], None, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("snapshot", "expected", "requeue_at", "outcome"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_one_reconcile(
    snapshot: Observed,
    expected: list[str],
    requeue_at: dt.datetime | None,
    outcome: str | None,
) -> None:
    decision = decide_reconcile(snapshot, SETTINGS, RETRY)
    assert kinds(decision) == expected
    if requeue_at is not None:
        assert decision.requeue_at == requeue_at
    assert decision.outcome == outcome


def test_the_idle_poll_comes_on_the_host_s_slot_and_says_the_interval() -> None:
    decision = decide_reconcile(observed(bmc=PowerRead(PowerState.ON), hosts=7), SETTINGS, RETRY)
    assert decision.poll_every == SETTINGS.poll_interval
    assert decision.requeue_at is not None
    assert after(0) < decision.requeue_at <= after(SETTINGS.poll_interval * 1.25)


def test_a_busy_read_keeps_the_key_s_priority_and_a_busy_command_does_not() -> None:
    read = decide_reconcile(observed(bmc=BUSY), SETTINGS, RETRY)
    ended = SendEnded(LastCommand(PowerAction.ON, NOW), BUSY)
    sent = decide_reconcile(observed(bmc=PowerRead(PowerState.OFF), ended=ended), SETTINGS, RETRY)
    assert read.same_priority
    assert not sent.same_priority
    assert reasons(read) == reasons(sent) == [names.REASON_BMC_WAITING]
    assert remembered(read).waiting
    assert remembered(sent).waiting


def test_the_busy_wait_spreads_up_to_a_fifth_later() -> None:
    decision = decide_reconcile(observed(bmc=BUSY, jitter=0.5), SETTINGS, RETRY)
    assert decision.requeue_at == after(2.0 * 1.1)


def test_a_failed_read_is_scheduled_written_and_then_remembered_as_written() -> None:
    decision = decide_reconcile(observed(bmc=FAILED, memory=Memory(sent=SENT)), SETTINGS, RETRY)
    memory = remembered(decision)
    assert memory.schedule is not None
    assert memory.schedule.failures == 1
    assert memory.schedule.unwritten == ("power management error", "connection refused", False)
    assert not memory.waiting
    assert memory.sent == SENT
    (write,) = of(decision, WriteFailure)
    assert write.status.error_count == 1
    assert write.status.error_message == "connection refused"
    assert write.then.schedule == dataclasses.replace(memory.schedule, unwritten=None)
    assert write.then.sent == SENT
    (event,) = of(decision, Event)
    assert (event.type, event.reason) == (EventType.WARNING, names.REASON_BMC_ERROR)
    (line,) = of(decision, Log)
    assert dict(line.context)["attempt"] == 1


def test_the_first_failure_after_a_restart_continues_from_error_count() -> None:
    host = cached(status={**ON_STATUS, "errorCount": 4})
    decision = decide_reconcile(observed(host=host, bmc=FAILED), SETTINGS, RETRY)
    assert decision.requeue_at == after(16)  # the 5th failure: 1 s doubled four times
    assert of(decision, WriteFailure)[0].status.error_count == 5


@pytest.mark.parametrize(
    ("command", "timed_out", "forgotten"),
    [
        (PowerAction.SOFT_OFF, False, True),
        (PowerAction.ON, False, True),
        (PowerAction.ON, True, False),  # may still land: remediation reads it in flight
    ],
    ids=["a refused power-off is forgotten", "a refused power-on is forgotten",
         "a power-on that timed out stays on record"],
)  # fmt: skip
def test_a_command_the_bmc_did_not_carry_out(
    command: PowerAction, timed_out: bool, forgotten: bool
) -> None:
    recorded = LastCommand(command, NOW)
    status = {
        **ON_STATUS,
        "lastPowerCommand": {"action": str(command), "at": "2026-11-20T12:00:00Z"},
    }
    failed = dataclasses.replace(FAILED, timed_out=timed_out)
    snapshot = observed(
        host=cached(status=status),
        bmc=PowerRead(PowerState.ON),
        memory=Memory(sent=SENT, waiting=True),
        ended=SendEnded(recorded, failed),
    )
    decision = decide_reconcile(snapshot, SETTINGS, RETRY)
    assert decision.outcome == OUTCOME_BMC_ERROR
    (write,) = of(decision, WriteFailure)
    assert (write.status.last_command is None) is forgotten
    assert (write.then.sent is None) is forgotten
    assert not remembered(decision).waiting


REFUSED: list[tuple[str, Step, str]] = [
    ("a refused status write is reported with the status it meant",
     SetStatus(PowerStatus(powered_on=False)), "status update"),
    ("a refused annotation removal names the annotations",
     RemoveAnnotations((names.REBOOT,)), f"removal of {names.REBOOT}"),
]  # fmt: skip


@pytest.mark.parametrize(("action", "what"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_refused_write(action: SetStatus | RemoveAnnotations, what: str) -> None:
    refused = WriteRefused(action, 403, "admission\n   policy  said no")
    snapshot = observed(bmc=PowerRead(PowerState.ON), ended=refused)
    decision = decide_reconcile(snapshot, SETTINGS, RETRY)
    assert kinds(decision) == ["Remember", "ReportRefusal", "Event", "Log"]
    assert decision.outcome == OUTCOME_REFUSED
    memory = remembered(decision)
    assert memory.schedule is not None
    assert decision.requeue_at == memory.schedule.next_attempt
    (report,) = of(decision, ReportRefusal)
    message = report.status.error_message or ""
    assert f"metalmend's {what} (403): admission policy said no;" in message
    assert report.status.writes_refused is not None
    if isinstance(action, SetStatus):
        assert report.status.powered_on is False  # the status it meant, reported refused


def test_the_command_sent_is_remembered_after_it_is_sent() -> None:
    decision = decide_reconcile(observed(bmc=PowerRead(PowerState.OFF)), SETTINGS, RETRY)
    actions = list(decision.actions)
    (send,) = of(decision, SendPower)
    memory = actions[actions.index(send) + 1]
    assert isinstance(memory, Remember)
    assert memory.memory.sent == send.command


def test_a_confirmed_command_is_not_sent_again_and_an_unconfirmed_one_is() -> None:
    status = {
        "poweredOn": False,
        "lastPowerCommand": {"action": "on", "at": "2026-11-20T11:59:55Z"},
    }
    snapshot = observed(host=cached(status=status), bmc=PowerRead(PowerState.OFF))
    confirmed = dataclasses.replace(snapshot, memory=Memory(sent=SENT))
    assert not of(decide_reconcile(confirmed, SETTINGS, RETRY), SendPower)
    assert of(decide_reconcile(snapshot, SETTINGS, RETRY), SendPower)


def test_a_malformed_reboot_annotation_is_told_once_per_host() -> None:
    host = cached(annotations={names.REBOOT: "{not json"})
    status = {**ON_STATUS, "provisioning": {"state": names.PROVISIONED}}
    snapshot = observed(host=dataclasses.replace(host, status=status), bmc=PowerRead(PowerState.ON))
    first = decide_reconcile(snapshot, SETTINGS, RETRY)
    assert names.REASON_INVALID_REBOOT in reasons(first)
    told = remembered(first).reported
    assert told
    assert all(topic[0] == UID for topic in told)
    again = decide_reconcile(
        dataclasses.replace(snapshot, memory=remembered(first)), SETTINGS, RETRY
    )
    assert names.REASON_INVALID_REBOOT not in reasons(again)
    other = dataclasses.replace(snapshot, host=dataclasses.replace(snapshot.host, uid="uid-1"),
                                memory=remembered(first))  # fmt: skip
    assert names.REASON_INVALID_REBOOT in reasons(decide_reconcile(other, SETTINGS, RETRY))


def test_a_host_gone_keeps_only_what_was_told() -> None:
    memory = Memory(schedule=schedule(30), sent=SENT, reported=frozenset({(UID, "x")}))
    decision = decide_reconcile(observed(host=None, memory=memory), SETTINGS, RETRY)
    assert remembered(decision) == Memory(reported=memory.reported)


def test_a_host_handed_over_is_forgotten_after_its_labels_are_removed() -> None:
    memory = Memory(schedule=schedule(30), sent=SENT, waiting=True)
    decision = decide_reconcile(observed(draining=True, memory=memory), SETTINGS, RETRY)
    assert isinstance(decision.actions[0], LetGo)
    assert remembered(decision) == Memory()


def test_an_unwritten_failure_once_written_forgets_a_refused_command() -> None:
    memory = Memory(schedule=schedule(30, ("power management error", "no", True)), sent=SENT)
    decision = decide_reconcile(observed(memory=memory), SETTINGS, RETRY)
    (write,) = of(decision, WriteFailure)
    assert write.then.sent is None
    assert write.then.schedule is not None
    assert write.then.schedule.unwritten is None
    assert write.status.error_count == 1
    assert write.status.last_command is None


def test_every_decision_is_total_over_a_hostile_status() -> None:
    host = cached(status={"provisioning": "not a mapping", "errorCount": "many", "poweredOn": 1})
    for bmc in (PowerRead(PowerState.ON), FAILED, BUSY, None):
        decide_reconcile(observed(host=host, bmc=bmc), SETTINGS, RETRY)
