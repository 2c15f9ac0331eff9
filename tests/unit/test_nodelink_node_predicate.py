"""Which Node events wake node-link (controllers.nodelink.node_facts_changed): what can
change a link (the Node appearing, going, a new uid or providerID), never a status update.
At 5,000 kwok Nodes, their heartbeats (one per Node every five minutes, as a kubelet's)
were 17 reconciles a second of node-link on the leader, each deciding nothing
(benchmarks/sharding.py: the leader's CPU at rest above the other replicas')."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from lightkube.models.core_v1 import NodeCondition, NodeSpec, NodeStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node

from metalmend.controllers.nodelink import node_facts_changed

T0 = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)


def node(
    *,
    uid: str = "u1",
    provider: str | None = "metal3://ns/worker-1",
    beat: float = 0.0,
    labels: dict[str, str] | None = None,
) -> Any:
    return Node(
        metadata=ObjectMeta(name="worker-1", uid=uid, labels=labels),
        spec=NodeSpec(providerID=provider),
        status=NodeStatus(
            conditions=[
                NodeCondition(
                    type="Ready", status="True", lastTransitionTime=T0,
                    lastHeartbeatTime=T0 + dt.timedelta(seconds=beat),
                )
            ]
        ),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "wakes"),
    [
        pytest.param(node(), node(beat=300), False, id="a heartbeat: nothing to link"),
        pytest.param(node(), node(labels={"zone": "b"}), False, id="a label: not read"),
        pytest.param(node(provider=None), node(), True, id="providerID set"),
        pytest.param(node(), node(provider="metal3://ns/worker-2"), True, id="providerID moved"),
        pytest.param(node(), node(uid="u2"), True, id="replaced by a new Node"),
        pytest.param(None, node(), True, id="created"),
        pytest.param(node(), None, True, id="deleted"),
    ],
)
def test_node_events_that_wake_node_link(old: Any, new: Any, wakes: bool) -> None:
    assert node_facts_changed(old, new) is wakes
