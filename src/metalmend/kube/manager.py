"""The manager: shared informers, controllers, leader election and the health endpoints.

Start-up order: informers list and watch (on every replica, so a standby's cache is warm);
once every informer has synced, /readyz turns true and, when this replica leads (or
leader election is off), the controllers start. Losing the lease cancels the controllers
at once and ends ``run`` with LeadershipLost: the process exits and restarts as a
candidate, with no state carried over from the term it lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightkube import AsyncClient

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.kube.controller import Controller
from metalmend.kube.events import EventRecorder
from metalmend.kube.informer import Informer
from metalmend.kube.leader import LeaderElector, LeaseTiming
from metalmend.kube.store import IndexFunc
from metalmend.log import fields

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaderElection:
    lease_name: str = "metalmend"
    namespace: str = "default"
    identity: str = ""
    timing: LeaseTiming = field(default_factory=LeaseTiming)
    release_on_cancel: bool = True


class Manager:
    def __init__(
        self,
        client: AsyncClient,
        *,
        leader_election: LeaderElection | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.client = client
        self.clock = clock
        self.leader_election = leader_election
        self.events = EventRecorder(client, clock=clock)
        self.informers: dict[tuple[Any, ...], Informer] = {}
        self.controllers: list[Controller] = []
        self.elector: LeaderElector | None = None
        self.controllers_running = False

    def informer(
        self,
        resource: Any,
        *,
        namespace: str | None = None,
        labels: dict[str, Any] | None = None,
        indexes: Mapping[str, IndexFunc] | None = None,
    ) -> Informer:
        """The shared informer for this kind and scope (created on first request)."""
        key = (resource, namespace, tuple(sorted((labels or {}).items())))
        informer = self.informers.get(key)
        if informer is None:
            informer = Informer(
                self.client, resource, namespace=namespace, labels=labels, indexes=indexes
            )
            self.informers[key] = informer
        else:
            for name, func in (indexes or {}).items():
                informer.store.add_index(name, func)
        return informer

    def add(self, controller: Controller) -> Controller:
        self.controllers.append(controller)
        return controller

    # ---- state for /readyz --------------------------------------------------------------

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers.values())

    def unsynced(self) -> list[str]:
        return [
            i.last_error or f"{i.name}: not synced yet"
            for i in self.informers.values()
            if not i.synced.is_set()
        ]

    # ---- running ------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until cancelled (or, with leader election, until the lease is lost)."""
        informers = [
            asyncio.create_task(i.run(), name=f"informer {i.name}") for i in self.informers.values()
        ]
        main = asyncio.create_task(self._sync_then_lead(), name="manager")
        try:
            done, _ = await asyncio.wait([main, *informers], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # LeadershipLost, or a bug in an informer, ends the manager
        finally:
            for task in (main, *informers):
                task.cancel()
            await asyncio.gather(main, *informers, return_exceptions=True)

    async def _sync_then_lead(self) -> None:
        await self.wait_synced()
        log.info("caches synced", extra=fields(informers=len(self.informers)))
        if self.leader_election is None:
            await self._run_controllers()
            return
        election = self.leader_election
        self.elector = LeaderElector(
            self.client,
            election.lease_name,
            election.namespace,
            election.identity,
            election.timing,
            self.clock,
            release_on_cancel=election.release_on_cancel,
        )
        await self.elector.run(self._run_controllers)

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers.values()))

    async def _run_controllers(self) -> None:
        self.controllers_running = True
        try:
            async with asyncio.TaskGroup() as group:
                for controller in self.controllers:
                    group.create_task(controller.run(), name=f"controller {controller.name}")
                if not self.controllers:
                    await asyncio.Event().wait()  # nothing to run: hold the lease until stopped
        finally:
            self.controllers_running = False
