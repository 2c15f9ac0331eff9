"""When a Node may be removed from the cluster (Airship's remove-from-cluster: cordoned,
drained, no label but promenade-decomission) and which labels clear-labels removes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from metalmend.teardown.policy.drain import PodFacts, Requirement
from metalmend.teardown.policy.removal import (
    NodeFacts,
    fits,
    labels_to_clear,
    removal_conflicts,
    stranded,
    unsettled,
)

READY = NodeFacts("n1", "u1", cordoned=True, labels={"promenade-decomission": "enabled"})
DAEMON = PodFacts(
    "kube-system", "proxy", "u-p", controller_kind="DaemonSet", controller_name="proxy"
)
MIRROR = PodFacts("kube-system", "etcd-n1", "u-e", mirror=True)
APP = PodFacts("ns", "web", "u-w", controller_kind="ReplicaSet", controller_name="web")


@pytest.mark.parametrize(
    ("node", "pods", "problems"),
    [
        pytest.param(READY, [], [], id="cordoned, drained, only the decommission label: may go"),
        pytest.param(NodeFacts("n1", "u1", True, {}), [], [], id="no label at all: may go"),
        pytest.param(READY, [DAEMON, MIRROR], [], id="DaemonSet and mirror pods do not hold it"),
        pytest.param(
            NodeFacts("n1", "u1", False, {}),
            [],
            ["Node n1 is not cordoned: drain it first"],
            id="not cordoned",
        ),
        pytest.param(
            READY,
            [APP],
            ["Node n1 is not drained: pod ns/web is still on it"],
            id="a pod a drain would evict",
        ),
        pytest.param(
            NodeFacts("n1", "u1", True, {"kubernetes.io/hostname": "n1", "role": "x"}),
            [],
            [
                "Node n1 still has the label kubernetes.io/hostname: clear its labels first",
                "Node n1 still has the label role: clear its labels first",
            ],
            id="any other label, the kubelet's too",
        ),
    ],
)
def test_when_a_node_may_be_removed(
    node: NodeFacts, pods: list[PodFacts], problems: list[str]
) -> None:
    assert removal_conflicts(node, pods) == problems


def test_clear_labels_keeps_only_the_decommission_label() -> None:
    labels = {"promenade-decomission": "enabled", "b": "1", "a": "2"}
    assert labels_to_clear(labels) == ["a", "b"]


def placed(**changes: object) -> PodFacts:
    return replace(DAEMON, **changes)  # type: ignore[arg-type]


def term(*requirements: Requirement) -> tuple[Requirement, ...]:
    return requirements


LABELS = {"role": "storage", "size": "10"}


@pytest.mark.parametrize(
    ("pod", "fit"),
    [
        pytest.param(placed(), True, id="no selector, no affinity: fits any Node"),
        pytest.param(placed(node_selector=(("role", "storage"),)), True, id="nodeSelector matched"),
        pytest.param(
            placed(node_selector=(("role", "compute"),)), False, id="nodeSelector of another value"
        ),
        pytest.param(
            placed(node_selector=(("zone", "a"),)), False, id="nodeSelector on a removed label"
        ),
        pytest.param(
            placed(node_affinity=(term(Requirement("role", "In", ("storage", "x"))),)),
            True,
            id="In",
        ),
        pytest.param(
            placed(node_affinity=(term(Requirement("role", "NotIn", ("storage",))),)),
            False,
            id="NotIn",
        ),
        pytest.param(
            placed(node_affinity=(term(Requirement("zone", "NotIn", ("a",))),)),
            True,
            id="NotIn of an absent label",
        ),
        pytest.param(
            placed(node_affinity=(term(Requirement("zone", "Exists")),)),
            False,
            id="Exists of a removed label",
        ),
        pytest.param(
            placed(node_affinity=(term(Requirement("zone", "DoesNotExist")),)),
            True,
            id="DoesNotExist",
        ),
        pytest.param(
            placed(node_affinity=(term(Requirement("size", "Gt", ("9",))),)), True, id="Gt"
        ),
        pytest.param(
            placed(node_affinity=(term(Requirement("size", "Lt", ("9",))),)), False, id="Lt"
        ),
        pytest.param(
            placed(node_affinity=(term(Requirement("role", "Gt", ("9",))),)),
            False,
            id="Gt of a non-number",
        ),
        pytest.param(
            placed(node_affinity=(term(Requirement("metadata.name", "In", ("n1",), field=True)),)),
            True,
            id="a DaemonSet's matchFields on the Node's name",
        ),
        pytest.param(
            placed(node_affinity=(term(Requirement("metadata.name", "In", ("n2",), field=True)),)),
            False,
            id="matchFields on another name",
        ),
        pytest.param(
            placed(
                node_affinity=(
                    term(Requirement("zone", "Exists")),
                    term(Requirement("role", "Exists")),
                )
            ),
            True,
            id="terms are alternatives",
        ),
        pytest.param(
            placed(
                node_affinity=(term(Requirement("zone", "Exists"), Requirement("role", "Exists")),)
            ),
            False,
            id="requirements of a term all apply",
        ),
        pytest.param(placed(node_affinity=((),)), False, id="an empty term matches no Node"),
        pytest.param(
            placed(node_affinity=()), False, id="required affinity without terms matches no Node"
        ),
    ],
)
def test_whether_a_pod_still_fits_the_node(pod: PodFacts, fit: bool) -> None:
    assert fits(pod, "n1", LABELS) is fit


def test_clear_labels_waits_only_for_daemonset_pods_that_no_longer_fit() -> None:
    gone_label = (("zone", "a"),)
    pods = [
        placed(node_selector=gone_label),
        placed(name="proxy-2", node_selector=gone_label, deleting=True),
        placed(name="fine"),
        PodFacts("kube-system", "etcd-n1", "u-e", mirror=True, node_selector=gone_label),
        placed(name="done", node_selector=gone_label, phase="Succeeded"),
        PodFacts(
            "ns",
            "web",
            "u-w",
            controller_kind="ReplicaSet",
            controller_name="web",
            node_selector=gone_label,
        ),
    ]
    assert unsettled("n1", LABELS, pods) == [
        "pod kube-system/proxy (DaemonSet proxy) no longer fits the Node's labels and is still there",
        "pod kube-system/proxy-2 (DaemonSet proxy) no longer fits the Node's labels and is being removed",
    ]
    assert stranded("n1", LABELS, pods) == [
        "pod ns/web no longer fits the Node's labels but keeps running: drain the Node to move it"
    ]


def test_affinity_is_read_from_the_wire_form() -> None:
    wire = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeSelector": {"b": "2", "a": "1"}, "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "role", "operator": "In", "values": ["x"]}],
             "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}}  # fmt: skip
    facts = PodFacts.from_wire(wire)
    assert facts.node_selector == (("a", "1"), ("b", "2"))
    assert facts.node_affinity == (
        (
            Requirement("role", "In", ("x",)),
            Requirement("metadata.name", "In", ("n1",), field=True),
        ),
    )
