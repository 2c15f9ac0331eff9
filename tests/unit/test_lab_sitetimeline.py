"""The redeploy timeline's rules (lab.sitetimeline): milestones counted only in order, and
who spent the time. No I/O."""

from __future__ import annotations

import datetime as dt

from metalmend_lab.sitetimeline import StepSpan, due, spans, split, svg


def test_a_milestone_counts_only_after_what_must_come_first() -> None:
    # an old "poweredOn: true" before the host was ever off is not the host coming back
    facts = {"host_on": True, "provisioned": True, "kubelet_stopped": True}
    assert due({}, facts, 1.0) == {"kubelet_stopped": 1.0}
    seen = {"kubelet_stopped": 1.0, "host_off": 2.0, "os_wiped": 3.0}
    assert due(seen, facts, 4.0) == {"provisioned": 4.0, "host_on": 4.0}
    assert due(seen | {"provisioned": 4.0, "host_on": 4.0}, facts, 5.0) == {}


def test_the_split_counts_gaps_and_metalmend_only_steps_as_ours() -> None:
    steps = [
        StepSpan("preflight", 0.1, 0.2), StepSpan("decommission", 0.3, 10.3),
        StepSpan("destroy", 10.5, 20.5), StepSpan("remove_from_cluster", 20.5, 20.6),
        StepSpan("deploy_server", 21.0, 25.0),
    ]  # fmt: skip
    parts = split(steps, {"decommission": 5.0, "deploy_server": 9.0})
    assert round(parts["metalmend"], 6) == round(0.1 + 0.1 + 0.1 + 0.2 + 0.1 + 0.4, 6)
    assert parts["configured"] == 5.0 + 4.0  # bounded by the step's own length
    assert round(parts["hardware and Kubernetes"], 6) == 15.0
    assert round(sum(parts.values()), 6) == 25.0


def test_spans_from_the_api_and_a_picture() -> None:
    created = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    found = spans(created, [
        {"task_id": "destroy", "start_date": "2026-01-01T00:00:02Z", "end_date": "2026-01-01T00:00:05Z"},
        {"task_id": "preflight", "start_date": "2026-01-01T00:00:00.5Z", "end_date": "2026-01-01T00:00:01Z"},
        {"task_id": "deploy_server", "start_date": None, "end_date": None},
    ])  # fmt: skip
    assert found == [StepSpan("preflight", 0.5, 1.0), StepSpan("destroy", 2.0, 5.0)]
    picture = svg(found, {"host_off": 3.0}, "redeploy <worker-1>")
    assert picture.startswith("<svg")
    assert "&lt;worker-1&gt;" in picture
