"""Which Node events wake the health checks (controllers.healthcheck.node_health_changed):
whatever can change a verdict, never a heartbeat (benchmarks/scale.py: at 5,000 Nodes the
heartbeats were several full evaluations of every Machine a second); and how long one may
wait (``node_wait``): the pause after a long evaluation, never past a verdict it brings."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from lightkube.models.core_v1 import NodeCondition, NodeStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node

from metalmend.controllers.healthcheck import node_health_changed, node_wait
from metalmend.policy.healthcheck import Check, UnhealthyCondition

T0 = dt.datetime(2026, 11, 25, 12, 0, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def node(
    *conditions: tuple[str, str, dt.datetime | None, dt.datetime],
    uid: str = "u1",
    deleting: bool = False,
) -> Any:
    """A Node with (type, status, lastTransitionTime, lastHeartbeatTime) conditions."""
    return Node(
        metadata=ObjectMeta(
            name="worker-1", uid=uid, deletionTimestamp=at(99) if deleting else None
        ),
        status=NodeStatus(
            conditions=[
                NodeCondition(type=t, status=s, lastTransitionTime=since, lastHeartbeatTime=beat)
                for t, s, since, beat in conditions
            ]
        ),
    )


READY = ("Ready", "True", at(0), at(0))
BEAT = ("Ready", "True", at(0), at(300))  # the same condition, heartbeat renewed


@pytest.mark.parametrize(
    ("old", "new", "wakes"),
    [
        pytest.param(node(READY), node(BEAT), False, id="heartbeat only: nothing to evaluate"),
        pytest.param(
            node(READY, ("MemoryPressure", "False", at(0), at(0))),
            node(("MemoryPressure", "False", at(0), at(300)), BEAT),
            False,
            id="every condition's heartbeat, in another order",
        ),
        pytest.param(
            node(READY), node(("Ready", "Unknown", at(300), at(300))), True, id="status changed"
        ),
        pytest.param(
            node(READY), node(("Ready", "True", at(5), at(5))), True, id="transition changed"
        ),
        pytest.param(
            node(READY),
            node(READY, ("KernelDeadlock", "True", at(300), at(300))),
            True,
            id="a condition appeared",
        ),
        pytest.param(
            node(("Ready", "True", None, at(0))),
            node(("Ready", "True", None, at(300))),
            True,
            id="no transition time: the heartbeat is its start, as the verdict reads it",
        ),
        pytest.param(node(READY), node(READY, deleting=True), True, id="deleting"),
        pytest.param(node(READY), node(READY, uid="u2"), True, id="replaced by a new Node"),
        pytest.param(None, node(READY), True, id="created"),
        pytest.param(node(READY), None, True, id="deleted"),
    ],
)
def test_node_events_that_wake_the_checks(old: Any, new: Any, wakes: bool) -> None:
    assert node_health_changed(old, new) is wakes


DEADLOCK = Check(unhealthy_conditions=(UnhealthyCondition("KernelDeadlock", "True", 5),))


@pytest.mark.parametrize(
    ("old", "new", "now", "paused", "wait"),
    [
        pytest.param(node(READY), node(READY, ("KernelDeadlock", "True", at(0), at(0))),
                     at(1), 2.0, 2.0, id="unhealthy, due in 4 s: the pause (2 s)"),
        pytest.param(node(READY), node(READY, ("KernelDeadlock", "True", at(0), at(0))),
                     at(1), 9.0, 4.0, id="a pause past its verdict: at the verdict (4 s)"),
        pytest.param(node(READY), node(READY, ("KernelDeadlock", "True", at(0), at(0))),
                     at(30), 9.0, 0.0, id="seen after its timeout: at once"),
        pytest.param(node(READY, ("KernelDeadlock", "True", at(0), at(0))), node(BEAT),
                     at(1), 9.0, 9.0, id="healthy again: the pause"),
        pytest.param(node(READY), node(READY, deleting=True), at(1), 9.0, 0.0,
                     id="deleting: at once"),
        pytest.param(node(READY), node(READY, uid="u2"), at(1), 9.0, 0.0,
                     id="replaced: at once"),
        pytest.param(None, node(READY), at(1), 9.0, 0.0, id="created: at once"),
        pytest.param(node(READY), None, at(1), 9.0, 0.0, id="deleted: at once"),
    ],
)  # fmt: skip
def test_a_node_change_waits_the_pause_but_never_past_its_verdict(
    old: Any, new: Any, now: dt.datetime, paused: float, wait: float
) -> None:
    assert node_wait(old, new, DEADLOCK, now, paused) == pytest.approx(wait)


def test_a_node_change_under_a_check_it_cannot_read_waits_for_nothing() -> None:
    """No rules (the check is gone, or its spec is one the evaluation will refuse, saying
    why on the check): evaluated at once, as before."""
    unhealthy = node(READY, ("KernelDeadlock", "True", at(0), at(0)))
    assert node_wait(node(READY), unhealthy, None, at(1), 9.0) == 0.0
