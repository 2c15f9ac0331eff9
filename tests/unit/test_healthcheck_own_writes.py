"""Which Machine and check events wake the health checks (controllers.healthcheck
``machine_changed``, ``check_changed``): whatever a check reads, never the check's own
writes coming back (each woke the check for a full evaluation of every Machine it
selects, deciding nothing: docs/scale.md)."""

from __future__ import annotations

from typing import Any

import pytest

from metalmend.api.resources import Machine, MachineHealthCheck, Metal3Remediation
from metalmend.controllers.healthcheck import (
    PAUSE_FACTOR,
    check_changed,
    machine_changed,
    pause,
    remediation_changed,
)
from metalmend.controllers.healthcheck import generic as generic_kind

T0 = "2026-11-26T12:00:00Z"
T1 = "2026-11-26T12:05:00Z"


def machine(
    *conditions: dict[str, Any],
    version: str = "1",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    node: str = "worker-1",
    **status: Any,
) -> Any:
    metadata: dict[str, Any] = {
        "name": "worker-1", "namespace": "lab", "uid": "u1", "resourceVersion": version,
        "labels": labels or {"role": "worker"}, "annotations": annotations or {},
    }  # fmt: skip
    body = {
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "metadata": metadata,
        "spec": {"clusterName": "lab"},
        "status": {"nodeRef": {"kind": "Node", "name": node}, "conditions": list(conditions),
                   **status},
    }  # fmt: skip
    return Machine.from_dict(body)


def condition(kind: str, status: str = "True", since: str = T0, **more: str) -> dict[str, Any]:
    return {"type": kind, "status": status, "lastTransitionTime": since, **more}


CHECKED = condition("HealthCheckSucceeded")
FAILED = condition("HealthCheckSucceeded", "False", T1, reason="UnhealthyNode")
HELD = condition("HostAvailableForRemediation", "False", T1, reason="HostBeingTornDown")
INFRA = condition("InfrastructureReady")


@pytest.mark.parametrize(
    ("old", "new", "wakes"),
    [
        pytest.param(machine(), machine(CHECKED, version="2"), False,
                     id="its own HealthCheckSucceeded written: nothing to evaluate"),
        pytest.param(machine(CHECKED), machine(FAILED, version="2"), False,
                     id="its own HealthCheckSucceeded changed"),
        pytest.param(machine(CHECKED), machine(CHECKED, HELD, version="2"), False,
                     id="its own HostAvailableForRemediation written"),
        pytest.param(machine(CHECKED), machine(CHECKED, version="2"), False,
                     id="a write that changed nothing but the version"),
        pytest.param(machine(CHECKED), machine(CHECKED, INFRA, version="2"), True,
                     id="another condition (InfrastructureReady: the startup timeout)"),
        pytest.param(
            machine(CHECKED),
            machine(CHECKED, condition("OwnerRemediated", "False"), version="2"), True,
            id="OwnerRemediated: the owner ends a remediation through it",
        ),
        pytest.param(machine(), machine(node="worker-2", version="2"), True, id="nodeRef"),
        pytest.param(machine(), machine(failureReason="CreateError", version="2"), True,
                     id="failureReason"),
        pytest.param(
            machine(),
            machine(annotations={"cluster.x-k8s.io/remediate-machine": ""}, version="2"),
            True, id="an annotation (a manual remediation request)",
        ),
        pytest.param(machine(), machine(labels={"role": "other"}, version="2"), True,
                     id="a label (the selector)"),
        pytest.param(None, machine(), True, id="created"),
        pytest.param(machine(), None, True, id="deleted"),
    ],
)  # fmt: skip
def test_a_machine_event_wakes_the_check_only_when_what_it_reads_changed(
    old: Any, new: Any, wakes: bool
) -> None:
    assert machine_changed(old, new) is wakes


