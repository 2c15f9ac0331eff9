"""Cluster API's Cluster objects, for the health check: read where the API server serves
them, and nowhere else.

Cluster API's MachineHealthCheck controller (release 1.9,
``internal/controllers/machinehealthcheck/machinehealthcheck_targets.go``) reads the
check's Cluster (``spec.clusterName``, the check's namespace): it judges no Machine while
the Cluster's ``InfrastructureReady`` is not True, nor, except control-plane Machines,
while its ``ControlPlaneInitialized`` is not True; and it counts ``nodeStartupTimeout``
from the latest of the Machine's creation and the lastTransitionTime of each of those
conditions that is True (and the Machine's own ``InfrastructureReady``). ``Readiness``
reads that from a Cluster's ``status.conditions`` (v1beta1); policy.healthcheck applies it.

metalmend ships no Cluster CRD and runs where no Cluster API does, so ``ClusterCache``
first asks the API server's discovery whether ``clusters.cluster.x-k8s.io`` is served
(one GET, no RBAC needed), at the first reconcile and then every ``DISCOVERY_INTERVAL``.
Only once it is served does it start an informer for Clusters (an informer for a kind
that is not served would retry, and warn, forever); it stops that informer if the kind
goes away. Where the kind is not served, nothing changes: no Cluster is known, and the
health check judges as it did before.

A Cluster is written by its tenant: any value read from it that is not what Cluster API
writes (a condition of the wrong shape, a time that does not parse or lies in the future)
reads as absent. The most a tenant can do with its Cluster is hold its own Machines'
health checks off, which it can already do with ``cluster.x-k8s.io/skip-remediation``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_namespaced_resource

from metalmend.api.stamps import parse_stamp
from metalmend.kube import errors
from metalmend.kube.discovery import serves
from metalmend.kube.informer import Handler, Informer
from metalmend.log import fields
from metalmend.policy.healthcheck import CLOCK_SKEW

log = logging.getLogger(__name__)

GROUP_VERSION = "cluster.x-k8s.io/v1beta1"
Cluster = create_namespaced_resource("cluster.x-k8s.io", "v1beta1", "Cluster", "clusters")

# Cluster API v1beta1 condition types on a Cluster, and the label of control-plane Machines.
INFRASTRUCTURE_READY = "InfrastructureReady"
CONTROL_PLANE_INITIALIZED = "ControlPlaneInitialized"
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"

DISCOVERY_INTERVAL = 60.0
"""Seconds between two discovery checks: how late a Cluster CRD installed (or removed)
while metalmend runs is noticed. One GET each time."""
SYNC_WAIT = 5.0
"""Seconds a newly started Cluster informer may take to list before Clusters are read
by GET (RBAC may not allow list and watch)."""


@dataclass(frozen=True)
class Readiness:
    """What the health check reads of one Cluster (Cluster API v1beta1 conditions)."""

    cluster: str  # namespace/name
    infrastructure_ready: bool = False
    control_plane_initialized: bool = False
    # the later lastTransitionTime of those two conditions that are True (None: neither
    # True, or no believable time): the start of nodeStartupTimeout, as Cluster API
    ready_at: dt.datetime | None = None

    @classmethod
    def from_wire(cls, cluster: str, status: Any, now: dt.datetime) -> Readiness:
        """Tolerant: a condition of the wrong shape is absent, and so is a time that does
        not parse or is later than ``now`` by more than CLOCK_SKEW; never raises."""
        conditions = status.get("conditions") if isinstance(status, Mapping) else None
        seen: set[str] = set()  # the first condition of a type is the one (as Cluster API)
        found: dict[str, dt.datetime | None] = {}  # True conditions -> their time
        for condition in conditions if isinstance(conditions, list) else []:
            if not isinstance(condition, Mapping):
                continue
            kind = condition.get("type")
            if kind not in (INFRASTRUCTURE_READY, CONTROL_PLANE_INITIALIZED) or kind in seen:
                continue
            seen.add(kind)
            if condition.get("status") == "True":
                found[kind] = believable(condition.get("lastTransitionTime"), now)
        times = [t for t in found.values() if t is not None]
        return cls(
            cluster=cluster,
            infrastructure_ready=INFRASTRUCTURE_READY in found,
            control_plane_initialized=CONTROL_PLANE_INITIALIZED in found,
            ready_at=max(times) if times else None,
        )

    def not_ready(self, control_plane_machine: bool) -> str:
        """Why Cluster API would not judge a Machine of this Cluster yet ("" when it
        would): the control plane not initialized (except for a control-plane Machine,
        so that the first one can be remediated), or the infrastructure not ready."""
        if not self.control_plane_initialized and not control_plane_machine:
            return f"Cluster {self.cluster}: {CONTROL_PLANE_INITIALIZED} is not True yet"
        if not self.infrastructure_ready:
            return f"Cluster {self.cluster}: {INFRASTRUCTURE_READY} is not True yet"
        return ""


def believable(text: Any, now: dt.datetime) -> dt.datetime | None:
    """A condition time written by a tenant: absent unless it parses and is not in the
    future (beyond CLOCK_SKEW), which would hold the Machine's startup timeout off."""
    try:
        moment = parse_stamp(text) if isinstance(text, str) else None
    except (ValueError, OverflowError):
        return None
    if moment is None or moment > now + CLOCK_SKEW:
        return None
    return moment


