"""A generic resource's metadata parsed once per object (metalmend.kube.generic)."""

from __future__ import annotations

import copy

from lightkube.generic_resource import create_namespaced_resource

from metalmend.kube import generic
from metalmend.kube.informer import without_managed_fields

Thing = create_namespaced_resource("example.com", "v1", "Thing", "things")


def thing(**metadata: object) -> object:
    return Thing({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": metadata})


def test_the_metadata_is_parsed_once_and_read_as_written() -> None:
    obj = thing(name="a", namespace="ns", labels={"x": "1"}, uid="u")
    first = obj.metadata
    assert first is obj.metadata, "the same ObjectMeta at the second look"
    assert (first.name, first.namespace, first.labels, first.uid) == ("a", "ns", {"x": "1"}, "u")


def test_replaced_metadata_is_parsed_again() -> None:
    obj = thing(name="a", labels={"x": "1"})
    assert obj.metadata.labels == {"x": "1"}
    obj["metadata"] = {"name": "a", "labels": {"x": "2"}}
    assert obj.metadata.labels == {"x": "2"}


def test_managed_fields_dropped_in_place_are_dropped_from_the_parsed_metadata() -> None:
    obj = thing(name="a", managedFields=[{"manager": "kubectl", "operation": "Apply"}])
    assert obj.metadata.managedFields
    without_managed_fields(obj)
    assert obj.metadata.managedFields is None


def test_copies_and_typed_metadata_are_their_own() -> None:
    obj = thing(name="a", labels={"x": "1"})
    assert obj.metadata.labels == {"x": "1"}
    copied = type(obj)(obj)  # a shallow copy shares the metadata dict, not the memo
    copied["metadata"] = {**obj["metadata"], "labels": {"x": "2"}}
    assert (obj.metadata.labels, copied.metadata.labels) == ({"x": "1"}, {"x": "2"})
    deep = copy.deepcopy(obj)
    deep["metadata"]["labels"] = {"x": "3"}
    generic.forget(deep)
    assert (obj.metadata.labels, deep.metadata.labels) == ({"x": "1"}, {"x": "3"})
    assert thing().metadata is not None  # an empty metadata dict still parses
    assert Thing({"kind": "Thing"}).metadata is None
