"""metalmend.heap: the collector's young threshold, pause timing on /metrics, and freezing
the survivors of a slow full collection (asked of the event loop, never done inside the
collector)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from metalmend import heap


@pytest.fixture
def restored() -> Iterator[None]:
    threshold = gc.get_threshold()
    callbacks = list(gc.callbacks)
    installed = list(heap._installed)
    yield
    gc.set_threshold(*threshold)
    gc.callbacks[:] = callbacks
    heap._installed[:] = installed
    gc.unfreeze()


@pytest.mark.parametrize(
    ("generation", "seconds", "freeze"),
    [
        (2, 0.5, True),  # a full collection that walked a large heap
        (2, heap.SLOW_FULL_COLLECTION + 0.001, True),
        (2, heap.SLOW_FULL_COLLECTION, False),  # at the limit: not slow
        (2, 0.001, False),
        (1, 0.5, False),  # a young collection: its survivors are not proven long-lived
        (0, 0.5, False),
    ],
)
def test_only_a_slow_full_collection_freezes(generation: int, seconds: float, freeze: bool) -> None:
    assert heap.should_freeze(generation, seconds) is freeze


def pauses(generation: str) -> float:
    value = REGISTRY.get_sample_value(
        "metalmend_gc_pause_seconds_count", {"generation": generation}
    )
    return value or 0.0


def freezes() -> float:
    return REGISTRY.get_sample_value("metalmend_gc_freezes_total") or 0.0


async def test_tune_sets_the_young_threshold_once_and_times_every_collection(
    restored: None,
) -> None:
    heap.tune(asyncio.get_running_loop())
    heap.tune(asyncio.get_running_loop())  # twice: one callback
    assert gc.get_threshold()[0] == heap.GEN0_THRESHOLD
    assert sum(isinstance(c, heap._Watch) for c in gc.callbacks) == 1
    before = pauses("1")
    gc.collect(1)
    assert pauses("1") == before + 1


async def test_a_slow_full_collection_freezes_its_survivors_on_the_loop(
    restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(heap, "SLOW_FULL_COLLECTION", 0.0)  # every full collection is slow
    heap.tune(asyncio.get_running_loop())
    before = freezes()
    gc.collect(1)
    await asyncio.sleep(0)
    assert freezes() == before, "a young collection freezes nothing"
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gc.get_freeze_count() == 0, "not inside the collector"
    await asyncio.sleep(0)
    assert freezes() == before + 1
    assert gc.get_freeze_count() > 0


def test_freeze_long_lived_collects_first_and_freezes_what_is_alive(restored: None) -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self  # a cycle

    kept, dropped = Node(), Node()
    gone = weakref.ref(dropped)
    del dropped
    heap.freeze_long_lived()
    assert gone() is None, "garbage is collected, not frozen"
    frozen = gc.get_freeze_count()
    assert frozen > 0
    assert gc.is_tracked(kept)
    gc.collect()
    assert gc.get_freeze_count() == frozen, "frozen objects stay out of collections"
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
