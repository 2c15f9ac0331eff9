"""Host-power's word to remediation that a host is off for a reboot key
(``status.poweredOffFor``), and a power-on that may still land never forgotten: the rules
of policy.hostpower that policy.fencing relies on (pure: no I/O). Each id reads as the rule
it proves."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from metalmend.api.names import REBOOT
from metalmend.api.power import PowerState
from metalmend.policy.fencing import POWERED_OFF_FOR
from metalmend.policy.hostpower import (
    Decision,
    Host,
    LastCommand,
    PowerCommand,
    PowerSettings,
    PowerStatus,
    decide,
    forget_refused_command,
)
from tests.unit import hostpower_views as views

T0 = dt.datetime(2026, 11, 20, 12, 0, 0, tzinfo=dt.UTC)
NOW = T0 + dt.timedelta(minutes=1)
OURS = "reboot.metal3.io/metal3-remediation-u1"
ANNOTATION_FLOW = "reboot.metal3.io/machine-remediation"
SETTINGS = PowerSettings(soft_timeout=180, poll_interval=20, transition_poll=1, command_retry=30)
ON, OFF = PowerState.ON, PowerState.OFF
ABSENT = "absent"


BASE = Host(
    online=True,
    provisioning_state="provisioned",
    externally_provisioned=False,
    annotations={OURS: '{"mode":"hard"}'},
    power=OFF,
    status=PowerStatus(
        powered_on=False, last_powered_on=T0, pending_reboot_since=T0 + dt.timedelta(seconds=30)
    ),
)


def host(**changes: Any) -> Host:
    return views.host(BASE, **changes)


def requeue_after(decision: Decision) -> float:
    assert decision.requeue_at is not None
    return (decision.requeue_at - NOW).total_seconds()


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


# id, host, expected poweredOffFor write (ABSENT: not written; None: cleared)
ACKNOWLEDGEMENTS = [
    ("a key is listed once the host is read off while it is there",
     host(), [OURS]),
    ("every keyed request present is listed, each for itself",
     host(annotations={OURS: "", ANNOTATION_FLOW: ""}), sorted([OURS, ANNOTATION_FLOW])),
    ("nothing is written when the list is already right",
     host(powered_off_for=(OURS,)), ABSENT),
    ("a key removed is dropped from the list",
     host(annotations={}, powered_off_for=(OURS,)), None),
    ("a key from before is dropped, the present one listed",
     host(annotations={ANNOTATION_FLOW: ""}, powered_off_for=(OURS,)), [ANNOTATION_FLOW]),
    ("the list is emptied when the host is read on",
     host(power=ON, recorded_on=False, powered_off_for=(OURS,)), None),
    ("no key is listed while a power-on of ours may still land",
     host(last_command=LastCommand("on", ago(5))), ABSENT),
    ("nor once that power-on is older than command_retry: it may still land",
     host(last_command=LastCommand("on", ago(300))), ABSENT),
    ("a listing is withdrawn if a power-on is on record",
     host(last_command=LastCommand("on", ago(5)), powered_off_for=(OURS,)), None),
    ("an obeyed power-off on record does not prevent the listing",
     host(last_command=LastCommand("hard off", ago(2))), [OURS]),
    ("the suffixless request is nobody's key: not listed",
     host(annotations={REBOOT: ""}, online=False), ABSENT),
    ("annotations a host does not honour are not listed (they do not hold it off)",
     host(provisioning_state="inspecting"), ABSENT),
    ("a deprovisioned host lists nothing",
     host(provisioning_state="deprovisioning", powered_off_for=(OURS,)), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("state", "listed"), [pytest.param(h, e, id=i) for i, h, e in ACKNOWLEDGEMENTS]
)
def test_powered_off_for(state: Host, listed: Any) -> None:
    decision = decide(state, NOW, SETTINGS)
    assert views.status_changes(state, decision).get(POWERED_OFF_FOR, ABSENT) == listed


# id, host: off, held off (or spec.online false), an "on" of ours on record and not obeyed
KEPT = [
    ("a power-on still landing when a reboot key arrives stays on record",
     host(last_command=LastCommand("on", ago(1)))),
    ("so does one not obeyed within command_retry: a slow BMC may still carry it out",
     host(last_command=LastCommand("on", ago(31)))),
    ("so does one recorded by an earlier process (it may have been sent)",
     host(last_command=LastCommand("on", ago(31)), command_confirmed=False)),
    ("and one left when spec.online turned false",
     host(annotations={}, online=False, pending_reboot_since=None, last_command=LastCommand("on", ago(300)))),
]  # fmt: skip


@pytest.mark.parametrize("state", [pytest.param(h, id=i) for i, h in KEPT])
def test_an_unobeyed_power_on_is_never_forgotten_while_the_host_is_off(state: Host) -> None:
    decision = decide(state, NOW, SETTINGS)
    # Not cancelled by a power-off either: a BMC may ignore a power-off while a power-on
    # is pending (sushy-tools' fake driver does), and carry the "on" out after it.
    changes = views.status_changes(state, decision)
    assert views.command(decision) is None
    assert "lastPowerCommand" not in changes  # remediation reads it as in flight
    assert not changes.get(POWERED_OFF_FOR)


def test_it_is_watched_closely_while_it_should_land_then_at_the_poll_interval() -> None:
    landing = decide(host(last_command=LastCommand("on", ago(2))), NOW, SETTINGS)
    assert requeue_after(landing) <= SETTINGS.transition_poll
    late = decide(host(last_command=LastCommand("on", ago(31))), NOW, SETTINGS)
    assert requeue_after(late) == SETTINGS.poll_interval


def test_once_the_power_on_lands_the_host_is_held_off_and_its_key_listed_after_power_off() -> None:
    landed = host(power=ON, last_command=LastCommand("on", ago(40)), powered_off_for=(OURS,))
    decision = decide(landed, NOW, SETTINGS)
    changes = views.status_changes(landed, decision)
    assert changes[POWERED_OFF_FOR] is None  # read on: nothing is off
    assert views.command(decision) == "hard off"  # the key holds it off
    sent = changes["lastPowerCommand"]
    later = NOW + dt.timedelta(seconds=1)
    off = host(last_command=LastCommand(sent["action"], sent["at"]))
    decision = decide(off, later, SETTINGS)
    changes = views.status_changes(off, decision)
    assert changes["lastPowerCommand"] is None  # obeyed: forgotten
    assert changes[POWERED_OFF_FOR] == [OURS]


def test_a_host_that_must_be_on_is_sent_on_again_when_it_did_not_obey() -> None:
    # online, no reboot request, an "on" not obeyed within command_retry: sent again
    decision = decide(
        host(annotations={}, pending_reboot_since=None, last_command=LastCommand("on", ago(31))),
        NOW,
        SETTINGS,
    )
    assert views.command(decision) == "on"


@pytest.mark.parametrize(
    ("command", "timed_out", "forgotten"),
    [
        pytest.param("on", True, False, id="an on that timed out may still land: kept"),
        pytest.param("on", False, True, id="an on refused outright is forgotten"),
        pytest.param("hard off", True, True, id="a power-off that timed out is forgotten"),
        pytest.param("soft off", False, True, id="a refused power-off is forgotten"),
    ],
)
def test_a_refused_command_is_forgotten_unless_a_power_on_may_have_reached_the_bmc(
    command: PowerCommand, timed_out: bool, forgotten: bool
) -> None:
    assert forget_refused_command(command, timed_out) is forgotten
