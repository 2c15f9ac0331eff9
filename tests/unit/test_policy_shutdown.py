"""shutdown-kubelet's rules: the Node is labelled first, and the kubelet is called stopped
only on its own heartbeat (the Lease) going quiet, timed by our clock, or on the node
lifecycle controller's word while the heartbeat stays still; otherwise the step waits
until the earlier of that moment and its deadline, then fails saying what it saw."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from metalmend.teardown.policy.settings import TeardownSettings
from metalmend.teardown.policy.shutdown import (
    KubeletStopped,
    LabelForShutdown,
    ShutdownFailed,
    ShutdownView,
    decide,
)

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
SETTINGS = TeardownSettings(kubelet_stopped_after=40, shutdown_kubelet_timeout=300)


def seconds(n: float) -> dt.timedelta:
    return dt.timedelta(seconds=n)


RUNNING = ShutdownView(
    node="n1",
    labelled=True,
    heartbeat="2026-11-23T11:59:59Z",
    heartbeat_seen_since=NOW - seconds(1),
    heartbeat_moved=False,
    ready_unknown=False,
    deadline=NOW + seconds(200),
)


def view(**changes: object) -> ShutdownView:
    return replace(RUNNING, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        pytest.param(
            view(labelled=False),
            LabelForShutdown,
            id="an unlabelled Node is labelled promenade-decomission=enabled first",
        ),
        pytest.param(
            view(labelled=False, heartbeat=None),
            LabelForShutdown,
            id="even a Node without kubelet is labelled (a returning host stops for good)",
        ),
        pytest.param(
            view(heartbeat=None, heartbeat_seen_since=None),
            KubeletStopped,
            id="a Node that never had a heartbeat has no kubelet running",
        ),
        pytest.param(
            view(heartbeat_seen_since=NOW - seconds(40)),
            KubeletStopped,
            id="a Lease unchanged for kubelet_stopped_after seconds means stopped",
        ),
        pytest.param(
            view(ready_unknown=True),
            KubeletStopped,
            id="Ready Unknown with a still heartbeat: the node lifecycle controller's word",
        ),
        pytest.param(
            view(heartbeat_seen_since=NOW - seconds(39), deadline=NOW),
            ShutdownFailed,
            id="at the deadline a kubelet still renewing fails the step",
        ),
    ],
)
def test_what_shutdown_kubelet_does_next(observed: ShutdownView, expected: type) -> None:
    decision = decide(observed, NOW, SETTINGS)
    assert [type(a) for a in decision.actions] == [expected]


def test_the_label_is_exactly_the_one_the_spec_spells() -> None:
    (action,) = decide(view(labelled=False), NOW, SETTINGS).actions
    assert action == LabelForShutdown("n1", (("promenade-decomission", "enabled"),))


def test_a_heartbeat_that_moved_is_not_taken_for_stopped_on_ready_unknown() -> None:
    """The kubelet came back while we watched: Ready Unknown is stale news."""
    decision = decide(view(ready_unknown=True, heartbeat_moved=True), NOW, SETTINGS)
    assert decision.actions == []
    assert decision.requeue_at == NOW - seconds(1) + seconds(40)


def test_while_the_kubelet_runs_it_looks_again_when_the_heartbeat_would_be_stale() -> None:
    decision = decide(RUNNING, NOW, SETTINGS)
    assert decision.actions == []
    assert decision.requeue_at == NOW + seconds(39)


def test_it_looks_again_at_the_deadline_when_that_comes_first() -> None:
    decision = decide(view(deadline=NOW + seconds(5)), NOW, SETTINGS)
    assert decision.requeue_at == NOW + seconds(5)


def test_the_failure_says_no_shutdown_pod_reached_the_node() -> None:
    (action,) = decide(view(deadline=NOW), NOW, SETTINGS).actions
    assert isinstance(action, ShutdownFailed)
    assert action.problems[0] == (
        "the kubelet of Node n1 still renews its Lease (last renewal 2026-11-23T11:59:59Z, 1 s ago)"
    )
    assert "no pod of the shutdown-kubelet DaemonSet is on Node n1" in action.problems[1]


def test_the_failure_describes_the_shutdown_pods_it_found() -> None:
    pending = "shutdown-kubelet pod metalmend-system/x is Pending: ErrImagePull"
    (action,) = decide(view(deadline=NOW, shutdown_pods=(pending,)), NOW, SETTINGS).actions
    assert isinstance(action, ShutdownFailed)
    assert action.problems[1:] == (pending,)
