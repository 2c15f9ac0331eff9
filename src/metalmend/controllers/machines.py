"""The Machines metalmend reads: Cluster API's (``cluster.x-k8s.io``) and OpenShift's
(``machine.openshift.io/v1beta1``), through this one adapter at the edge. Both kinds carry
what the controllers read in the same places (the ``metal3.io/BareMetalHost`` and
``host.metal3.io/external-remediation`` annotations, ``spec.providerID``,
``status.nodeRef``, ``status.conditions``); what differs is handled where it is read
(api/links.py: the host's consumerRef names a Machine of its own group; OpenShift's
``baremetalhost:///`` providerIDs), and writes go back to the object's own kind
(api/resources.machine_resource).

Which kinds are read is decided once, before the controllers start
(``served_machine_kinds``): a Machine kind the API server does not serve, or that this
identity may not list and watch, is skipped with one log line. Without a ``run`` to decide
(tests building a Manager), Cluster API's alone.

Cluster API Provider Metal3 (CAPM3) puts the ``metal3.io/BareMetalHost`` annotation on the
Metal3Machine that a Cluster API Machine's ``spec.infrastructureRef`` names, not on the
Machine, and links the host back through its consumerRef to that Metal3Machine. So that
every controller finds such a Machine's host where it finds any Machine's, the Cluster API
Machines' informer holds each Machine without the annotation with the host CAPM3 linked it
to (``Capm3Links``, by the pure rule ``api/links.capm3_host``): in the informer's store
only, never written to the Machine, and recomputed when the Metal3Machine or the host
changes. Metal3Machines are read where the API server serves them (``served_metal3machines``,
one log line where it does not); the providerID CAPM3 sets, ``metal3://<ns>/<host>/<m3m>``,
links a Machine without them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightkube import AsyncClient

from metalmend.api import indexes, links, names
from metalmend.api.resources import (
    MACHINE_KINDS,
    BareMetalHost,
    Machine,
    Metal3Machine,
    OpenShiftMachine,
)
from metalmend.kube import discovery
from metalmend.kube.informer import Informer
from metalmend.kube.manager import Manager
from metalmend.kube.store import IndexFunc, object_key
from metalmend.kube.union import UnionInformer
from metalmend.log import fields

log = logging.getLogger(__name__)

SHARED_NAME = "machine-kinds"
METAL3MACHINES = "metal3machines-read"


async def served_machine_kinds(
    client: AsyncClient, namespace: str | None = None
) -> tuple[Any, ...]:
    """The Machine kinds to read: those the API server serves and this identity may list
    and watch (in ``namespace``, or everywhere); one that cannot be told now is kept (the
    start-up check of served kinds, or its informer, then says so). Each kind skipped is
    one log line, never an informer retrying: OpenShift's on a Cluster API cluster, Cluster
    API's on OpenShift, either where the chart's ``run.machines`` leaves it out, or both
    (plain Kubernetes: the controllers that follow Machines then have none to follow)."""
    kinds = []
    for kind in MACHINE_KINDS:
        group, version, plural = discovery.kind_of(kind)
        api = f"{group}/{version}"
        if await discovery.serves(client, api, plural) is False:
            log.info("Machines of this API are not served: not read",
                     extra=fields(api=api, kind="Machine"))  # fmt: skip
        elif await discovery.may_read(client, kind, namespace) is False:
            log.info("Machines of this API are served but this identity may not list and"
                     " watch them (the chart's run.machines): not read",
                     extra=fields(api=api, kind="Machine"))  # fmt: skip
        else:
            kinds.append(kind)
    return tuple(kinds)


def use_kinds(manager: Manager, kinds: Sequence[Any]) -> None:
    """Read these Machine kinds in this manager (before any controller is set up)."""
    manager.shared(SHARED_NAME, lambda: tuple(kinds))


async def served_metal3machines(client: AsyncClient, namespace: str | None = None) -> bool:
    """Whether to read CAPM3's Metal3Machines: where the API server serves them and this
    identity may list and watch them (or either cannot be told now: the start-up check of
    served kinds, or the informer, then says so); one log line where not."""
    group, version, plural = discovery.kind_of(Metal3Machine)
    served = await discovery.serves(client, f"{group}/{version}", plural)
    if served is False:
        log.info("Metal3Machines are not served: not read (a Cluster API Machine's host is"
                 " then its own annotation's, or its providerID's)",
                 extra=fields(api=f"{group}/{version}", kind="Metal3Machine"))  # fmt: skip
        return False
    if await discovery.may_read(client, Metal3Machine, namespace) is False:
        log.info("Metal3Machines are served but this identity may not list and watch them"
                 " (the chart's run.machines): not read",
                 extra=fields(api=f"{group}/{version}", kind="Metal3Machine"))  # fmt: skip
        return False
    return True


def use_metal3machines(manager: Manager, read: bool) -> None:
    """Read CAPM3's Metal3Machines in this manager (before any controller is set up)."""
    manager.shared(METAL3MACHINES, lambda: read)


