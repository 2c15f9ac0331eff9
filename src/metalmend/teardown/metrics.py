"""The teardown claim's metrics (docs/observability.md): the interlock's refusals."""

from __future__ import annotations

from prometheus_client import Counter

REFUSALS = Counter(
    "metalmend_serve_interlock_refusals_total",
    "Teardown claims the interlock refused (a remediation holds the Node's host), by step.",
    ["step"],
)


def interlock_refused(step: str) -> None:
    REFUSALS.labels(step).inc()
