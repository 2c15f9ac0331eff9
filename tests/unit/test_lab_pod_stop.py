"""When the lab's kubelet stops a deleted pod: the slow-stop annotation read safely, the
stop counted from the deletion's start (never early, whatever the stamp's whole seconds
hide) and cut short by the grace period."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from metalmend_lab.kubeletsim import (
    SLOW_STOP_ANNOTATION,
    SLOW_STOP_LIMIT,
    Ending,
    Stop,
    plan_stop,
    slow_stop_seconds,
)

DELETED = dt.datetime(2026, 11, 23, 18, 0, 0, tzinfo=dt.UTC)  # when the deletion began
SECOND = dt.timedelta(seconds=1)


def deleting(grace: Any, slow_stop: str | None = None) -> dict[str, Any]:
    """A pod's metadata as the API server shows it once deleted with ``grace`` seconds."""
    meta: dict[str, Any] = {
        "deletionTimestamp": (DELETED + dt.timedelta(seconds=grace)).isoformat(),
        "deletionGracePeriodSeconds": grace,
    }
    if slow_stop is not None:
        meta["annotations"] = {SLOW_STOP_ANNOTATION: slow_stop}
    return meta


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, 0.0),
        ("5", 5.0),
        ("2.5", 2.5),
        (" 3 ", 3.0),
        ("0", 0.0),
        (str(SLOW_STOP_LIMIT), SLOW_STOP_LIMIT),
        ("", 0.0),
        ("five", 0.0),
        ("5s", 0.0),
        ("-1", 0.0),
        ("1e9", 0.0),
        (str(SLOW_STOP_LIMIT + 1), 0.0),
        ("nan", 0.0),
        ("inf", 0.0),
        ("-inf", 0.0),
        ("9" * 400, 0.0),
    ],
)
def test_slow_stop_annotation_reads_hostile_values_as_prompt_stop(
    value: str | None, seconds: float
) -> None:
    annotations = {} if value is None else {SLOW_STOP_ANNOTATION: value}
    assert slow_stop_seconds(annotations) == seconds


def test_no_annotations_at_all_means_a_prompt_stop() -> None:
    assert slow_stop_seconds(None) == 0.0
    assert slow_stop_seconds({"other": "7"}) == 0.0


def test_a_pod_without_the_annotation_stops_when_its_deletion_began() -> None:
    assert plan_stop(deleting(30), DELETED) == Stop(DELETED, Ending.EXITED)


def test_a_slow_pod_exits_that_long_after_its_deletion_began() -> None:
    stop = plan_stop(deleting(30, "5"), DELETED)
    assert stop == Stop(DELETED + dt.timedelta(seconds=5), Ending.EXITED)


def test_a_grace_period_shorter_than_the_annotation_wins_and_kills() -> None:
    stop = plan_stop(deleting(3, "60"), DELETED)
    assert stop == Stop(DELETED + dt.timedelta(seconds=3), Ending.KILLED)


def test_a_pod_that_exits_exactly_at_its_deadline_is_not_killed() -> None:
    assert plan_stop(deleting(4, "4"), DELETED).ending is Ending.EXITED


def test_seen_within_the_stamps_second_the_stop_counts_from_sight() -> None:
    """The stamp keeps whole seconds: the deletion began up to 1 s after it says, and a
    kubelet that sees it then sends SIGTERM then, as a real one does."""
    seen = DELETED + 0.6 * SECOND
    assert plan_stop(deleting(30, "5"), seen) == Stop(seen + 5 * SECOND, Ending.EXITED)


def test_a_restarted_kubelet_stops_the_pod_when_it_would_have_anyway() -> None:
    """Counted from the pod's deletionTimestamp (the end of its second: never early), not
    from when this kubelet saw it."""
    late = DELETED + 4 * SECOND
    assert plan_stop(deleting(30, "5"), late) == Stop(DELETED + 6 * SECOND, Ending.EXITED)
    # Past its stop time already: the stop is due now (in the past).
    assert plan_stop(deleting(30, "2"), late).at < late
    # Killed when the grace period would have run out.
    assert plan_stop(deleting(3, "60"), late) == Stop(DELETED + 4 * SECOND, Ending.KILLED)


def test_containers_that_died_with_the_power_are_gone_at_once() -> None:
    now = DELETED + dt.timedelta(seconds=1)
    stop = plan_stop(deleting(30, "20"), now, lost_with_power=True)
    assert stop == Stop(now, Ending.LOST)


@pytest.mark.parametrize("grace", [None, "30", -5, 2**63 - 1])
def test_odd_grace_periods_never_crash_the_plan(grace: Any) -> None:
    meta = {
        "deletionTimestamp": DELETED.isoformat(),
        "deletionGracePeriodSeconds": grace,
        "annotations": {SLOW_STOP_ANNOTATION: "5"},
    }
    stop = plan_stop(meta, DELETED)
    assert isinstance(stop.at, dt.datetime)


def test_an_unreadable_deletion_timestamp_counts_from_sight() -> None:
    meta = {
        "deletionTimestamp": "not a time",
        "deletionGracePeriodSeconds": 30,
        "annotations": {SLOW_STOP_ANNOTATION: "5"},
    }
    assert plan_stop(meta, DELETED) == Stop(DELETED + 5 * SECOND, Ending.EXITED)


def test_the_api_servers_z_suffix_is_read() -> None:
    meta = {"deletionTimestamp": "2026-11-23T18:00:30Z", "deletionGracePeriodSeconds": 30}
    assert plan_stop(meta, DELETED + 9 * SECOND).at == DELETED + SECOND
