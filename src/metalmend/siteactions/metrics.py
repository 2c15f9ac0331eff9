"""Site actions' metrics (docs/observability.md): actions that ended and the steps this
process ran, by the plans' names and outcome."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from prometheus_client import Histogram

STEP_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)

ACTION_SECONDS = Histogram(
    "metalmend_serve_action_duration_seconds",
    "Site actions (Shipyard) that ended, by action and outcome (complete, failed), from"
    " their creation.",
    ["action", "outcome"],
    buckets=STEP_BUCKETS,
)
ACTION_STEP_SECONDS = Histogram(
    "metalmend_serve_action_step_duration_seconds",
    "Steps of site actions run by this process, by action, step and outcome (success;"
    " failed: the step failed or was stopped; interrupted: the process lost its lease, the"
    " database or was stopped, and the step is taken again from its record).",
    ["action", "step", "outcome"],
    buckets=STEP_BUCKETS,
)


def action_finished(action: str, lifecycle: str, created: dt.datetime, now: dt.datetime) -> None:
    outcome = lifecycle.lower()
    ACTION_SECONDS.labels(action, outcome).observe(max((now - created).total_seconds(), 0.0))


async def timed_step(action: str, step: str, run: Any) -> bool:
    """Await ``run`` (a step to its end: True when it succeeded), timed by its outcome."""
    started = time.monotonic()
    ACTION_STEP_SECONDS.labels(action, step, "failed")  # at 0: increase() sees a first failure
    outcome = "interrupted"
    try:
        succeeded = bool(await run)
        outcome = "success" if succeeded else "failed"
        return succeeded
    finally:
        ACTION_STEP_SECONDS.labels(action, step, outcome).observe(time.monotonic() - started)
