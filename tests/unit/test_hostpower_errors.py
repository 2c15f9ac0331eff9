"""The host power controller's error rules, pure: the retry schedule (ordinary and after
refused logins), which changes retry early, the status written on a failed attempt, on
recovery and on a refused write, and when a recorded power command is sent again after a
restart (a table: this one is safety logic)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lightkube.models.meta_v1 import ObjectMeta

from metalmend.api.names import REBOOT
from metalmend.api.power import PowerState
from metalmend.api.resources import BareMetalHost
from metalmend.controllers.hostpower import host_power_relevant
from metalmend.kube.controller import beyond_status
from metalmend.policy.hostpower import (
    Host,
    LastCommand,
    PowerCommand,
    PowerSettings,
    PowerStatus,
    RetrySettings,
    credentials_inputs,
    decide,
    retry_delay,
    send_recorded_now,
    user_inputs,
)
from tests.unit import hostpower_views as views

RETRY = RetrySettings()
SETTINGS = PowerSettings(soft_timeout=180, poll_interval=20, transition_poll=1, command_retry=30)
NOW = dt.datetime(2026, 11, 20, 12, 0, 0, tzinfo=dt.UTC)


def attempts_within(seconds: float, jitters: list[float], auth: bool) -> int:
    """Attempts a host that always fails makes in ``seconds`` (the first one at 0)."""
    t, made = 0.0, 0
    while t <= seconds:
        made += 1
        delay = retry_delay(made, made if auth else 0, jitters[made % len(jitters)], RETRY)
        t += delay
    return made


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 60.0), (50, 60.0)],
    ids=lambda v: str(v),
)
def test_ordinary_errors_back_off_from_1s_doubling_to_60s(failures: int, expected: float) -> None:
    assert retry_delay(failures, 0, 0.0, RETRY) == expected


@pytest.mark.parametrize(
    ("failures", "expected"), [(1, 300.0), (2, 900.0), (3, 2700.0), (4, 3600.0), (30, 3600.0)]
)
def test_refused_logins_back_off_from_5min_to_an_hour(failures: int, expected: float) -> None:
    assert retry_delay(failures + 3, failures, 0.0, RETRY) == expected


@given(st.floats(0, 1))
def test_jitter_only_delays(jitter: float) -> None:
    for failures in range(1, 12):
        plain = retry_delay(failures, 0, 0.0, RETRY)
        assert plain <= retry_delay(failures, 0, jitter, RETRY) <= plain * (1 + RETRY.jitter)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=10))
def test_a_failing_host_makes_at_most_7_attempts_in_its_first_minute(jitters: list[float]) -> None:
    assert attempts_within(60, jitters, auth=False) <= 7
    assert attempts_within(600, jitters, auth=False) <= 7 + 9  # then one a minute


@given(st.lists(st.floats(0, 1), min_size=1, max_size=10), st.integers(0, 20))
def test_a_wrong_password_never_fails_3_logins_within_15_minutes(
    jitters: list[float], start: int
) -> None:
    """pam_faillock's default (deny=3, fail_interval=900 s) is never reached, wherever the
    15-minute window starts."""
    times, t = [], 0.0
    for made in range(1, 25):
        times.append(t)
        t += retry_delay(made, made, jitters[made % len(jitters)], RETRY)
    window_start = times[min(start, len(times) - 1)]
    assert sum(window_start <= x < window_start + 900 for x in times) <= 2


def spec(**bmc: Any) -> dict[str, Any]:
    base = {"address": "redfish://10.0.0.1/redfish/v1/Systems/1", "credentialsName": "bmc"}
    return {"online": True, "bmc": {**base, **bmc}}


def test_user_inputs_are_what_a_user_changes_to_ask_for_something_new() -> None:
    before = user_inputs(spec(), {"unrelated": "x"})
    assert user_inputs(spec(), {"unrelated": "y"}) == before
    assert user_inputs(spec(), {REBOOT: ""}) != before
    assert user_inputs({**spec(), "online": False}, {}) != before
    assert user_inputs(spec(address="ipmi://10.0.0.2"), {}) != before
    assert user_inputs(spec(disableCertificateVerification=True), {}) != before


def test_after_refused_logins_only_a_new_address_or_secret_retries_early() -> None:
    before = credentials_inputs(spec(), {})
    assert credentials_inputs({**spec(), "online": False}, {REBOOT: ""}) == before
    assert credentials_inputs(spec(credentialsName="fixed"), {}) != before
    assert credentials_inputs(spec(address="ipmi://10.0.0.2"), {}) != before


def test_a_failed_attempt_counts_once_and_may_forget_the_command() -> None:
    wire = {
        "poweredOn": True,
        "errorCount": 2,
        "lastPowerCommand": {"action": "on", "at": "2026-11-20T11:59:00Z"},
    }
    status = PowerStatus.from_wire(wire)
    failed = status.failed("power management error", "no route", forget_command=True)
    assert failed.to_wire(wire) == {
        "poweredOn": True,
        "errorCount": 3,
        "errorType": "power management error",
        "errorMessage": "no route",
        "operationalStatus": "error",
    }
    kept = status.failed("registration error", "x", forget_command=False).to_wire(wire)
    assert kept["lastPowerCommand"] == {"action": "on", "at": "2026-11-20T11:59:00.000000Z"}


def test_recovery_clears_errors_and_a_refused_writes_condition() -> None:
    refused = PowerStatus(powered_on=False).refused("refused by policy", NOW).to_wire({})
    assert refused["operationalStatus"] == "error"
    (condition,) = refused["conditions"]
    assert condition["type"] == "WritesAccepted"
    assert condition["status"] == "False"
    assert condition["lastTransitionTime"] == "2026-11-20T12:00:00Z"
    before = {**refused, "errorCount": 4}
    status = PowerStatus.from_wire(before)
    assert status.in_error
    recovered = status.recovered().to_wire(before)
    assert recovered["conditions"] == []
    assert (recovered["errorType"], recovered["errorCount"], recovered["operationalStatus"]) == (
        "",
        0,
        "OK",
    )
    healthy = {"poweredOn": True}
    assert not PowerStatus.from_wire(healthy).in_error
    assert PowerStatus.from_wire(healthy).recovered().to_wire(healthy) == {
        "poweredOn": True,
        "operationalStatus": "OK",
    }


def test_a_status_written_around_us_reads_as_absent_fields() -> None:
    hostile = {
        "poweredOn": "yes",
        "errorCount": "many",
        "lastPowerCommand": {"action": "explode", "at": "now"},
        "poweredOffFor": "all of them",
        "provisioning": {"lastPoweredOn": "yesterday", "pendingRebootSince": 5},
    }
    assert PowerStatus.from_wire(hostile) == PowerStatus()


# ---- a recorded command after a restart: when is it sent? ---------------------------------

ON: PowerCommand = "on"
SOFT: PowerCommand = "soft off"
HARD: PowerCommand = "hard off"
RECORD_CASES: list[tuple[str, PowerCommand | None, PowerCommand, bool, float | None, bool]] = [
    # id, recorded action, needed command, sent by this process, seconds since, send now
    ("nothing recorded: send", None, ON, True, None, True),
    ("another command recorded: send", SOFT, ON, True, 1.0, True),
    ("sent by us just now: wait for it to land", ON, ON, True, 1.0, False),
    ("sent by us, not obeyed for command_retry: send again", ON, ON, True, 30.0, True),
    ("recorded before a restart, not landed: send at once", ON, ON, False, 1.0, True),
    ("recorded before a restart, hard off not landed: send at once", HARD, HARD, False, 0.0, True),
    ("recorded, BMC busy at the send (never sent): send at once", SOFT, SOFT, False, 2.0, True),
]


@pytest.mark.parametrize(
    ("recorded", "needed", "confirmed", "since", "send"),
    [c[1:] for c in RECORD_CASES],
    ids=[c[0] for c in RECORD_CASES],
)
def test_when_a_recorded_command_is_sent(
    recorded: PowerCommand | None,
    needed: PowerCommand,
    confirmed: bool,
    since: float | None,
    send: bool,
) -> None:
    last = LastCommand(recorded, NOW) if recorded else None
    assert send_recorded_now(last, needed, confirmed, since, SETTINGS) is send


BASE = Host(
    online=True,
    provisioning_state="provisioned",
    externally_provisioned=False,
    annotations={},
    power=PowerState.OFF,
    status=PowerStatus(powered_on=False, last_powered_on=NOW - dt.timedelta(hours=1)),
)


def host(**changes: Any) -> Host:
    return views.host(BASE, **changes)


def test_a_power_on_recorded_before_a_crash_is_sent_at_once_after_the_restart() -> None:
    """The kill between recording "on" and sending it: the host must not stay off for
    command_retry (30 s) when the BMC, just read, says it is still off."""
    recorded = LastCommand("on", NOW - dt.timedelta(seconds=2))
    same_process = decide(host(last_command=recorded), NOW, SETTINGS)
    assert views.command(same_process) is None  # ours, in flight: wait for it to land
    unconfirmed = host(last_command=recorded, command_confirmed=False)
    restarted = decide(unconfirmed, NOW, SETTINGS)
    assert views.command(restarted) == "on"
    changes = views.status_changes(unconfirmed, restarted)
    assert changes["lastPowerCommand"] == {"action": "on", "at": NOW}


def test_a_landed_command_is_not_sent_again_after_a_restart() -> None:
    recorded = LastCommand("on", NOW - dt.timedelta(seconds=2))
    landed = host(last_command=recorded, command_confirmed=False, power=PowerState.ON)
    assert views.command(decide(landed, NOW, SETTINGS)) is None


def test_a_soft_off_sent_again_after_a_restart_keeps_its_time_for_the_escalation() -> None:
    sent = NOW - dt.timedelta(seconds=100)
    recorded = LastCommand("soft off", sent)
    on = host(online=False, power=PowerState.ON, recorded_on=True, last_command=recorded,
              command_confirmed=False)  # fmt: skip
    decision = decide(on, NOW, SETTINGS)
    assert views.command(decision) == "soft off"
    assert views.status_changes(on, decision).get("lastPowerCommand", {"at": sent})["at"] == sent
    confirmed = decide(dataclasses.replace(on, command_confirmed=True), NOW, SETTINGS)
    assert views.command(confirmed) is None  # ours: let it run until soft_timeout


# ---- the watch predicate: status-only updates do not wake host-power ----------------------


def bmh(**meta: Any) -> Any:
    status = meta.pop("status", {"poweredOn": True})
    base = {"name": "h", "namespace": "ns", "generation": 1, "resourceVersion": "1"}
    return BareMetalHost(metadata=ObjectMeta(**{**base, **meta}), spec={}, status=status)


def test_host_power_ignores_updates_that_changed_only_status() -> None:
    old = bmh()
    assert not host_power_relevant(old, bmh(resourceVersion="2", status={"errorCount": 3}))
    assert host_power_relevant(old, bmh(resourceVersion="2", generation=2))
    assert host_power_relevant(old, bmh(annotations={REBOOT: ""}))
    assert host_power_relevant(old, bmh(labels={"a": "b"}))
    assert host_power_relevant(old, bmh(finalizers=["x"]))
    assert host_power_relevant(None, old)
    assert host_power_relevant(old, None)
    provisioned = {"provisioning": {"state": "provisioned"}}
    assert host_power_relevant(old, bmh(status=provisioned))  # written by someone else
    assert beyond_status(old, bmh(status=provisioned)) is False  # the runtime's own rule


# ---- the runtime: one line for a passing API server problem ------------------------------


def test_a_transient_api_error_is_one_line_with_its_cause() -> None:
    import httpx2

    from metalmend.kube.controller import transient

    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as cause:
            raise httpx2.ConnectError("") from cause
    except httpx2.ConnectError as error:
        line = transient(error)
    assert line is not None
    assert "\n" not in line
    assert line.startswith("cannot reach the API server: ConnectError:")
    assert "Connection refused" in line
    assert transient(ValueError("a bug")) is None  # bugs keep their traceback


def test_kinds_without_a_generation_compare_their_spec() -> None:
    from lightkube.models.core_v1 import NodeSpec
    from lightkube.resources.core_v1 import Node

    old = Node(metadata=ObjectMeta(name="n", resourceVersion="1"), spec=NodeSpec())
    same = Node(metadata=ObjectMeta(name="n", resourceVersion="2"), spec=NodeSpec())
    tainted = Node(metadata=ObjectMeta(name="n"), spec=NodeSpec(unschedulable=True))
    assert not beyond_status(old, same)
    assert beyond_status(old, tainted)
