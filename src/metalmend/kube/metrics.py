"""Prometheus metrics of the runtime, served on /metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILE_SECONDS = Histogram(
    "metalmend_reconcile_duration_seconds",
    "Time spent in one reconcile.",
    ["controller"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120),
)
RECONCILE_TOTAL = Counter(
    "metalmend_reconcile_total", "Reconciles by outcome.", ["controller", "outcome"]
)
RECONCILE_ERRORS = Counter(
    "metalmend_reconcile_errors_total", "Reconciles that raised.", ["controller"]
)
QUEUE_DEPTH = Gauge("metalmend_workqueue_depth", "Keys waiting for a worker.", ["controller"])
INFORMER_RELISTS = Counter(
    "metalmend_informer_lists_total", "Full lists (first sync and after 410 Gone).", ["resource"]
)
INFORMER_EVENTS = Counter(
    "metalmend_informer_events_total", "Watch events received.", ["resource", "type"]
)
INFORMER_ERRORS = Counter(
    "metalmend_informer_errors_total", "Failed lists and watches.", ["resource", "verb", "code"]
)
LEADER = Gauge("metalmend_leader", "1 while this replica holds the leader lease.", ["lease"])
