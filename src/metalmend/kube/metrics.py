"""Prometheus metrics of the runtime, served on /metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

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
BACKGROUND_WAIT = Histogram(
    "metalmend_workqueue_background_wait_seconds",
    "Seconds a background key (a routine poll, a resync) waited from due to a worker.",
    ["controller"],
    buckets=(0.01, 0.1, 0.5, 1, 2, 5, 10, 20, 60, 300),
)
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


# ---- gauges computed from the informer caches at scrape time ------------------------------
# What the caches already hold (reboot requests on hosts, remediations by phase) is counted
# when /metrics is read, never kept up to date on every event and never read from the API
# server: a scrape costs one pass over the cache, and 0 API calls.

Sample = tuple[str, tuple[str, ...], float]
"""(gauge name, label values in the gauge's label order, value)."""


@dataclass(frozen=True)
class CacheGauge:
    name: str
    documentation: str
    labels: tuple[str, ...]


class _FromCaches(Collector):
    """Merges the samples of every source into one family per gauge (two controllers may
    report under one name, told apart by a label). A source is registered under a name;
    registering the name again replaces it (a manager started again in one process).

    ``collect`` runs in the /metrics handler's thread while the event loop changes the
    caches: a source takes its objects with ``Store.values()`` (one ``list(...)`` of a
    dict, which no other thread can interleave) and reads only those."""

    def __init__(self) -> None:
        self.gauges: dict[str, CacheGauge] = {}
        self.sources: dict[str, Callable[[], Iterable[Sample]]] = {}

    def collect(self) -> Iterator[Metric]:
        families = {
            g.name: GaugeMetricFamily(g.name, g.documentation, labels=list(g.labels))
            for g in self.gauges.values()
        }
        for name, source in list(self.sources.items()):
            try:
                samples = list(source())
            except Exception:  # a scrape must never fail for one source
                log.exception("metrics from the %s cache failed", name)
                continue
            for gauge, labels, value in samples:
                families[gauge].add_metric(list(labels), value)
        yield from families.values()

    def describe(self) -> Iterator[Metric]:
        return iter(())  # families are made at scrape time; no name clash to check


FROM_CACHES = _FromCaches()
REGISTRY.register(FROM_CACHES)


def cache_gauge(gauge: CacheGauge) -> CacheGauge:
    FROM_CACHES.gauges[gauge.name] = gauge
    return gauge


def from_cache(name: str, source: Callable[[], Iterable[Sample]]) -> None:
    """Count ``source()``'s samples at every scrape (``name``: the controller's)."""
    FROM_CACHES.sources[name] = source
