"""Fencing by the out-of-service taint (policy.remediation, strategy out-of-service-taint):
power off and hold, confirm off with our own BMC reads, taint, wait for the Node's pods
and VolumeAttachments to go, power on, untaint once Ready. Pure: no I/O."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from metalmend.policy import remediation as r
from metalmend.policy.fencing import HostPower
from tests.unit.test_policy_remediation import (
    OFF_FOR_US,
    ON,
    T0,
    host,
    kinds,
    node,
    observed,
    progress_of,
    sec,
)

TAINT = r.Settings(fence=r.FenceMethod.OUT_OF_SERVICE_TAINT, confirm_window=10, confirm_reads=3)
HELD_ON = HostPower(holds_key=True, powered_on=True, acknowledged=False, power_on_in_flight=False)
TAINTED = node(out_of_service=True)


def at(phase: r.Phase, **kw: Any) -> r.Progress:
    fields: dict[str, Any] = dict(phase=phase, phase_since=T0, node="node-1")
    fields.update(kw)
    return r.Progress(**fields)


def decide(now: float = 0, **kw: Any) -> r.Decision:
    return r.decide(observed(**kw), T0 + sec(now), TAINT)


# (id, observed, seconds after T0, expected actions, expected phase afterwards (None: none set))
CASES: list[tuple[str, dict[str, Any], float, list[str], r.Phase | None]] = [
    (
        "reported off starts the confirmation, no taint yet",
        dict(progress=at(r.POWER_OFF), host=host(OFF_FOR_US)),
        1,
        ["SetProgress"],
        r.CONFIRMING,
    ),
    (
        "a first read off is counted, no taint yet",
        dict(progress=at(r.CONFIRMING), host=host(OFF_FOR_US), power_read=r.PowerRead(off=True)),
        0,
        ["SetProgress"],
        r.CONFIRMING,
    ),
    (
        "enough reads but not over the whole window: no taint",
        dict(
            progress=at(r.CONFIRMING, off_reads=2, off_read_since=T0, last_read_at=T0 + sec(5)),
            host=host(OFF_FOR_US),
            power_read=r.PowerRead(off=True),
        ),
        9,
        ["SetProgress"],
        r.CONFIRMING,
    ),
    (
        "the last read over the window confirms: fencing",
        dict(
            progress=at(r.CONFIRMING, off_reads=2, off_read_since=T0, last_read_at=T0 + sec(5)),
            host=host(OFF_FOR_US),
            power_read=r.PowerRead(off=True),
        ),
        10,
        ["SetProgress"],
        r.FENCING,
    ),
    (
        "a read on after the off report starts the power-off over",
        dict(
            progress=at(r.CONFIRMING, off_reads=2, off_read_since=T0),
            host=host(OFF_FOR_US),
            power_read=r.PowerRead(off=False),
        ),
        5,
        ["SetProgress", "RequestPowerOff"],
        r.POWER_OFF,
    ),
    (
        "a failed read is not counted",
        dict(
            progress=at(r.CONFIRMING, off_reads=1, off_read_since=T0),
            host=host(OFF_FOR_US),
            power_read=r.PowerRead(off=None, error="BMC unreachable"),
        ),
        5,
        ["SetProgress"],
        None,
    ),
    (
        "host-power no longer reports off while confirming: power-off again",
        dict(progress=at(r.CONFIRMING, off_reads=2), host=host(HELD_ON)),
        5,
        ["SetProgress", "RequestPowerOff"],
        r.POWER_OFF,
    ),
    (
        "fencing without the confirmation recorded goes back to confirming",
        dict(progress=at(r.FENCING, off_reads=1), host=host(OFF_FOR_US)),
        0,
        ["SetProgress"],
        r.CONFIRMING,
    ),
    (
        "confirmed: taint, keep the key, evacuate",
        dict(progress=at(r.FENCING, off_reads=3), host=host(OFF_FOR_US)),
        0,
        ["SetProgress", "TaintNode", "DeletePods", "SetProgress"],
        r.EVACUATING,
    ),
    (
        "restarted after the taint: not tainted twice",
        dict(progress=at(r.FENCING, off_reads=3), host=host(OFF_FOR_US), node=TAINTED),
        0,
        ["DeletePods", "SetProgress"],
        r.EVACUATING,
    ),
    (
        "pods left on the Node: the host stays off",
        dict(
            progress=at(r.EVACUATING, off_reads=3),
            host=host(OFF_FOR_US),
            node=TAINTED,
            evacuation=r.Evacuation(pods=("db/db-0",)),
        ),
        30,
        ["SetProgress"],
        None,
    ),
    (
        "a VolumeAttachment left: the host stays off",
        dict(
            progress=at(r.EVACUATING, off_reads=3),
            host=host(OFF_FOR_US),
            node=TAINTED,
            evacuation=r.Evacuation(attachments=("csi-123",)),
        ),
        30,
        ["SetProgress"],
        None,
    ),
    (
        "not looked at yet: nothing",
        dict(progress=at(r.EVACUATING, off_reads=3), host=host(OFF_FOR_US), node=TAINTED),
        30,
        [],
        None,
    ),
    (
        "pods gone and volumes detached: power-on, the taint stays",
        dict(
            progress=at(r.EVACUATING, off_reads=3),
            host=host(OFF_FOR_US),
            node=TAINTED,
            evacuation=r.Evacuation(),
        ),
        30,
        ["SetProgress", "ReleasePower"],
        r.POWER_ON,
    ),
    (
        "the taint removed by someone while evacuating is put back",
        dict(
            progress=at(r.EVACUATING, off_reads=3),
            host=host(OFF_FOR_US),
            evacuation=r.Evacuation(pods=("db/db-0",)),
        ),
        30,
        ["TaintNode", "SetProgress"],
        None,
    ),
    (
        "host no longer reported off while tainted: untaint first, power-off again",
        dict(
            progress=at(r.EVACUATING, off_reads=3),
            host=host(HELD_ON),
            node=TAINTED,
            evacuation=r.Evacuation(pods=("db/db-0",)),
        ),
        30,
        ["UntaintNode", "SetProgress", "RequestPowerOff"],
        r.POWER_OFF,
    ),
    (
        "evacuating without the confirmation recorded: untaint, confirm again",
        dict(
            progress=at(r.EVACUATING, off_reads=1),
            host=host(OFF_FOR_US),
            node=TAINTED,
            evacuation=r.Evacuation(),
        ),
        30,
        ["UntaintNode", "SetProgress"],
        r.CONFIRMING,
    ),
    (
        "a taint found in power-off on a host not reported off is removed",
        dict(progress=at(r.POWER_OFF), host=host(HELD_ON), node=TAINTED),
        1,
        ["UntaintNode"],
        None,
    ),
    (
        "the Node back and Ready after the power-on: untaint",
        dict(
            progress=at(r.POWER_ON, off_reads=3),
            host=host(ON),
            node=node(ready=True, out_of_service=True, ready_since=T0 + sec(40)),
        ),
        50,
        ["UntaintNode", "SetProgress"],
        r.WAITING,
    ),
    (
        "Ready from before the power-on is not back: the taint stays",
        dict(
            progress=at(r.POWER_ON, off_reads=3),
            host=host(ON),
            node=node(ready=True, out_of_service=True, ready_since=T0 - sec(40)),
        ),
        50,
        [],
        None,
    ),
]


@pytest.mark.parametrize(
    ("given", "now", "actions", "phase"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_taint_strategy(
    given: dict[str, Any], now: float, actions: list[str], phase: r.Phase | None
) -> None:
    decision = decide(now, **given)
    assert kinds(decision) == actions
    if phase is not None:
        assert progress_of(decision).phase == phase


def test_the_reads_are_spread_over_the_window() -> None:
    progress = at(r.CONFIRMING)
    assert r.read_due(progress, T0, TAINT)
    read = replace(progress, last_read_at=T0)
    assert not r.read_due(read, T0 + sec(4.9), TAINT)
    assert r.read_due(read, T0 + sec(5), TAINT)  # 3 reads over 10 s: every 5 s
    assert not r.read_due(progress, T0, r.Settings())  # deletion strategy: no reads


def test_a_failed_read_fails_the_attempt_after_the_timeout_and_window() -> None:
    decision = decide(
        71,
        progress=at(r.CONFIRMING, last_read_at=T0 + sec(66)),  # reads failing throughout
        host=host(OFF_FOR_US),
        power_read=r.PowerRead(off=None, error="BMC unreachable"),
    )
    assert progress_of(decision).phase == r.BACKOFF
    assert "ReleasePower" in kinds(decision)


@pytest.mark.parametrize("last_read", [None, 1.0], ids=["no read yet", "one read, long ago"])
def test_a_failed_read_after_none_for_the_whole_timeout_counts_the_timeout_from_itself(
    last_read: float | None,
) -> None:
    """The controller was down (killed, restarting on a loaded machine) past the deadline:
    its first read failing does not fail the attempt and release a host that is off (it
    would be powered on, then off again: a second power cycle); the timeout counts from
    this read, and reads failing through all of it still fail the attempt."""
    read_at = None if last_read is None else T0 + sec(last_read)
    failed = r.PowerRead(off=None, error="BMC unreachable")
    decision = decide(
        130, progress=at(r.CONFIRMING, last_read_at=read_at), host=host(OFF_FOR_US),
        power_read=failed,
    )  # fmt: skip
    assert kinds(decision) == ["SetProgress"]
    resumed = progress_of(decision)
    assert (resumed.phase, resumed.phase_since, resumed.last_read_at) == (
        r.CONFIRMING, T0 + sec(130), T0 + sec(130),
    )  # fmt: skip
    later = decide(130 + 71, progress=replace(resumed, last_read_at=T0 + sec(130 + 66)),
                   host=host(OFF_FOR_US), power_read=failed)  # fmt: skip
    assert progress_of(later).phase == r.BACKOFF


def test_a_failed_attempt_untaints_before_releasing_the_host() -> None:
    decision = decide(
        200,
        progress=at(r.CONFIRMING),
        host=host(OFF_FOR_US),
        node=TAINTED,
    )
    assert kinds(decision).index("UntaintNode") < kinds(decision).index("ReleasePower")


def test_deletion_untaints_before_releasing_the_host() -> None:
    decision = decide(
        0,
        progress=at(r.EVACUATING, off_reads=3),
        host=host(OFF_FOR_US),
        node=TAINTED,
        deleting_since=T0,
    )
    assert kinds(decision)[:2] == ["UntaintNode", "ReleasePower"]


def test_the_taint_is_never_decided_before_enough_reads() -> None:
    """Whatever the count of reads so far and the time, a decision that taints the Node
    was made in phase fencing with the confirmation complete."""
    for reads in range(4):
        for phase in (r.POWER_OFF, r.CONFIRMING, r.FENCING, r.EVACUATING):
            for t in (0, 5, 10, 60):
                decision = decide(
                    t,
                    progress=at(phase, off_reads=reads, off_read_since=T0),
                    host=host(OFF_FOR_US),
                    power_read=r.PowerRead(off=True),
                )
                if "TaintNode" in kinds(decision):
                    assert reads >= TAINT.confirm_reads


@pytest.mark.parametrize(
    ("tolerations", "deleting", "blocks"),
    [
        pytest.param([], False, True, id="no toleration: the taint removes it"),
        pytest.param([{"operator": "Exists"}], False, False, id="tolerates everything: stays"),
        pytest.param([{"operator": "Exists"}], True, True, id="tolerates but is being deleted"),
        pytest.param(
            [
                {
                    "key": "node.kubernetes.io/out-of-service",
                    "operator": "Exists",
                    "effect": "NoExecute",
                }
            ],
            False,
            False,
            id="tolerates the taint by key",
        ),
        pytest.param(
            [{"key": "node.kubernetes.io/out-of-service", "value": "other"}],
            False,
            True,
            id="another value does not tolerate it",
        ),
        pytest.param(
            [
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                }
            ],
            False,
            True,
            id="the unreachable toleration does not",
        ),
        pytest.param(
            [{"operator": "Exists", "effect": "NoSchedule"}],
            False,
            True,
            id="a NoSchedule toleration does not",
        ),
    ],
)
def test_which_pods_hold_the_host_off(
    tolerations: list[dict[str, str]], deleting: bool, blocks: bool
) -> None:
    assert r.blocks_evacuation(deleting, tolerations) is blocks


def test_progress_round_trips_the_confirmation() -> None:
    progress = at(r.CONFIRMING, off_reads=2, off_read_since=T0, last_read_at=T0 + sec(5))
    assert r.Progress.from_wire(progress.to_wire({})) == progress
    assert r.Progress.from_wire({"offReads": "two"}).off_reads == 0