def check(version: str = "1", status: dict[str, Any] | None = None, **more: Any) -> Any:
    metadata = {"name": "workers", "namespace": "lab", "uid": "c1", "resourceVersion": version,
                "generation": 1, **more}  # fmt: skip
    spec = {"clusterName": "lab", "selector": {"matchLabels": {"role": "worker"}}}
    return MachineHealthCheck.from_dict(
        {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineHealthCheck",
         "metadata": metadata, "spec": spec, "status": status or {}}
    )  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "wakes"),
    [
        pytest.param(check(), check("2", {"expectedMachines": 3, "currentHealthy": 3}), False,
                     id="its own status written: nothing to evaluate"),
        pytest.param(check(), check("2", generation=2), True, id="its spec changed"),
        pytest.param(
            check(), check("2", annotations={"metalmend.dev/request-remediation-by": "annotation"}),
            True, id="an annotation (how it asks for remediation)",
        ),
        pytest.param(None, check(), True, id="created"),
        pytest.param(check(), None, True, id="deleted"),
    ],
)  # fmt: skip
def test_a_check_event_wakes_the_check_unless_only_its_status_changed(
    old: Any, new: Any, wakes: bool
) -> None:
    assert check_changed(old, new) is wakes


@pytest.mark.parametrize(
    ("ended", "took", "now", "wait"),
    [
        pytest.param(100.0, 0.8, 100.0, PAUSE_FACTOR * 0.8,
                     id="right after a long evaluation: PAUSE_FACTOR times its length"),
        pytest.param(100.0, 0.8, 101.0, PAUSE_FACTOR * 0.8 - 1.0, id="part of it passed"),
        pytest.param(100.0, 0.8, 110.0, 0.0, id="long after: at once"),
        pytest.param(0.0, 0.0, 5.0, 0.0, id="never evaluated: at once"),
        pytest.param(100.0, 0.001, 100.0, PAUSE_FACTOR * 0.001,
                     id="a small check: a few milliseconds"),
    ],
)  # fmt: skip
def test_a_machine_change_waits_a_multiple_of_the_last_evaluation(
    ended: float, took: float, now: float, wait: float
) -> None:
    assert pause(ended, took, now) == pytest.approx(wait)


def remediation(
    uid: str = "r1",
    version: str = "1",
    deleting: bool = False,
    status: dict[str, Any] | None = None,
) -> Any:
    metadata: dict[str, Any] = {
        "name": "worker-1",
        "namespace": "lab",
        "uid": uid,
        "resourceVersion": version,
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-29T00:00:00Z"
    return Metal3Remediation.from_dict(
        {"apiVersion": "remediation.metal3.io/v1alpha1", "kind": "Metal3Remediation",
         "metadata": metadata, "spec": {"strategy": {"type": "Reboot"}}, "status": status or {}}
    )  # fmt: skip


def template(version: str, timeout: str) -> Any:
    kind = generic_kind("remediation.metalmend.dev/v1alpha1", "FenceRemediationTemplate")
    return kind.from_dict(
        {"apiVersion": "remediation.metalmend.dev/v1alpha1", "kind": "FenceRemediationTemplate",
         "metadata": {"name": "fence", "namespace": "lab", "uid": "t1", "resourceVersion": version},
         "spec": {"template": {"spec": {"timeout": timeout}}}}
    )  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "wakes"),
    [
        pytest.param(remediation(), remediation("r1", "2", status={"phase": "running"}), False,
                     id="its progress written: nothing a check reads"),
        pytest.param(remediation(), remediation("r1", "2", deleting=True), True,
                     id="began deleting: counted, not deleted again"),
        pytest.param(remediation(), remediation("r2", "2"), True, id="replaced (another uid)"),
        pytest.param(None, remediation(), True, id="created"),
        pytest.param(remediation(), None, True, id="deleted"),
        pytest.param(template("1", "5m"), template("2", "10m"), True,
                     id="a template's change: what the next remediation is made from"),
    ],
)  # fmt: skip
def test_a_remediation_event_wakes_the_checks_only_when_it_came_went_or_began_deleting(
    old: Any, new: Any, wakes: bool
) -> None:
    """A remediation writes its progress to its status at each step, and each write woke
    every check of its namespace for a full evaluation (docs/scale.md, fix 18)."""
    assert remediation_changed(old, new) is wakes
