"""The Machines metalmend reads: Cluster API's (``cluster.x-k8s.io``) and OpenShift's
(``machine.openshift.io/v1beta1``), through this one adapter at the edge. Both kinds carry
what the controllers read in the same places (the ``metal3.io/BareMetalHost`` and
``host.metal3.io/external-remediation`` annotations, ``spec.providerID``,
``status.nodeRef``, ``status.conditions``); what differs is handled where it is read
(api/links.py: the host's consumerRef names a Machine of its own group; OpenShift's
``baremetalhost:///`` providerIDs), and writes go back to the object's own kind
(api/resources.machine_resource).

Which kinds are read is decided once, before the controllers start
(``served_machine_kinds``): a Machine kind the API server does not serve is skipped with one
log line. Without a ``run`` to decide (tests building a Manager), Cluster API's alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from lightkube import AsyncClient

from metalmend.api import links
from metalmend.api.resources import MACHINE_KINDS, Machine
from metalmend.kube import discovery
from metalmend.kube.manager import Manager
from metalmend.kube.store import IndexFunc
from metalmend.kube.union import UnionInformer
from metalmend.log import fields

log = logging.getLogger(__name__)

SHARED_NAME = "machine-kinds"


async def served_machine_kinds(client: AsyncClient) -> tuple[Any, ...]:
    """The Machine kinds to read: those the API server serves (one that cannot be told now
    is kept: the start-up check of served kinds then says so). None served: Cluster API's,
    so that ``run`` refuses to start naming its CRD, as for any kind it needs."""
    answers = []
    for kind in MACHINE_KINDS:
        group, version, plural = discovery.kind_of(kind)
        answers.append((kind, f"{group}/{version}", await discovery.serves(
            client, f"{group}/{version}", plural)))  # fmt: skip
    kinds = tuple(kind for kind, _, served in answers if served is not False)
    if not kinds:
        return (Machine,)
    for _, api, served in answers:
        if served is False:
            log.info("Machines of this API are not served: not read",
                     extra=fields(api=api, kind="Machine"))  # fmt: skip
    return kinds


def use_kinds(manager: Manager, kinds: Sequence[Any]) -> None:
    """Read these Machine kinds in this manager (before any controller is set up)."""
    manager.shared(SHARED_NAME, lambda: tuple(kinds))


def informer(
    manager: Manager,
    *,
    namespace: str | None = None,
    indexes: Mapping[str, IndexFunc] | None = None,
) -> UnionInformer:
    """The Machines of every kind read, as one informer (kube/union.py)."""
    kinds = manager.shared(SHARED_NAME, lambda: (Machine,))
    return UnionInformer(
        [manager.informer(kind, namespace=namespace, indexes=indexes) for kind in kinds]
    )


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
