"""The host power decisions, one case (at least) per rule of metal3's reboot interface
design and of our power handling. Each id reads as the rule it proves."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from metalmend.api.names import REASON_INVALID_REBOOT, REASON_REBOOT_IGNORED, REBOOT
from metalmend.api.power import PowerState
from metalmend.policy.hostpower import (
    MICROSECOND,
    Decision,
    Host,
    LastCommand,
    PowerSettings,
    PowerStatus,
    ReportOnce,
    decide,
)
from tests.unit import hostpower_views as views

T0 = dt.datetime(2026, 11, 20, 12, 0, 0, tzinfo=dt.UTC)
NOW = T0 + dt.timedelta(minutes=1)
BEFORE = T0 - dt.timedelta(minutes=5)
KEYED = "reboot.metal3.io/remediation"
OTHER = "reboot.metal3.io/maintenance"
SETTINGS = PowerSettings(soft_timeout=180, poll_interval=20, transition_poll=1, command_retry=30)
ON, OFF = PowerState.ON, PowerState.OFF


BASE = Host(
    online=True,
    provisioning_state="provisioned",
    externally_provisioned=False,
    annotations={},
    power=ON,
    status=PowerStatus(powered_on=True, last_powered_on=T0),
)


def host(**changes: Any) -> Host:
    return views.host(BASE, **changes)


def reported(decision: Decision, reason: str) -> list[str]:
    """The messages of the once-per-value Events with ``reason``."""
    return [a.event.message for a in decision.of(ReportOnce) if a.event.reason == reason]


def requeue_after(decision: Decision) -> float:
    assert decision.requeue_at is not None
    return (decision.requeue_at - NOW).total_seconds()


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


PENDING = {"pending_reboot_since": T0 + dt.timedelta(seconds=30)}  # later than lastPoweredOn

CASES = [
    # id, host, expected (command, status subset, removed annotations)
    ("pendingRebootSince set when an annotation appears on a host that is on",
     host(annotations={REBOOT: ""}), ("soft off", {"pendingRebootSince": NOW}, [])),
    ("pendingRebootSince set again when it is earlier than lastPoweredOn",
     host(annotations={KEYED: ""}, pending_reboot_since=BEFORE), ("soft off", {"pendingRebootSince": NOW}, [])),
    ("pendingRebootSince left alone while a reboot is pending",
     host(annotations={KEYED: ""}, **PENDING), ("soft off", {}, [])),
    ("no annotation and no pending reboot: nothing to do",
     host(), (None, {}, [])),
    ("a pending reboot powers off even when every annotation is gone",
     host(**PENDING), ("soft off", {}, [])),
    ("a pending reboot powers off regardless of online",
     host(online=False, annotations={KEYED: ""}, **PENDING), ("soft off", {}, [])),
    ("suffixless removed once off, online, lastPoweredOn before pendingRebootSince; then power on",
     host(annotations={REBOOT: ""}, power=OFF, recorded_on=False, **PENDING), ("on", {}, [REBOOT])),
    ("suffixless kept while online is false",
     host(online=False, annotations={REBOOT: ""}, power=OFF, recorded_on=False, **PENDING), (None, {}, [])),
    ("keyed annotation holds the host off after the suffixless is removed",
     host(annotations={REBOOT: "", KEYED: ""}, power=OFF, recorded_on=False, **PENDING), (None, {}, [REBOOT])),
    ("keyed annotations hold the host off until every owner removed theirs",
     host(annotations={OTHER: ""}, power=OFF, recorded_on=False, **PENDING), (None, {}, [])),
    ("power restored once no reboot annotation remains",
     host(power=OFF, recorded_on=False, **PENDING), ("on", {}, [])),
    ("lastPoweredOn updated when power is restored",
     host(power=ON, recorded_on=False, **PENDING), (None, {"lastPoweredOn": NOW, "poweredOn": True}, [])),
    ("lastPoweredOn recorded when the host is first seen on",
     host(recorded_on=None, last_powered_on=None), (None, {"lastPoweredOn": NOW, "poweredOn": True}, [])),
    ("lastPoweredOn does not move while the host stays on",
     host(), (None, {}, [])),
    ("poweredOn follows the BMC",
     host(online=False, power=OFF, recorded_on=True), (None, {"poweredOn": False}, [])),
    ("all reboot annotations removed when the host is deprovisioned",
     host(provisioning_state="deprovisioning", annotations={REBOOT: "", KEYED: "x"}, **PENDING),
     (None, {"pendingRebootSince": None}, [REBOOT, KEYED])),
    ("unprovisioned hosts ignore reboot annotations",
     host(provisioning_state="inspecting", annotations={KEYED: ""}), (None, {}, [])),
    ("externally provisioned hosts honour reboots",
     host(provisioning_state="externally provisioned", annotations={KEYED: ""}), ("soft off", {"pendingRebootSince": NOW}, [])),
    ("any client asking hard makes it hard",
     host(annotations={KEYED: '{"mode":"soft"}', OTHER: '{"mode":"hard"}'}), ("hard off", {"pendingRebootSince": NOW}, [])),
    ("the single-quoted form of metal3's examples is accepted",
     host(annotations={REBOOT: "{'mode':'hard'}"}), ("hard off", {"pendingRebootSince": NOW}, [])),
    ("a malformed value is the default mode",
     host(annotations={KEYED: "{mode: hard"}), ("soft off", {"pendingRebootSince": NOW}, [])),
    ("soft off escalates to hard after the soft timeout",
     host(annotations={KEYED: ""}, last_command=LastCommand("soft off", ago(181)), **PENDING), ("hard off", {}, [])),
    ("a soft off in progress is left to finish",
     host(annotations={KEYED: ""}, last_command=LastCommand("soft off", ago(10)), **PENDING), (None, {}, [])),
    ("an escalated hard off is never followed by a soft one while it lands",
     host(annotations={KEYED: ""}, last_command=LastCommand("hard off", ago(1)), command_confirmed=True, **PENDING), (None, {}, [])),
    ("an escalated hard off not obeyed within the retry time is sent again, hard",
     host(annotations={KEYED: ""}, last_command=LastCommand("hard off", ago(31)), command_confirmed=True, **PENDING), ("hard off", {}, [])),
    ("a hard off on record but maybe never sent is sent hard, not soft",
     host(annotations={KEYED: ""}, last_command=LastCommand("hard off", ago(1)), command_confirmed=False, **PENDING), ("hard off", {}, [])),
    ("online false after a hard off stays hard",
     host(online=False, last_command=LastCommand("hard off", ago(1)), command_confirmed=True), (None, {}, [])),
    ("a hard request overrides a soft off in progress",
     host(annotations={KEYED: '{"mode":"hard"}'}, last_command=LastCommand("soft off", ago(10)), **PENDING), ("hard off", {}, [])),
    ("a command is not re-sent while it lands",
     host(power=OFF, recorded_on=False, last_command=LastCommand("on", ago(5))), (None, {}, [])),
    ("a command not obeyed within the retry time is sent again",
     host(power=OFF, recorded_on=False, last_command=LastCommand("on", ago(31))), ("on", {}, [])),
    ("an obeyed command is forgotten",
     host(last_command=LastCommand("on", ago(3))), (None, {"lastPowerCommand": None}, [])),
    ("online false powers the host off, softly",
     host(online=False), ("soft off", {}, [])),
    ("online true powers the host on",
     host(power=OFF, recorded_on=False), ("on", {}, [])),
    ("a host already off when the suffixless annotation appears is powered on again",
     host(annotations={REBOOT: ""}, power=OFF, recorded_on=False), ("on", {"pendingRebootSince": NOW}, [REBOOT])),
]  # fmt: skip


@pytest.mark.parametrize(("state", "expected"), [pytest.param(h, e, id=i) for i, h, e in CASES])
def test_rules(state: Host, expected: tuple[str | None, dict[str, Any], list[str]]) -> None:
    command, status, removed = expected
    decision = decide(state, NOW, SETTINGS)
    assert views.command(decision) == command
    changes = views.status_changes(state, decision)
    for name, value in status.items():
        assert changes.get(name, "absent") == value, name
    assert views.removed(decision) == removed


def test_annotation_contents_are_ignored_but_preserved() -> None:
    value = "machine 3f2a uid, not JSON"
    decision = decide(host(annotations={KEYED: value}), NOW, SETTINGS)
    assert views.command(decision) == "soft off"
    assert KEYED not in views.removed(decision)
    assert [m.split(":")[0] for m in reported(decision, REASON_INVALID_REBOOT)] == [KEYED]


def test_pending_is_strictly_later_than_a_last_powered_on_of_the_same_instant() -> None:
    first_sight = host(recorded_on=None, last_powered_on=None, annotations={KEYED: ""})
    decision = decide(first_sight, NOW, SETTINGS)
    changes = views.status_changes(first_sight, decision)
    assert changes["lastPoweredOn"] == NOW
    assert changes["pendingRebootSince"] == NOW + MICROSECOND
    assert views.command(decision) == "soft off"


def test_unprovisioned_hosts_say_why_nothing_happened() -> None:
    decision = decide(host(provisioning_state="inspecting", annotations={KEYED: ""}), NOW, SETTINGS)
    [why] = reported(decision, REASON_REBOOT_IGNORED)
    assert "inspecting" in why


def test_a_user_can_tell_the_reboot_completed() -> None:
    state = host(power=ON, recorded_on=False, **PENDING)
    decision = decide(state, NOW, SETTINGS)
    assert [e.reason for e in decision.events] == ["PoweredOn", "RebootCompleted"]
    assert views.status_changes(state, decision)["lastPoweredOn"] > PENDING["pending_reboot_since"]


def test_requeue_is_quick_while_power_changes_and_slow_when_settled() -> None:
    assert requeue_after(decide(host(online=False), NOW, SETTINGS)) == SETTINGS.first_poll
    landing = host(online=False, last_command=LastCommand("soft off", ago(0.05)))
    assert requeue_after(decide(landing, NOW, SETTINGS)) == SETTINGS.first_poll
    slow = host(power=OFF, recorded_on=False, last_command=LastCommand("on", ago(8)))
    assert requeue_after(decide(slow, NOW, SETTINGS)) == SETTINGS.transition_poll
    assert requeue_after(decide(host(), NOW, SETTINGS)) == SETTINGS.poll_interval
