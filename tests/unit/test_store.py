"""The informer store and its secondary indexes."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from metalmend.api import indexes
from metalmend.kube.store import IndexConflict, Store, object_key, split_key


def machine(name: str, host: str | None = None, node: str | None = None) -> ConfigMap:
    annotations = {"metal3.io/BareMetalHost": host} if host else None
    data = {"node": node} if node else None
    return ConfigMap(
        metadata=ObjectMeta(name=name, namespace="ns", annotations=annotations), data=data
    )


def by_host(obj: Any) -> list[str]:
    host = (obj.metadata.annotations or {}).get("metal3.io/BareMetalHost")
    return [host] if host else []


def by_node(obj: Any) -> list[str]:
    return [obj.data["node"]] if obj.data else []


def names(objects: list[Any]) -> list[str]:
    return [o.metadata.name for o in objects]


def test_keys_are_namespace_slash_name() -> None:
    assert object_key(machine("m1")) == "ns/m1"
    assert split_key("ns/m1") == ("ns", "m1")
    assert split_key("node-1") == (None, "node-1")


def test_index_follows_updates_and_deletes() -> None:
    store = Store({"host": by_host})
    store.upsert(machine("m1", host="ns/h1"))
    store.upsert(machine("m2", host="ns/h1"))
    assert names(store.by_index("host", "ns/h1")) == ["m1", "m2"]
    store.upsert(machine("m1", host="ns/h2"))
    assert names(store.by_index("host", "ns/h1")) == ["m2"]
    assert names(store.by_index("host", "ns/h2")) == ["m1"]
    store.delete("ns/m2")
    assert store.by_index("host", "ns/h1") == []


def test_replace_rebuilds_everything() -> None:
    store = Store({"host": by_host})
    store.upsert(machine("old", host="ns/h1"))
    store.replace([machine("new", host="ns/h2")])
    assert store.keys() == ["ns/new"]
    assert store.by_index("host", "ns/h1") == []
    assert names(store.by_index("host", "ns/h2")) == ["new"]


def test_an_index_added_later_covers_existing_objects() -> None:
    store = Store()
    store.upsert(machine("m1", node="node-1"))
    store.add_index("node", by_node)
    assert names(store.by_index("node", "node-1")) == ["m1"]


def test_the_same_index_registered_twice_is_one_index() -> None:
    """Every controller on a shared informer asks for the indexes it reads."""
    store = Store({"host": by_host})
    store.upsert(machine("m1", host="ns/h1"))
    store.add_index("host", by_host)
    assert names(store.by_index("host", "ns/h1")) == ["m1"]


def test_a_different_function_under_a_taken_name_is_refused() -> None:
    store = Store({"host": by_host})
    with pytest.raises(IndexConflict, match=r"index 'host' is already defined by .*by_host"):
        store.add_index("host", by_node)
    store.upsert(machine("m1", host="ns/h1", node="node-1"))
    assert names(store.by_index("host", "ns/h1")) == ["m1"]  # the first one still answers


def test_every_shared_index_has_its_own_name() -> None:
    defined = [v for v in vars(indexes).values() if isinstance(v, indexes.Index)]
    assert len(defined) >= 9
    assert len({i.name for i in defined}) == len(defined)
