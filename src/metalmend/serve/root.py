"""The composition root of ``metalmend serve`` (as Drydock's ``start_api(state_manager,
ingester, orchestrator)``): every component's store, worker and dependencies are built
here, once, in one place, and passed in, typed; the application (``serve/app.py``) only
mounts the routers over what it is given and starts and stops the workers.

``from_settings`` passes the settings (section ``serve`` checked and read by
``serve/settings.py``) to ``compose``; tests call ``compose`` with the parts they need. Without a
database there is no task or action store (their endpoints answer 503); without a BMC
pool there is no destroy task (Drydock answers 503, and Shipyard too: its redeploy runs
destroy tasks).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from lightkube import AsyncClient

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.db import Database
from metalmend.designs.store import DesignStore
from metalmend.destroy.destroy import DestroyNodes, DrivePool
from metalmend.destroy.policy.destroy import DestroySettings
from metalmend.destroy.routes import Drydock
from metalmend.destroy.store import TaskStore
from metalmend.destroy.worker import TaskWorker
from metalmend.kube import impersonate
from metalmend.kube.events import EventRecorder
from metalmend.serve.settings import ServeParts
from metalmend.settings import Settings
from metalmend.siteactions.policy.redeploy import RedeploySettings
from metalmend.siteactions.redeploy import FIELD_MANAGER
from metalmend.siteactions.routes import Shipyard
from metalmend.siteactions.steps import SiteServices
from metalmend.siteactions.store import ActionStore
from metalmend.siteactions.worker import ActionWorker
from metalmend.teardown.drain import Drainer
from metalmend.teardown.etcd.routes import EtcdAccess
from metalmend.teardown.interlock import Interlock
from metalmend.teardown.policy.settings import TeardownSettings
from metalmend.teardown.shutdown import KubeletShutdown
from metalmend.web import auth
from metalmend.web.auth import Gate
from metalmend.web.bodies import BodyLimits


@dataclass
class Services:
    """What the endpoints reach by type (``metalmend.web.deps``), built once."""

    client: AsyncClient
    gate: Gate
    drainer: Drainer
    kubelet: KubeletShutdown
    interlock: Interlock  # the teardown claim on a Node's host (docs/design.md, invariant 7)
    # Design revisions, tasks (docs/design-store.md), upgraded before serving; None only
    # in tests of other endpoints: the store's endpoints then answer 503 (serve/app.py).
    database: Database | None = None
    bodies: BodyLimits = field(default_factory=BodyLimits)  # web.bodies
    design_gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    # Allowed design URLs and etcd credentials Secrets (serve settings; none by default)
    etcd_access: EtcdAccess = field(default_factory=EtcdAccess)


@dataclass
class Root:
    """Everything ``metalmend serve`` serves with: the shared services, Drydock's task
    store and worker (docs/destroy.md), Shipyard's action store and worker
    (docs/site-actions.md); None where the application was built without them."""

    services: Services
    drydock: Drydock | None
    shipyard: Shipyard | None

    def start(self) -> None:
        """Start the workers (the application's lifespan)."""
        if self.drydock is not None:
            self.drydock.worker.start()
        if self.shipyard is not None:
            self.shipyard.worker.start()

    async def stop(self) -> None:
        """Stop the workers, the action worker first (its steps wait on destroy tasks)."""
        if self.shipyard is not None:
            await self.shipyard.worker.stop()
        if self.drydock is not None:
            await self.drydock.worker.stop()


def from_settings(
    settings: Settings,
    parts: ServeParts,
    client: AsyncClient,
    database: Database,
    drives: DrivePool,
) -> Root:
    """The root of a ``metalmend serve`` run: ``parts`` is section ``serve`` checked and
    read (``metalmend.serve.settings.read``), the other sections are taken as they are."""
    return compose(
        client,
        settings.teardown,
        database=database,
        drives=drives,
        destroy=settings.destroy,
        redeploy=settings.redeploy,
        site_namespaces=parts.site_namespaces,
        limits=parts.limits,
        etcd_access=parts.etcd_access,
        bodies=parts.bodies,
        site_label_prefixes=parts.site_label_prefixes,
    )


def compose(
    client: AsyncClient,
    teardown: TeardownSettings | None = None,
    *,
    database: Database | None = None,
    drives: DrivePool | None = None,
    destroy: DestroySettings | None = None,
    redeploy: RedeploySettings | None = None,
    site_namespaces: tuple[str, ...] = (),
    limits: auth.Limits | None = None,
    etcd_access: EtcdAccess | None = None,
    bodies: BodyLimits | None = None,
    site_label_prefixes: tuple[str, ...] = (),
    clock: Clock = SYSTEM_CLOCK,
) -> Root:
    """Build every service, store and worker of ``metalmend serve``, once."""
    teardown = teardown or TeardownSettings()
    destroy = destroy or DestroySettings()
    services = Services(
        client=client,
        gate=Gate(client, limits),
        drainer=Drainer(client, teardown),
        kubelet=KubeletShutdown(client, teardown),
        interlock=Interlock(client),
        database=database,
        bodies=bodies or BodyLimits(),
        etcd_access=etcd_access or EtcdAccess(),
    )
    drydock = _drydock(services, drives, destroy, clock)
    shipyard = None
    if drydock is not None:  # site actions run destroy tasks (redeploy_server)
        shipyard = _shipyard(
            services, drydock, teardown, destroy, redeploy or RedeploySettings(),
            site_namespaces, site_label_prefixes, clock,
        )  # fmt: skip
    return Root(services, drydock, shipyard)


def _drydock(
    services: Services, drives: DrivePool | None, settings: DestroySettings, clock: Clock
) -> Drydock | None:
    """The task store and worker (docs/destroy.md); none without a database or BMCs."""
    if services.database is None or drives is None:
        return None
    store = TaskStore(services.database)
    destroys = DestroyNodes(
        services.client, drives, services.interlock,
        EventRecorder(services.client, component="metalmend-serve"), settings, clock,
    )  # fmt: skip
    worker = TaskWorker(store, destroys, settings, clock)
    return Drydock(store, worker, services.interlock, clock)


def _shipyard(
    services: Services,
    drydock: Drydock,
    teardown: TeardownSettings,
    destroy: DestroySettings,
    redeploy: RedeploySettings,
    namespaces: tuple[str, ...],
    label_prefixes: tuple[str, ...],
    clock: Clock,
) -> Shipyard | None:
    """The action store and worker, and what the steps are given (``siteactions.steps``)."""
    if services.database is None:
        return None
    steps = SiteServices(
        client=services.client, design_store=DesignStore(services.database),
        task_store=drydock.store, task_worker=drydock.worker, interlock=services.interlock,
        events=EventRecorder(services.client, component="metalmend-shipyard"),
        drainer=services.drainer, kubelet=services.kubelet, teardown=teardown,
        clock=clock, redeploy=redeploy, site_namespaces=namespaces,
        etcd_credentials_secrets=services.etcd_access.etcd_credentials_secrets,
        site_label_prefixes=label_prefixes, gate=services.gate,
        impersonate=impersonate.impersonator(services.client, FIELD_MANAGER),
    )  # fmt: skip
    store = ActionStore(services.database)
    worker = ActionWorker(store, steps, destroy.lease_seconds)
    return Shipyard(store, worker, namespaces, label_prefixes=label_prefixes)
