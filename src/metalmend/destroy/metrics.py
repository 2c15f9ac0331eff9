"""Destroy tasks' metrics (docs/observability.md): tasks started and completed, the steps
of each node's destroy, nodes by outcome, drive erases started, ended and under way."""

from __future__ import annotations

import datetime as dt
import threading
import weakref
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from metalmend.destroy.policy import destroy as destroy_policy

STEP_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
ERASE_BUCKETS = (10, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400)

TASKS_STARTED = Counter(
    "metalmend_serve_destroy_tasks_started_total",
    "Destroy tasks (Drydock's destroy_nodes) this process started or took up again.",
)
TASK_SECONDS = Histogram(
    "metalmend_serve_destroy_task_duration_seconds",
    "Destroy tasks that completed (every node finished, whatever its outcome), from their"
    " creation.",
    buckets=STEP_BUCKETS,
)
DESTROY_STEPS = Counter(
    "metalmend_serve_destroy_steps_entered_total",
    "Steps of a node's destroy entered (claim, power-off, wipe, release, done).",
    ["step"],
)
NODE_SECONDS = Histogram(
    "metalmend_serve_destroy_node_duration_seconds",
    "Nodes of destroy tasks that finished, by outcome (success, failure), from their first record.",
    ["outcome"],
    buckets=STEP_BUCKETS,
)
ERASES_STARTED = Counter(
    "metalmend_serve_drive_erases_started_total", "Drive erases requested of a BMC."
)
ERASE_SECONDS = Histogram(
    "metalmend_serve_drive_erase_duration_seconds",
    "Drive erases that ended, by outcome (erased: the BMC reported it finished; failed:"
    " refused, failed, or past destroy.erase_timeout), from their request.",
    ["outcome"],
    buckets=ERASE_BUCKETS,
)
ERASES_RUNNING = Gauge(
    "metalmend_serve_drive_erases_running",
    "Drive erases requested and not yet ended, of the destroys this process runs.",
)
ERASE_OLDEST = Gauge(
    "metalmend_serve_drive_erase_oldest_age_seconds",
    "Age of the oldest drive erase under way (0: none).",
)
# What alerts watch (docs/runbooks.md) exists from the start at 0: increase() sees the first.
for _outcome in (str(destroy_policy.Outcome.SUCCESS), str(destroy_policy.Outcome.FAILURE)):
    NODE_SECONDS.labels(_outcome)
for _outcome in ("erased", "failed"):
    ERASE_SECONDS.labels(_outcome)


def task_started() -> None:
    TASKS_STARTED.inc()


def task_completed(created: dt.datetime, now: dt.datetime) -> None:
    TASK_SECONDS.observe(max((now - created).total_seconds(), 0.0))


def _age(since: dt.datetime | None, now: dt.datetime) -> float:
    return max((now - since).total_seconds(), 0.0) if since is not None else 0.0


Transition = tuple[str, str, float]
"""(what, label, seconds): ("step", step, 0), ("node", outcome, s), ("erase", outcome, s),
("erase-started", "", 0)."""


def destroy_transitions(
    before: destroy_policy.NodeState, after: destroy_policy.NodeState, now: dt.datetime
) -> list[Transition]:
    """What changed between two records of one node's destroy (pure)."""
    found: list[Transition] = []
    if after.step is not before.step:
        found.append(("step", str(after.step), 0.0))
    if after.finished and not before.finished:
        first = after.messages[0].ts if after.messages else None
        found.append(("node", str(after.outcome), _age(first, now)))
    erases = {d.id: d.erase for d in before.drives}
    ended = {destroy_policy.Erase.ERASED: "erased", destroy_policy.Erase.FAILED: "failed"}
    for drive in after.drives:
        was = erases.get(drive.id)
        if drive.erase is was:
            continue
        if drive.erase is destroy_policy.Erase.REQUESTED:
            found.append(("erase-started", "", 0.0))
        elif drive.erase in ended:
            found.append(("erase", ended[drive.erase], _age(drive.since, now)))
    return found


UNDER_WAY = (destroy_policy.Erase.REQUESTED, destroy_policy.Erase.RUNNING)
_seen: weakref.WeakKeyDictionary[Any, destroy_policy.NodeState] = weakref.WeakKeyDictionary()
_running: weakref.WeakKeyDictionary[Any, tuple[dt.datetime, ...]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()  # /metrics reads _running from its own thread


def destroy_seen(runner: Any, state: destroy_policy.NodeState, now: dt.datetime) -> None:
    """A node's destroy ``runner`` holds ``state`` now: count what changed since it was
    seen last (nothing the first time: a destroy taken up again after a restart is not
    counted twice), and keep its erases under way for the gauges (forgotten with the
    runner)."""
    with _lock:
        before = _seen.get(runner)
        _seen[runner] = state
        running = tuple(
            d.since for d in state.drives if d.erase in UNDER_WAY and d.since is not None
        )
        if running and not state.finished:
            _running[runner] = running
        else:
            _running.pop(runner, None)
    if before is None:
        return
    for what, label, seconds in destroy_transitions(before, state, now):
        if what == "step":
            DESTROY_STEPS.labels(label).inc()
        elif what == "node":
            NODE_SECONDS.labels(label).observe(seconds)
        elif what == "erase":
            ERASE_SECONDS.labels(label).observe(seconds)
        else:
            ERASES_STARTED.inc()


def _erases_running() -> float:
    with _lock:
        return float(sum(len(v) for v in _running.values()))


def _erase_oldest() -> float:
    now = dt.datetime.now(dt.UTC)
    with _lock:
        oldest = min((s for v in _running.values() for s in v), default=None)
    return _age(oldest, now)


ERASES_RUNNING.set_function(_erases_running)
ERASE_OLDEST.set_function(_erase_oldest)
