"""Metal3Remediation and a refused link (api/links.py): nothing is done but releasing what
is held, whatever phase the (tenant-writable) status claims."""

from __future__ import annotations

import pytest

from metalmend.policy import remediation as r
from tests.unit.test_policy_remediation import OFF_FOR_US, T0, host, kinds, observed

REFUSAL = "Node victim (providerID metal3://lab/worker-2) is not a Node of host ns/h1"


@pytest.mark.parametrize("phase", [None, *r.PHASES])
def test_a_refused_link_does_nothing_but_release(phase: r.Phase | None) -> None:
    decision = r.decide(observed(phase, node=None, link_problem=REFUSAL), T0)
    assert kinds(decision) == ["SetProgress"] or kinds(decision) == []
    progress = [a.progress for a in decision.actions if isinstance(a, r.SetProgress)]
    if progress:
        assert progress[0].phase == r.FAILED
        assert progress[0].message == REFUSAL
        warnings = [a for a in decision.actions if isinstance(a, r.Event)]
        assert [w.type for w in warnings] == ["Warning"]


def test_a_refused_link_releases_a_held_host_first() -> None:
    decision = r.decide(observed(r.POWER_OFF, host=host(OFF_FOR_US), link_problem=REFUSAL), T0)
    assert kinds(decision) == ["ReleasePower", "SetProgress"]


def test_reported_once() -> None:
    failed = r.Progress(phase=r.FAILED, message=REFUSAL)
    decision = r.decide(observed(progress=failed, link_problem=REFUSAL), T0)
    assert decision.actions == []
