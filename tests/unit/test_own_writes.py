"""kube.own_writes: the object as we last wrote it, until the cache has that write."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from metalmend.kube.own_writes import OwnWrites


def version(rv: str, value: str = "") -> Any:
    return ConfigMap(metadata=ObjectMeta(name="c", resourceVersion=rv), data={"v": value})


BEFORE, OURS, LATER = version("10"), version("11", "ours"), version("12", "theirs")


@pytest.mark.parametrize(
    ("cached", "read"),
    [
        pytest.param(BEFORE, OURS, id="the cache still holds what our write replaced: ours"),
        pytest.param(OURS, OURS, id="the cache has our write"),
        pytest.param(LATER, LATER, id="the cache has a later change: the cache's"),
        pytest.param(None, None, id="gone from the cache: gone"),
    ],
)
def test_our_write_is_read_only_while_the_cache_holds_what_it_replaced(
    cached: Any, read: Any
) -> None:
    writes = OwnWrites()
    writes.wrote("ns/c", BEFORE, OURS)
    assert writes.latest("ns/c", cached) is read


def test_once_the_cache_has_moved_on_the_write_is_forgotten() -> None:
    writes = OwnWrites()
    writes.wrote("ns/c", BEFORE, OURS)
    assert writes.latest("ns/c", OURS) is OURS  # caught up: forgotten
    assert writes.latest("ns/c", BEFORE) is BEFORE  # (a cache going back is not ours to fix)


def test_nothing_written_reads_the_cache() -> None:
    assert OwnWrites().latest("ns/c", BEFORE) is BEFORE


def test_it_counts_the_keys_it_remembers_and_forgets_one_the_cache_has() -> None:
    writes = OwnWrites()
    assert len(writes) == 0  # nothing remembered: callers skip the lookups
    writes.wrote("ns/c", BEFORE, OURS)
    assert len(writes) == 1
    assert writes.latest("ns/c", OURS) is OURS
    assert len(writes) == 0


def test_a_key_no_longer_in_the_cache_is_forgotten() -> None:
    writes = OwnWrites()
    writes.wrote("ns/gone", BEFORE, OURS)
    writes.wrote("ns/c", BEFORE, OURS)
    writes.retain({"ns/c"})
    assert len(writes) == 1
    assert writes.latest("ns/c", BEFORE) is OURS
