"""The drain's rules: which pods go and which stay (as ``kubectl drain --force
--delete-emptydir-data --ignore-daemonsets``), when evictions are asked and retried, and
how a drain ends (drained, or failed naming each pod left and why)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from metalmend.teardown.policy.drain import (
    Cordon,
    Disposition,
    Drained,
    DrainFailed,
    DrainView,
    Evict,
    PodFacts,
    Refusal,
    decide,
    disposition,
    eviction_refusal,
)
from metalmend.teardown.policy.settings import TeardownSettings

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
LATER = NOW + dt.timedelta(seconds=60)
SETTINGS = TeardownSettings()

APP = PodFacts("ns", "app", "u-app", controller_kind="ReplicaSet", controller_name="rs")


def pod(**changes: object) -> PodFacts:
    return replace(APP, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("facts", "expected", "warning"),
    [
        pytest.param(pod(), Disposition.EVICT, None, id="a ReplicaSet's pod is evicted"),
        pytest.param(
            pod(controller_kind=None, controller_name=None),
            Disposition.EVICT,
            "deleting Pods that declare no controller",
            id="a pod without controller is evicted (--force)",
        ),
        pytest.param(
            pod(emptydir=True),
            Disposition.EVICT,
            "deleting Pods with local storage",
            id="a pod with an emptyDir is evicted (--delete-emptydir-data)",
        ),
        pytest.param(
            pod(controller_kind="DaemonSet"),
            Disposition.LEAVE_DAEMONSET,
            "ignoring DaemonSet-managed Pods",
            id="a DaemonSet's pod stays (--ignore-daemonsets)",
        ),
        pytest.param(
            pod(controller_kind="DaemonSet", emptydir=True),
            Disposition.LEAVE_DAEMONSET,
            "ignoring DaemonSet-managed Pods",
            id="a DaemonSet's pod stays even with local storage",
        ),
        pytest.param(
            pod(controller_kind="DaemonSet", daemonset_missing=True),
            Disposition.EVICT,
            "deleting a Pod whose DaemonSet is gone",
            id="a pod of a deleted DaemonSet is evicted (--force)",
        ),
        pytest.param(
            pod(mirror=True), Disposition.LEAVE_MIRROR, None, id="a mirror pod stays, always"
        ),
        pytest.param(
            pod(mirror=True, phase="Succeeded"),
            Disposition.LEAVE_MIRROR,
            None,
            id="a finished mirror pod stays",
        ),
        pytest.param(
            pod(controller_kind="DaemonSet", phase="Failed"),
            Disposition.EVICT,
            None,
            id="a finished DaemonSet pod is evicted",
        ),
        pytest.param(
            pod(controller_kind=None, phase="Succeeded"),
            Disposition.EVICT,
            None,
            id="a finished pod is evicted without warning",
        ),
    ],
)
def test_which_pods_a_drain_evicts(
    facts: PodFacts, expected: Disposition, warning: str | None
) -> None:
    assert disposition(facts) == (expected, warning)


def test_a_pod_is_read_from_its_wire_form() -> None:
    wire = {
        "metadata": {
            "namespace": "ns", "name": "p", "uid": "u1", "deletionTimestamp": "2026-11-23T12:00:00Z",
            "annotations": {"kubernetes.io/config.mirror": "abc"},
            "ownerReferences": [
                {"kind": "ReplicaSet", "name": "other", "controller": False},
                {"kind": "DaemonSet", "name": "ds", "controller": True},
            ],
        },
        "spec": {"volumes": [{"name": "a", "configMap": {}}, {"name": "b", "emptyDir": {}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    assert PodFacts.from_wire(wire) == PodFacts(
        "ns", "p", "u1", phase="Running", deleting=True, mirror=True,
        controller_kind="DaemonSet", controller_name="ds", emptydir=True,
    )  # fmt: skip


@pytest.mark.parametrize(
    "wire",
    [
        {},
        {"metadata": "x"},
        {"metadata": {"ownerReferences": "x", "annotations": []}, "spec": {"volumes": [1]}},
    ],
    ids=["empty", "metadata not a mapping", "fields of the wrong types"],
)
def test_a_malformed_pod_reads_as_absent_fields(wire: dict[str, object]) -> None:
    facts = PodFacts.from_wire(wire)
    assert (facts.controller_kind, facts.mirror, facts.emptydir) == (None, False, False)


def view(*pods: PodFacts, **changes: object) -> DrainView:
    base = DrainView(node="n1", cordoned=True, pods=pods, deadline=LATER, grace_period=30)
    return replace(base, **changes)  # type: ignore[arg-type]


def evict(facts: PodFacts, warning: str | None = None, grace: int | None = 30) -> Evict:
    return Evict(facts.namespace, facts.name, facts.uid, grace, warning)


BUDGET = Refusal(
    "Cannot evict pod as it would violate the pod's disruption budget.; The disruption budget pdb needs 1 healthy pods and has 1 currently",
    NOW + dt.timedelta(seconds=2),
)
FOR_GOOD = Refusal("This pod has more than one PodDisruptionBudget", None)
OTHER = pod(name="other", uid="u-other")


@pytest.mark.parametrize(
    ("the_view", "now", "actions", "requeue_at"),
    [
        pytest.param(
            view(cordoned=False),
            NOW,
            [Cordon("n1"), Drained(())],
            None,
            id="an empty uncordoned Node is cordoned, then drained",
        ),
        pytest.param(
            view(APP, cordoned=False),
            NOW,
            [Cordon("n1"), evict(APP)],
            LATER,
            id="cordon comes before the first eviction",
        ),
        pytest.param(
            view(APP, OTHER),
            NOW,
            [evict(APP), evict(OTHER)],
            LATER,
            id="every pod is evicted at once",
        ),
        pytest.param(
            view(APP, grace_period=None),
            NOW,
            [evict(APP, grace=None)],
            LATER,
            id="no grace period: the pod's own applies",
        ),
        pytest.param(
            view(pod(deleting=True)),
            NOW,
            [],
            LATER,
            id="a terminating pod is waited for, not evicted again",
        ),
        pytest.param(
            view(APP, evicted=frozenset({"u-app"})),
            NOW,
            [],
            LATER,
            id="an evicted pod is waited for by uid",
        ),
        pytest.param(
            view(pod(uid="u-new"), evicted=frozenset({"u-app"})),
            NOW,
            [evict(pod(uid="u-new"))],
            LATER,
            id="a new pod of the same name is another pod",
        ),
        pytest.param(
            view(APP, refusals={"u-app": BUDGET}),
            NOW,
            [],
            BUDGET.retry_at,
            id="a budget's refusal is retried when due, not before",
        ),
        pytest.param(
            view(APP, refusals={"u-app": BUDGET}),
            BUDGET.retry_at,
            [evict(APP)],
            LATER,
            id="a budget's refusal is retried once due",
        ),
        pytest.param(
            view(pod(mirror=True), pod(name="ds", uid="u-ds", controller_kind="DaemonSet")),
            NOW,
            [
                Drained(
                    (("ns/app", Disposition.LEAVE_MIRROR), ("ns/ds", Disposition.LEAVE_DAEMONSET))
                )
            ],
            None,
            id="only pods left by rule: drained, and they are named",
        ),
        pytest.param(
            view(APP, refusals={"u-app": FOR_GOOD}),
            NOW,
            [
                DrainFailed(
                    (
                        "pod ns/app: eviction refused: This pod has more than one PodDisruptionBudget",
                    )
                )
            ],
            None,
            id="a refusal for good fails the drain at once",
        ),
        pytest.param(
            view(APP, OTHER, refusals={"u-app": FOR_GOOD}),
            NOW,
            [evict(OTHER)],
            LATER,
            id="a refusal for good waits for the other pods",
        ),
        pytest.param(
            view(APP, pods_unknown="403 forbidden"),
            NOW,
            [],
            LATER,
            id="pods not listed yet: wait, do not call it drained",
        ),
        pytest.param(
            view(APP, pods_unknown="403 forbidden"),
            LATER,
            [DrainFailed(("cannot list the pods: 403 forbidden",))],
            None,
            id="pods never listed: failed at the deadline",
        ),
    ],
)
def test_what_a_drain_does_next(
    the_view: DrainView, now: dt.datetime, actions: list[object], requeue_at: dt.datetime | None
) -> None:
    decision = decide(the_view, now, SETTINGS)
    assert decision.actions == actions
    assert decision.requeue_at == requeue_at


def test_at_the_deadline_the_failure_names_every_pod_and_why() -> None:
    the_view = view(
        APP, OTHER, pod(name="slow", uid="u-slow", deleting=True), pod(name="new", uid="u-new"),
        refusals={"u-app": BUDGET, "u-other": BUDGET},
    )  # fmt: skip
    decision = decide(the_view, LATER, SETTINGS)
    assert decision.actions == [
        DrainFailed((
            f"pod ns/app: eviction refused: {BUDGET.message}",
            f"pod ns/other: eviction refused: {BUDGET.message}",
            "pod ns/slow: evicted, still terminating (its grace period has not run out)",
            "pod ns/new: not evicted yet",
        ))
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("code", "message", "causes", "expected"),
    [
        pytest.param(404, "not found", (), None, id="404: the pod is gone already, success"),
        pytest.param(
            429,
            "Cannot evict pod as it would violate the pod's disruption budget.",
            (
                (
                    "DisruptionBudget",
                    "The disruption budget web needs 2 healthy pods and has 2 currently",
                ),
            ),
            Refusal(
                "Cannot evict pod as it would violate the pod's disruption budget.; The disruption budget web needs 2 healthy pods and has 2 currently",
                NOW + dt.timedelta(seconds=2),
            ),
            id="429: a budget, named, retried",
        ),
        pytest.param(
            403,
            "namespace is terminating",
            (("NamespaceTerminating", "ns is terminating"),),
            Refusal("namespace is terminating; ns is terminating", NOW + dt.timedelta(seconds=2)),
            id="403 of a terminating namespace: retried",
        ),
        pytest.param(
            403,
            "forbidden: cannot create pods/eviction",
            (),
            Refusal("forbidden: cannot create pods/eviction", None),
            id="403 of RBAC: for good",
        ),
        pytest.param(
            500,
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            (),
            Refusal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                None,
            ),
            id="500 of two budgets: for good",
        ),
        pytest.param(
            503,
            "etcd timeout",
            (),
            Refusal("etcd timeout", NOW + dt.timedelta(seconds=2)),
            id="503: passing, retried",
        ),
    ],
)
def test_what_an_eviction_refusal_means(
    code: int, message: str, causes: tuple[tuple[str, str], ...], expected: Refusal | None
) -> None:
    assert eviction_refusal(code, message, causes, NOW, SETTINGS) == expected
