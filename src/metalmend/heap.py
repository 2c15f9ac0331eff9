"""The garbage collector of a controller that caches thousands of objects.

CPython frees most objects by reference counting; its garbage collector is only for
reference cycles, in three generations. A young collection walks the objects allocated
since the last one; a full one (the oldest generation) walks every tracked object, with
the whole process stopped meanwhile. At 5,000 hosts metalmend holds half a million tracked
objects (the caches of hosts, Machines, Nodes and Secrets, and one BMC driver per host),
and out of the box it ran a full collection every 2-8 s, each stopping the event loop for
350-670 ms: a reboot request that arrived during one waited for it, which was most of the
reboot latency's tail at that size (benchmarks/scale.py, docs/scale.md).

What CPython's defaults did wrong here: a young collection ran every 700 allocations, a
few milliseconds apart at 250 BMC polls a second, so anything that lived a little longer
than that (a BMC connection, a request in flight) was promoted to the oldest generation
and, once dead, could only be reclaimed by a full collection; and every full collection
walked the caches again, which never hold cycles and do not change at rest.

So ``tune`` (at start):

- young collections every GEN0_THRESHOLD allocations instead of 700: an object that lives
  for one BMC call or one API request dies young, where a collection is cheap (10-40 ms
  at 5,000 hosts, not a walk of the caches);

and ``freeze_long_lived`` (once the caches are synced) and after any slow full collection:

- what is alive then is moved out of the collector's sight (``gc.freeze``): the caches,
  the drivers, the informers. Frozen objects are still freed by reference counting when
  they are replaced or deleted (none of them is a cycle); a frozen object that later ends
  in a cycle would not be reclaimed, which is why only survivors of a full collection
  (objects that proved long-lived) are frozen, and why the count is on /metrics;
- after a full collection that took longer than SLOW_FULL_COLLECTION (the caches have
  been replaced by watch events since, for instance: a Node's status every few minutes),
  its survivors are frozen too, so that pauses stay short for as long as the process
  runs.

Every pause is on /metrics: ``metalmend_gc_pause_seconds{generation}``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from metalmend.log import fields

log = logging.getLogger(__name__)

GEN0_THRESHOLD = 10_000
"""Allocations (less deallocations) between two young collections; CPython's default is
700. 10,000 keeps young pauses around 10-40 ms at 5,000 hosts and lets the objects of a
BMC call or an API request die before they are promoted."""

SLOW_FULL_COLLECTION = 0.05
"""A full collection slower than this (seconds) freezes its survivors afterwards."""

PAUSES = Histogram(
    "metalmend_gc_pause_seconds",
    "Time the garbage collector stopped the process, by generation collected.",
    ["generation"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
FREEZES = Counter(
    "metalmend_gc_freezes_total",
    "Times the live objects were moved out of the collector's sight (gc.freeze).",
)
FROZEN = Gauge("metalmend_gc_frozen_objects", "Objects frozen (gc.freeze) and not freed since.")
FROZEN.set_function(gc.get_freeze_count)


def should_freeze(generation: int, seconds: float) -> bool:
    """After a collection of ``generation`` that took ``seconds``: freeze its survivors?"""
    return generation == 2 and seconds > SLOW_FULL_COLLECTION


class _Watch:
    """The gc callback: times every collection; after a slow full one, asks the event
    loop to freeze (not from inside the collector, which may run on any thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.loop = loop
        self.started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        seconds = time.perf_counter() - self.started
        generation = int(info.get("generation", 0))
        PAUSES.labels(str(generation)).observe(seconds)
        if should_freeze(generation, seconds) and self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(_freeze)
            except RuntimeError:  # the loop closed: the process is ending
                self.loop = None


_installed: list[_Watch] = []


def tune(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Set the young threshold and watch every collection (idempotent: a second call only
    updates the loop that freezes)."""
    _, second, third = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, second, third)
    if _installed:
        _installed[0].loop = loop
        return
    watch = _Watch(loop)
    gc.callbacks.append(watch)
    _installed.append(watch)


def freeze_long_lived() -> None:
    """Collect everything once, then freeze what survived: call it when the caches have
    been filled (the controller has listed what it watches)."""
    started = time.perf_counter()
    gc.collect()
    _freeze()
    log.info(
        "long-lived objects frozen",
        extra=fields(frozen=gc.get_freeze_count(), seconds=round(time.perf_counter() - started, 3)),
    )


def _freeze() -> None:
    gc.freeze()
    FREEZES.inc()
