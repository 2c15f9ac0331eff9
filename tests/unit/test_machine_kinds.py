"""The one adapter for Machines (controllers/machines.py, kube/union.py): Cluster API's and
OpenShift's read as one store, found by the group an ownerReference names, written back
as their own kind."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from metalmend.api.resources import Machine, OpenShiftMachine, machine_resource
from metalmend.controllers import machines
from metalmend.kube.store import Store
from metalmend.kube.union import UnionInformer


def machine(api_version: str, name: str, uid: str, node: str = "") -> Any:
    meta = SimpleNamespace(namespace="t1", name=name, uid=uid)
    status = {"nodeRef": {"name": node}} if node else {}
    return SimpleNamespace(
        apiVersion=api_version, metadata=meta, get=lambda k: {"status": status}.get(k)
    )


def informer(*objects: Any) -> Any:
    store = Store(
        {"by-node": lambda m: [m.get("status")["nodeRef"]["name"]] if m.get("status") else []}
    )
    for obj in objects:
        store.upsert(obj)
    heard: list[Any] = []
    return SimpleNamespace(store=store, name="machines", add_handler=heard.append, heard=heard)


CAPI = machine("cluster.x-k8s.io/v1beta1", "m1", "uid-capi", node="n1")
OPENSHIFT = machine("machine.openshift.io/v1beta1", "m1", "uid-os", node="n1")
OTHER = machine("machine.openshift.io/v1beta1", "m2", "uid-os2")


def test_one_store_over_both_kinds() -> None:
    capi, openshift = informer(CAPI), informer(OPENSHIFT, OTHER)
    union = UnionInformer([capi, openshift])
    assert union.store.get("t1/m1") is CAPI  # same key in both: the first informer's
    assert union.store.get("t1/m2") is OTHER
    assert union.store.get("t1/m3") is None
    assert union.store.values() == [CAPI, OPENSHIFT, OTHER]
    assert union.store.by_index("by-node", "n1") == [CAPI, OPENSHIFT]
    assert len(union.store) == 3

    def handler(old: Any, new: Any) -> None:
        return None

    union.add_handler(handler)
    assert capi.heard == [handler]
    assert openshift.heard == [handler]


def test_find_by_the_owners_group_and_uid() -> None:
    union = UnionInformer([informer(CAPI), informer(OPENSHIFT, OTHER)])
    assert machines.find(union, "t1/m1", "machine.openshift.io/v1beta1") is OPENSHIFT
    assert machines.find(union, "t1/m1", "cluster.x-k8s.io/v1beta2") is CAPI
    assert machines.find(union, "t1/m1") is CAPI
    assert machines.find(union, "t1/m1", "machine.openshift.io/v1beta1", uid="uid-os") is OPENSHIFT
    assert machines.find(union, "t1/m1", "machine.openshift.io/v1beta1", uid="uid-old") is None
    assert machines.find(union, "t1/m2", "cluster.x-k8s.io/v1beta1") is None


def test_written_back_as_its_own_kind() -> None:
    assert machine_resource(OPENSHIFT) is OpenShiftMachine
    assert machine_resource(CAPI) is Machine
    assert machine_resource(SimpleNamespace()) is Machine
