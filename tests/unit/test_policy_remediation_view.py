"""How the remediation policy reads one reconcile's snapshot (``policy.remediation.view``
and ``policy.fenceremediation.decide_seen``): the object's spec, status and backup as
written, read without an exception whatever they hold, and the link problems that depend
on them. No I/O. Each id reads as the rule it proves."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from metalmend.api import names
from metalmend.policy import fenceremediation as fence
from metalmend.policy import remediation as policy

NOW = dt.datetime(2026, 11, 20, 12, 0, 0, tzinfo=dt.UTC)
KEY = "reboot.metal3.io/metal3-remediation-uid-0"
HOST = policy.HostWire("ns/worker-0", {"online": True}, {"poweredOn": True}, {})
GONE = "Node worker-0 is gone, and host ns/worker-0 does not name it: stopping"
ESCALATE = "strategy escalate deletes the Machine"


def seen(**changes: Any) -> policy.Seen:
    base = policy.Seen(
        spec={},
        status={},
        annotations={},
        has_finalizer=True,
        deleting_since=None,
        machine_found=True,
        machine_node="worker-0",
        host=HOST,
        reboot_key=KEY,
        host_problem="",
        node=None,
    )
    return dataclasses.replace(base, **changes)


CASES = [
    # id, snapshot, (host_problem starts with, link_problem starts with)
    ("a Machine's remediation with its host: no problem", seen(), ("", "")),
    ("a Node target gone that its host does not name is a link problem",
     seen(node_target=True, node_gone_unnamed=GONE), ("", GONE)),
    ("... unless this remediation fenced (deleted) that Node itself",
     seen(node_target=True, node_gone_unnamed=GONE, status={"fencedNodeUID": "n-1"}), ("", "")),
    ("a Node target with strategy escalate is refused (no Machine to delete)",
     seen(node_target=True, spec={"strategy": "escalate"}), (ESCALATE, ESCALATE)),
    ("... and a Node not the host's says so first",
     seen(node_target=True, spec={"strategy": "escalate"}, link_problem="Node x is not"),
     (ESCALATE, "Node x is not")),
    ("strategy escalate is a Machine's remediation's right",
     seen(spec={"strategy": "escalate"}), ("", "")),
    ("a link problem without a host to release is none",
     seen(host=None, host_problem="host ns/w not found", link_problem="refused"),
     ("host ns/w not found", "")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("snapshot", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_snapshot_as_the_rules_read_it(
    snapshot: policy.Seen, expected: tuple[str, str]
) -> None:
    observed = policy.view(snapshot)
    problem, link = expected
    assert observed.host_problem.startswith(problem)
    assert bool(observed.host_problem) == bool(problem)
    assert observed.link_problem.startswith(link)
    assert bool(observed.link_problem) == bool(link)


HOSTILE: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, str]]] = [
    ("numbers of the wrong type read as metal3's defaults",
     {"deleteAfterRetries": "many", "powerOffTimeoutSeconds": True}, {}, {}),
    ("numbers that are not finite read as metal3's defaults",
     {"deleteAfterRetries": float("inf"), "powerOnTimeoutSeconds": float("nan")}, {}, {}),
    ("a status written around us reads as no attempt begun",
     {}, {"phase": 7, "retryCount": "x", "node": ["a"], "lastRemediated": "yesterday"}, {}),
    ("a backup that is not JSON reads as none",
     {}, {}, {names.NODE_LABELS_BACKUP: "{not json"}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "status", "annotations"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE]
)
def test_a_hostile_object_is_read_never_raised(
    spec: dict[str, Any], status: dict[str, Any], annotations: dict[str, str]
) -> None:
    snapshot = seen(spec=spec, status=status, annotations=annotations)
    observed = policy.view(snapshot)
    assert observed.spec.delete_after_retries == 3
    assert observed.progress.phase is None
    assert observed.backup is None
    fence.decide_seen(snapshot, NOW, policy.Settings())  # a decision, not an exception


def test_the_host_is_read_for_this_remediation_s_key() -> None:
    host = dataclasses.replace(HOST, annotations={KEY: '{"mode":"hard"}', names.ESCALATING: KEY})
    view = policy.view(seen(host=host)).host
    assert view is not None
    assert view.power.holds_key
    assert view.escalation_marked
    assert view.other_remediation is None


def test_a_timed_out_remediation_is_stopped_and_releases_its_host() -> None:
    held = dataclasses.replace(HOST, annotations={KEY: '{"mode":"hard"}'})
    timed_out = seen(host=held, annotations={names.NHC_TIMED_OUT: "now"}, created=NOW)
    ordinary = policy.decide(policy.view(timed_out), NOW, policy.Settings())
    stopped = fence.decide_seen(timed_out, NOW, policy.Settings())
    assert any(isinstance(a, policy.ReleasePower) for a in stopped.actions)
    assert not any(isinstance(a, policy.ReleasePower) for a in ordinary.actions)