def informer(
    manager: Manager,
    *,
    namespace: str | None = None,
    indexes: Mapping[str, IndexFunc] | None = None,
) -> UnionInformer:
    """The Machines of every kind read, as one informer (kube/union.py)."""
    kinds = manager.shared(SHARED_NAME, lambda: (Machine,))
    return UnionInformer(
        [
            capi_informer(manager, namespace=namespace, indexes=indexes)
            if kind is Machine
            else manager.informer(kind, namespace=namespace, indexes=indexes)
            for kind in kinds
        ]
    )


def capi_informer(
    manager: Manager,
    *,
    namespace: str | None = None,
    indexes: Mapping[str, IndexFunc] | None = None,
) -> Informer:
    """Cluster API's Machines alone (for what reads Cluster API's own kinds: its
    MachineHealthCheck), each held with the host CAPM3 linked it to (``Capm3Links``)."""
    capi = manager.informer(Machine, namespace=namespace, indexes=indexes)
    manager.shared(f"capm3-links/{namespace or '*'}", lambda: Capm3Links(manager, capi))
    return capi


def openshift_informer(
    manager: Manager,
    *,
    namespace: str | None = None,
    indexes: Mapping[str, IndexFunc] | None = None,
) -> Informer | None:
    """OpenShift's Machines alone, where they are read (None where the API server does not
    serve them): for what follows a Node's ``machine.openshift.io/machine`` annotation
    (the NodeHealthCheck), which needs no Machine informer where there is none to read."""
    kinds = manager.shared(SHARED_NAME, lambda: (Machine,))
    if OpenShiftMachine not in kinds:
        return None
    return manager.informer(OpenShiftMachine, namespace=namespace, indexes=indexes)


def openshift_lookup(machines: UnionInformer) -> Callable[[str], Any | None] | None:
    """The OpenShift Machine of a "namespace/name" among ``machines`` (None where OpenShift's
    Machines are not read): what a Node's ``machine.openshift.io/machine`` names."""
    if not any(i.resource is OpenShiftMachine for i in machines.informers):
        return None
    api_version = f"{links.OPENSHIFT_MACHINE_GROUP}/v1beta1"
    return lambda key: find(machines, key, api_version)


def find(machines: UnionInformer, key: str, api_version: str = "", uid: str = "") -> Any | None:
    """The Machine ``key`` ("namespace/name") of the group ``api_version`` names (an
    ownerReference's; any group when empty) and, when given, of that uid."""
    group = api_version.rpartition("/")[0] if "/" in api_version else ""
    for informer in machines.informers:
        found = informer.store.get(key)
        if found is None:
            continue
        if group and links.machine_group(found) != group:
            continue
        if uid and found.metadata.uid != uid:
            continue
        return found
    return None


