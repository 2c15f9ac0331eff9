"""The lab runs the real kube-scheduler: pods are bound to Nodes that have room for them, and
left Pending, with the scheduler's reason, when none has."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from metalmend_lab.controlplane import ControlPlane
from tests.integration.test_controlplane import eventually


@pytest.fixture
def node(kube: Client) -> Iterator[str]:
    """A Node with capacity and Ready=True, as a kubelet registers it (no kubelet behind it:
    the node-lifecycle controller will mark it Unknown after the grace period)."""
    name = f"sched-{secrets.token_hex(3)}"
    now = dt.datetime.now(dt.UTC).isoformat()
    capacity = {"cpu": "2", "memory": "4Gi", "pods": "10"}
    kube.create(
        Node.from_dict({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
    )
    ready = {
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    }  # fmt: skip
    status = {"capacity": capacity, "allocatable": capacity, "conditions": [ready]}
    kube.patch(Node.Status, name, {"status": status})
    yield name
    kube.delete(Node, name)


def pod(name: str, node: str, cpu: str) -> Any:
    return Pod.from_dict(
        {
            "metadata": {"name": name},
            "spec": {
                # Only this test's Node (other tests leave kubelet-less Nodes behind), and
                # whatever taints node-lifecycle puts on it once it hears no kubelet.
                "nodeSelector": {"kubernetes.io/hostname": node},
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {
                        "name": "app",
                        "image": "registry.invalid/app:1",
                        "resources": {"requests": {"cpu": cpu}},
                    }
                ],
            },
        }
    )


def test_scheduler_binds_a_pod_to_a_node_with_room(
    control_plane: ControlPlane, kube: Client, namespace: str, node: str
) -> None:
    assert control_plane.components["kube-scheduler"].running()
    assert "kube-scheduler" in control_plane.ready_after
    kube.create(pod("fits", node, "500m"), namespace=namespace)
    kube.create(pod("too-big", node, "3"), namespace=namespace)
    try:
        eventually(
            lambda: kube.get(Pod, "fits", namespace=namespace).spec.nodeName == node, timeout=30
        )

        def unschedulable() -> bool:
            big = kube.get(Pod, "too-big", namespace=namespace)
            conditions = {c.type: c for c in (big.status.conditions or [])}
            scheduled = conditions.get("PodScheduled")
            return scheduled is not None and scheduled.reason == "Unschedulable"

        eventually(unschedulable, timeout=30)
        big = kube.get(Pod, "too-big", namespace=namespace)
        assert big.spec.nodeName is None
        message = next(c.message for c in big.status.conditions if c.type == "PodScheduled")
        assert "Insufficient cpu" in message
    finally:
        for name in ("fits", "too-big"):  # no kubelet will confirm a graceful deletion
            kube.delete(Pod, name, namespace=namespace, grace_period=0)