def is_control_plane(machine: Any) -> bool:
    """Cluster API's ``util.IsControlPlaneMachine``: the control-plane label is there."""
    return CONTROL_PLANE_LABEL in (machine.metadata.labels or {})


def paused(cluster: Any) -> bool:
    """``spec.paused: true``: as Cluster API, the Cluster's health checks do nothing while
    it is paused (``clusterctl move`` pauses a Cluster while its objects move)."""
    spec = cluster.get("spec")
    return isinstance(spec, Mapping) and spec.get("paused") is True


def watched(cluster: Any | None) -> tuple[Any, ...]:
    """The part of a Cluster that can change what its checks do (a watch predicate):
    whether it is paused, and its two conditions."""
    if cluster is None:
        return ()
    status = cluster.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    ours = [
        (c.get("type"), c.get("status"), c.get("lastTransitionTime"))
        for c in (conditions if isinstance(conditions, list) else [])
        if isinstance(c, Mapping)
        and c.get("type") in (INFRASTRUCTURE_READY, CONTROL_PLANE_INITIALIZED)
    ]
    return (paused(cluster), *ours)


class ClusterCache:
    """Clusters of one namespace (all: None), from an informer that runs only while the
    API server serves the kind. ``on_change`` handlers hear every Cluster added, changed
    or removed, also all of them when the kind appears or goes away."""

    def __init__(self, client: AsyncClient, namespace: str | None) -> None:
        self.client = client
        self.namespace = namespace
        self.interval = DISCOVERY_INTERVAL
        self.informer: Informer | None = None
        self.on_change: list[Handler] = []
        self._informer_task: asyncio.Task[None] | None = None
        self._discovering: asyncio.Task[None] | None = None
        self._start = asyncio.Lock()

    async def get(self, namespace: str, name: str) -> Any | None:
        """The Cluster, or None: not served, not there, or not readable (RBAC)."""
        await self.start()
        informer = self.informer
        if informer is None:
            return None
        if informer.synced.is_set():
            return informer.store.get(f"{namespace}/{name}")
        try:  # served, but not listed yet (or RBAC allows only get)
            return await self.client.get(Cluster, name, namespace=namespace)
        except ApiError as error:
            if errors.is_not_found(error) or errors.is_refused(error):
                return None
            raise

    async def start(self) -> None:
        """The first call discovers (so the first verdicts already know the Cluster) and
        starts discovering again every ``interval``; later calls return at once."""
        if self._discovering is not None:
            return
        async with self._start:
            if self._discovering is not None:
                return
            await self.discover()
            self._discovering = asyncio.create_task(self._keep_discovering(), name="discovery")

    async def _keep_discovering(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.discover()

    async def discover(self) -> None:
        served = await serves(self.client, GROUP_VERSION, "clusters")
        if served is None:
            return  # cannot tell now: keep what we have
        if served and self.informer is None:
            log.info(
                "Cluster API Clusters are served: reading them", extra=fields(api=GROUP_VERSION)
            )
            informer = Informer(self.client, Cluster, namespace=self.namespace)
            for handler in self.on_change:
                informer.add_handler(handler)
            self.informer = informer
            self._informer_task = asyncio.create_task(informer.run(), name="informer clusters")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(informer.synced.wait(), SYNC_WAIT)
        elif not served and self.informer is not None:
            log.info("Cluster API Clusters are no longer served", extra=fields(api=GROUP_VERSION))
            await self._stop_informer(notify=True)

    async def _stop_informer(self, notify: bool) -> None:
        informer, task = self.informer, self._informer_task
        self.informer, self._informer_task = None, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if informer is not None and notify:  # their checks judge without them now
            for gone in informer.store.values():
                for handler in self.on_change:
                    handler(gone, None)

    async def stop(self) -> None:
        if self._discovering is not None:
            self._discovering.cancel()
            await asyncio.gather(self._discovering, return_exceptions=True)
        await self._stop_informer(notify=False)