class Capm3Links:
    """The host CAPM3 linked each Cluster API Machine to, in the Machines' informer's store
    (the informer's ``transform``): a Machine without its own ``metal3.io/BareMetalHost``
    annotation is held with the one ``links.capm3_host`` finds, and refreshed when its
    Metal3Machine or a host that names one in its consumerRef changes."""

    def __init__(self, manager: Manager, machines: Informer) -> None:
        namespace = machines.namespace
        self.machines = machines
        self.hosts = manager.informer(BareMetalHost, namespace=namespace)
        read = manager.shared(METAL3MACHINES, lambda: False)
        self.metal3machines = manager.informer(Metal3Machine, namespace=namespace) if read else None
        # key -> (the Machine as held, the Machine as listed): what this added, to undo
        self.derived: dict[str, tuple[Any, Any]] = {}
        machines.store.add_index(
            indexes.MACHINES_BY_METAL3MACHINE.name, indexes.MACHINES_BY_METAL3MACHINE.function
        )
        machines.transform = self.view
        machines.add_handler(self.on_machine)
        self.hosts.add_handler(self.on_host)
        if self.metal3machines is not None:
            self.metal3machines.add_handler(self.on_metal3machine)

    def _host(self, key: str) -> links.HostFacts | None:
        found = self.hosts.store.get(key)
        return links.host_facts(found) if found is not None else None

    def view(self, machine: Any) -> Any:
        key = object_key(machine)
        held = self.derived.get(key)
        listed = held[1] if held is not None and held[0] is machine else machine
        annotations = listed.metadata.annotations or {}
        identity = links.machine_identity(listed)
        m3m_key = links.metal3machine_key(identity)
        found = None
        if names.MACHINE_HOST not in annotations and m3m_key is not None:
            m3m = self.metal3machines.store.get(m3m_key) if self.metal3machines else None
            on_m3m = (m3m.metadata.annotations or {}).get(names.MACHINE_HOST) if m3m else None
            provider = (listed.get("spec") or {}).get("providerID")
            found = links.capm3_host(identity, on_m3m, provider, self._host)
        if found is None:
            self.derived.pop(key, None)
            return listed
        unchanged = (machine.metadata.annotations or {}).get(names.MACHINE_HOST) == found
        if held is not None and held[0] is machine and unchanged:
            return machine
        meta = listed.get("metadata")
        meta = dict(meta.to_dict() if hasattr(meta, "to_dict") else meta)
        meta["annotations"] = {**annotations, names.MACHINE_HOST: found}
        view = type(listed)(listed)  # a copy of the Machine as listed, its metadata replaced
        view["metadata"] = meta
        self.derived[key] = (view, listed)
        return view

    def refresh_metal3machine(self, key: str) -> None:
        by = indexes.MACHINES_BY_METAL3MACHINE.name
        for machine in self.machines.store.by_index(by, key):
            self.machines.refresh(object_key(machine))

    def on_machine(self, old: Any | None, new: Any | None) -> None:
        if new is None and old is not None:
            self.derived.pop(object_key(old), None)

    def on_metal3machine(self, old: Any | None, new: Any | None) -> None:
        def host(m3m: Any | None) -> str | None:
            return (m3m.metadata.annotations or {}).get(names.MACHINE_HOST) if m3m else None

        if old is None or new is None or host(old) != host(new):
            self.refresh_metal3machine(object_key(new if new is not None else old))

    def on_host(self, old: Any | None, new: Any | None) -> None:
        def consumer(host: Any | None) -> str | None:
            if host is None:
                return None
            ref = (host.get("spec") or {}).get("consumerRef") or {}
            if ref.get("kind") != "Metal3Machine" or not ref.get("name"):
                return None
            return f"{ref.get('namespace') or host.metadata.namespace}/{ref['name']}"

        before, after = consumer(old), consumer(new)
        if old is not None and new is not None and before == after:
            return
        for key in {k for k in (before, after) if k}:
            self.refresh_metal3machine(key)
