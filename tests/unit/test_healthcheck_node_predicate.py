"""Which Node events wake the health checks (controllers.healthcheck.node_health_changed):
whatever can change a verdict, never a heartbeat (benchmarks/scale.py: at 5,000 Nodes the
heartbeats were several full evaluations of every Machine a second)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from lightkube.models.core_v1 import NodeCondition, NodeStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node

from metalmend.controllers.healthcheck import node_health_changed

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
