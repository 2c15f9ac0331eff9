"""The one adapter for Machines (controllers/machines.py, kube/union.py): Cluster API's and
OpenShift's read as one store, found by the group an ownerReference names, written back
as their own kind."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from metalmend.api import indexes, names
from metalmend.api.resources import (
    BareMetalHost,
    Machine,
    Metal3Machine,
    OpenShiftMachine,
    machine_resource,
)
from metalmend.controllers import machines
from metalmend.kube.manager import Manager
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


# ---- CAPM3: a Cluster API Machine's host through its Metal3Machine (Capm3Links) -------------

M3M_API = "infrastructure.cluster.x-k8s.io/v1beta1"


def capi_machine(name: str, version: str, annotations: dict[str, str] | None = None) -> Any:
    return Machine.from_dict({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
        "metadata": {"name": name, "namespace": "t1", "uid": f"uid-{name}",
                     "resourceVersion": version, "annotations": annotations or {}},
        "spec": {"infrastructureRef": {"apiVersion": M3M_API, "kind": "Metal3Machine",
                                       "name": f"m3m-{name}"}},
    })  # fmt: skip


def metal3machine(name: str, host: str | None) -> Any:
    annotations = {names.MACHINE_HOST: host} if host else {}
    return Metal3Machine.from_dict({
        "apiVersion": M3M_API, "kind": "Metal3Machine",
        "metadata": {"name": name, "namespace": "t1", "uid": f"uid-{name}",
                     "resourceVersion": "1", "annotations": annotations},
    })  # fmt: skip


def bmh(name: str, consumer: str | None) -> Any:
    ref = {"apiVersion": M3M_API, "kind": "Metal3Machine", "name": consumer} if consumer else None
    return BareMetalHost.from_dict({
        "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
        "metadata": {"name": name, "namespace": "t1", "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"consumerRef": ref} if ref else {},
    })  # fmt: skip


def host_annotation(obj: Any) -> str | None:
    return (obj.metadata.annotations or {}).get(names.MACHINE_HOST)


def test_capm3_machines_are_held_with_the_host_their_metal3machine_names() -> None:
    manager = Manager(cast(Any, None))
    machines.use_metal3machines(manager, True)
    union = machines.informer(manager, namespace="t1", indexes=indexes.of(indexes.MACHINES_BY_HOST))
    (capi,) = union.informers
    hosts = manager.informer(BareMetalHost, namespace="t1")
    m3ms = manager.informer(Metal3Machine, namespace="t1")
    heard: list[tuple[Any, Any]] = []
    capi.add_handler(lambda old, new: heard.append((old, new)))

    capi._on_event("ADDED", capi_machine("a", "1"))  # before its Metal3Machine and host
    assert host_annotation(union.store.get("t1/a")) is None
    m3ms._on_event("ADDED", metal3machine("m3m-a", "t1/h1"))
    assert host_annotation(union.store.get("t1/a")) is None  # the host not yet known
    hosts._on_event("ADDED", bmh("h1", "m3m-a"))  # confirms the Metal3Machine
    held = union.store.get("t1/a")
    assert host_annotation(held) == "t1/h1"
    assert union.store.by_index(indexes.MACHINES_BY_HOST.name, "t1/h1") == [held]
    assert heard[-1][1] is held
    events = len(heard)
    hosts._on_event("MODIFIED", bmh("h1", "m3m-a"))  # the same consumer: nothing to redo
    assert len(heard) == events
    assert union.store.get("t1/a") is held

    # a new version of the Machine (from the watch) is held with the host again
    capi._on_event("MODIFIED", capi_machine("a", "2", {"other": "x"}))
    assert host_annotation(union.store.get("t1/a")) == "t1/h1"
    # the host consumed by another Metal3Machine: the link goes
    hosts._on_event("MODIFIED", bmh("h1", "m3m-other"))
    assert host_annotation(union.store.get("t1/a")) is None
    hosts._on_event("MODIFIED", bmh("h1", "m3m-a"))
    assert host_annotation(union.store.get("t1/a")) == "t1/h1"
    # the Metal3Machine's annotation removed: no host
    m3ms._on_event("MODIFIED", metal3machine("m3m-a", None))
    assert host_annotation(union.store.get("t1/a")) is None
    m3ms._on_event("MODIFIED", metal3machine("m3m-a", "t1/h1"))
    assert host_annotation(union.store.get("t1/a")) == "t1/h1"
    # a Machine's own annotation is its own: never replaced
    capi._on_event("MODIFIED", capi_machine("a", "3", {names.MACHINE_HOST: "t1/h7"}))
    assert host_annotation(union.store.get("t1/a")) == "t1/h7"
    m3ms._on_event("MODIFIED", metal3machine("m3m-a", "t1/h2"))
    assert host_annotation(union.store.get("t1/a")) == "t1/h7"
    capi._on_event("DELETED", capi_machine("a", "4"))
    assert union.store.get("t1/a") is None


def test_without_metal3machines_the_capm3_provider_id_links() -> None:
    manager = Manager(cast(Any, None))
    union = machines.informer(manager, namespace="t1")
    (capi,) = union.informers
    hosts = manager.informer(BareMetalHost, namespace="t1")
    hosts._on_event("ADDED", bmh("h1", "m3m-a"))
    machine = capi_machine("a", "1")
    machine["spec"]["providerID"] = "metal3://t1/h1/m3m-a"
    capi._on_event("ADDED", machine)
    assert host_annotation(union.store.get("t1/a")) == "t1/h1"
    assert not any(kind is Metal3Machine for kind, *_ in manager.informers)
