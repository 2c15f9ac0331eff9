"""FenceRemediation: its target, NodeHealthCheck's timed-out annotation, its conditions
(pure: no I/O). The fencing itself is policy.remediation's, tested beside it."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest

from metalmend.api import names
from metalmend.policy import fenceremediation as f
from metalmend.policy import remediation as r
from metalmend.policy.fencing import HostPower
from tests.unit.test_policy_remediation import OFF_FOR_US, T0, kinds, node, observed

MACHINE = f.Owner("Machine", "cluster.x-k8s.io/v1beta1", "m-1")
NHC = f.Owner("NodeHealthCheck", "remediation.medik8s.io/v1alpha1", "nhc")
OPENSHIFT_MACHINE = f.Owner("Machine", "machine.openshift.io/v1beta1", "m-1")
OTHER_MACHINE = f.Owner("Machine", "example.com/v1", "m-1")


@pytest.mark.parametrize(
    ("name", "annotations", "owners", "expected"),
    [
        # Cluster API's MachineHealthCheck: named after the Machine, owned by it
        ("m-1", {}, [MACHINE], f.Target("Machine", "m-1", MACHINE.api_version)),
        # the owner reference wins over the name
        ("other", {}, [MACHINE], f.Target("Machine", "m-1", MACHINE.api_version)),
        # NodeHealthCheck, named after the Node
        ("node-1", {}, [NHC], f.Target("Node", "node-1")),
        # NodeHealthCheck, generateName + the node-name annotation
        ("fence-x7k2p", {names.NHC_NODE_NAME: "node-1"}, [NHC], f.Target("Node", "node-1")),
        # an empty annotation is no name
        ("node-2", {names.NHC_NODE_NAME: ""}, [NHC], f.Target("Node", "node-2")),
        # OpenShift's MachineHealthCheck: the same contract, a machine.openshift.io owner
        ("m-1", {}, [OPENSHIFT_MACHINE], f.Target("Machine", "m-1", OPENSHIFT_MACHINE.api_version)),
        # a Machine of any other group is no Machine we read: the name is the Node's
        ("node-3", {}, [OTHER_MACHINE], f.Target("Node", "node-3")),
        # created by hand, no owner
        ("node-4", {}, [], f.Target("Node", "node-4")),
    ],
)
def test_target(
    name: str, annotations: dict[str, str], owners: list[f.Owner], expected: f.Target
) -> None:
    assert f.target(name, annotations, owners) == expected


def test_timed_out_is_the_annotation_whatever_its_value() -> None:
    assert f.timed_out({names.NHC_TIMED_OUT: ""})
    assert f.timed_out({names.NHC_TIMED_OUT: "2026-03-01T12:00:00Z"})
    assert not f.timed_out({names.NHC_NODE_NAME: "node-1"})


def test_not_timed_out_is_the_remediation_unchanged() -> None:
    seen = observed(r.Phase.POWER_OFF, host=r.HostView("ns/h1", True, OFF_FOR_US, None, ""))
    assert f.decide(seen, T0) == r.decide(seen, T0)


def test_timed_out_releases_like_a_deletion_taint_first() -> None:
    seen = observed(
        r.Phase.EVACUATING,
        host=r.HostView("ns/h1", True, OFF_FOR_US, None, ""),
        node=node(out_of_service=True),
    )
    decision = f.decide(seen, T0, stopped=True, stopped_at=T0)
    assert kinds(decision) == ["UntaintNode", "ReleasePower", "RemoveFinalizer"]


def test_timed_out_and_released_does_nothing_more() -> None:
    seen = observed(r.Phase.POWER_OFF, has_finalizer=False)
    assert f.decide(seen, T0, stopped=True).actions == []


def test_timed_out_before_it_started_never_adds_the_finalizer() -> None:
    seen = observed("", has_finalizer=False, progress=r.Progress())
    assert f.decide(seen, T0, stopped=True).actions == []
    assert kinds(f.decide(seen, T0)) == ["AddFinalizer"]


def test_deleted_while_timed_out_is_the_deletion() -> None:
    on = HostPower(holds_key=False, powered_on=True, acknowledged=False, power_on_in_flight=False)
    seen = observed(
        r.Phase.POWER_OFF,
        deleting_since=T0,
        host=r.HostView("ns/h1", True, on, None, ""),
    )
    assert f.decide(seen, T0, stopped=True) == r.decide(seen, T0)


def status_of(conditions: list[dict[str, str]]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in conditions}


P, S, D = f.PROCESSING, f.SUCCEEDED, f.PERMANENT_NODE_DELETION


@pytest.mark.parametrize(
    ("phase", "strategy", "stopped", "deleting", "expected"),
    [
        ("", r.Strategy.REBOOT, False, False,
         {P: ("True", "Remediating"), S: ("Unknown", "Remediating"), D: ("False", "PowerCycleOnly")}),
        (r.Phase.POWER_OFF, r.Strategy.REBOOT, False, False,
         {P: ("True", "Remediating"), S: ("Unknown", "Remediating"), D: ("False", "PowerCycleOnly")}),
        (r.Phase.EVACUATING, r.Strategy.ESCALATE, False, False,
         {P: ("True", "Remediating"), S: ("Unknown", "Remediating"),
          D: ("False", "MayDeleteMachine")}),
        (r.Phase.BACKOFF, r.Strategy.REBOOT, False, False,
         {P: ("True", "Remediating"), S: ("Unknown", "Remediating"), D: ("False", "PowerCycleOnly")}),
        (r.Phase.WAITING, r.Strategy.REBOOT, False, False,
         {P: ("False", "Remediated"), S: ("True", "Remediated"), D: ("False", "PowerCycleOnly")}),
        (r.Phase.FAILED, r.Strategy.REBOOT, False, False,
         {P: ("False", "CannotRemediate"), S: ("False", "CannotRemediate"),
          D: ("False", "PowerCycleOnly")}),
        (r.Phase.DELETING_MACHINE, r.Strategy.ESCALATE, False, False,
         {P: ("False", "MachineDeleted"), S: ("True", "MachineDeleted"),
          D: ("True", "MachineDeleted")}),
        (r.Phase.POWER_ON, r.Strategy.REBOOT, False, True,
         {P: ("False", "Releasing"), S: ("Unknown", "Releasing"), D: ("False", "PowerCycleOnly")}),
        (r.Phase.FENCING, r.Strategy.REBOOT, True, False,
         {P: ("False", "TimedOut"), S: ("False", "TimedOut"), D: ("False", "TimedOut")}),
    ],
)  # fmt: skip
def test_conditions_by_phase(
    phase: str, strategy: r.Strategy, stopped: bool, deleting: bool, expected: dict[str, Any]
) -> None:
    wanted = f.wanted_conditions(phase, strategy, "", stopped, deleting)
    assert status_of(wanted) == expected
    assert [c["type"] for c in wanted] == [P, S, D]


def test_condition_message_is_the_remediations_own() -> None:
    wanted = f.wanted_conditions(
        r.Phase.FAILED, r.Strategy.REBOOT, "host ns/h1 not found", False, False
    )
    assert wanted[0]["message"] == "host ns/h1 not found"


LATER = T0 + dt.timedelta(minutes=5)


def test_conditions_keep_their_transition_time_while_the_status_holds() -> None:
    first = f.conditions(
        [], f.wanted_conditions(r.Phase.POWER_OFF, r.Strategy.REBOOT, "a", False, False), T0
    )
    assert {c["lastTransitionTime"] for c in first} == {"2026-03-01T12:00:00Z"}
    # same statuses, another message: the times stay
    second = f.conditions(
        first, f.wanted_conditions(r.Phase.FENCING, r.Strategy.REBOOT, "b", False, False), LATER
    )
    assert [c["lastTransitionTime"] for c in second] == [c["lastTransitionTime"] for c in first]
    # Processing and Succeeded change: their times move, PermanentNodeDeletionExpected's stays
    third = f.conditions(
        second, f.wanted_conditions(r.Phase.WAITING, r.Strategy.REBOOT, "", False, False), LATER
    )
    times = {c["type"]: c["lastTransitionTime"] for c in third}
    assert times == {
        P: "2026-03-01T12:05:00Z",
        S: "2026-03-01T12:05:00Z",
        D: "2026-03-01T12:00:00Z",
    }


def test_conditions_unchanged_compare_equal_so_nothing_is_written() -> None:
    wanted = f.wanted_conditions(r.Phase.POWER_OFF, r.Strategy.REBOOT, "a", False, False)
    first = f.conditions([], wanted, T0)
    assert f.conditions(first, wanted, LATER) == first


def test_conditions_of_other_types_are_kept() -> None:
    theirs = {
        "type": "Ready",
        "status": "True",
        "reason": "X",
        "message": "",
        "lastTransitionTime": "t",
    }
    merged = f.conditions(
        [theirs], f.wanted_conditions("", r.Strategy.REBOOT, "", False, False), T0
    )
    assert merged[-1] == theirs
    assert [c["type"] for c in merged] == [P, S, D, "Ready"]


def test_a_replaced_host_view_keeps_the_fencing_unchanged() -> None:
    seen = observed(r.Phase.FENCING, host=replace(r.HostView("ns/h1", True, OFF_FOR_US, None, "")))
    assert f.decide(seen, T0) == r.decide(seen, T0)
