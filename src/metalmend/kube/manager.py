"""The manager: shared informers, controllers, leader election and the health endpoints.

Start-up order: informers list and watch; once they have synced and this replica leads (or
leader election is off), the controllers start.

Which caches a replica fills before it leads (``early_informers``):

- without sharding, all of them: a standby has no other work, and its warm cache is what
  lets it take over within a Lease's duration;
- with sharding (docs/sharding.md), only what every replica works on: the caches its
  sharded controllers watch (its own hosts, their BMC Secrets) and those asked for with
  ``standby=True`` (the sharder's hosts and shard Leases, which a new leader needs at
  once, and whose expiries a replica counts from when it saw them change). What only the
  leader's controllers read (Nodes, Machines, health checks, remediation kinds) is listed
  when this replica leads, before those controllers start. Otherwise every replica would
  keep, and parse every change of, the whole fleet's Nodes and Machines: a floor of CPU
  and memory that does not shrink as replicas are added.

What the health endpoints mean (kube/health.py serves them):

- ready (/readyz): this replica is doing metalmend's work right now: its caches are
  synced, its controllers run (it holds the lease, or leader election is off), the API
  server answers its watches and serves every kind they watch (a CRD deleted under a
  running replica is named, with the fix: Informer.unserved), and no controller's
  reconciles have all raised for a while (``Controller.failing``: a controller that only
  raises does no work, whatever else is fine; one error does not flap readiness). A
  standby is *not* ready: it does no work, and a Service or an operator reading "2/2
  ready" would otherwise believe two replicas reconcile. (A Deployment with a standby
  therefore shows 1/2 ready; roll it out with maxUnavailable of at least 1, or surge, so
  a rollout does not wait for a standby to become ready.)
- live (/healthz): the process can still do its work if it leads: no controller worker
  died, and the API server has not been out of reach (or silent) for longer than
  ``api_lost_after``
  (kubelet restarts it: a fresh connection, DNS lookup and credentials). A standby that can
  reach the API server is live.
 Losing the lease cancels the controllers
at once and ends ``run`` with LeadershipLost: the process exits and restarts as a
candidate, with no state carried over from the term it lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx2
from lightkube import AsyncClient

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.kube.controller import Controller
from metalmend.kube.events import EventRecorder
from metalmend.kube.informer import Informer
from metalmend.kube.leader import LeaderElector, LeaseTiming
from metalmend.kube.shards import Sharding
from metalmend.kube.store import IndexFunc
from metalmend.kube.union import UnionInformer
from metalmend.log import fields

log = logging.getLogger(__name__)

API_LOST_AFTER = 60.0  # seconds the API server may be out of reach before /healthz fails
# The readiness probe of the API server: kubelet's readiness probe of run (every 5 s in the
# chart) sees a frozen API server within about interval + deadline; a loaded API server
# answers /readyz within milliseconds, so 3 s of silence is not load.
API_PROBE_INTERVAL = 2.0
API_PROBE_DEADLINE = 3.0


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
        sharding: Sharding | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.client = client
        self.clock = clock
        self.leader_election = leader_election
        # With sharding, controllers added with ``sharded=True`` run on every replica while
        # it holds its own shard Lease (kube/shards.py); the others only on the leader.
        self.sharding = sharding
        self.sharded_controllers: list[Controller] = []
        self.shard_elector: LeaderElector | None = None
        self.sharded_running = False
        self.events = EventRecorder(client, clock=clock)
        self.informers: dict[tuple[Any, ...], Informer] = {}
        self.controllers: list[Controller] = []
        self.elector: LeaderElector | None = None
        self.controllers_running = False
        self.api_lost_after = API_LOST_AFTER
        self.api_probe_interval = API_PROBE_INTERVAL
        self.api_probe_deadline = API_PROBE_DEADLINE
        # time.monotonic() of the first failed probe since the last answer, and why.
        self.api_silent_since: float | None = None
        self.api_silence = ""
        self._on_stop: list[Callable[[], Awaitable[None]]] = []
        self._shared: dict[str, Any] = {}
        self._standby: set[tuple[Any, ...]] = set()  # keys of informers asked standby=True
        self._late: list[Informer] = []  # informers started when this replica led
        # Set once the informers started on leadership have synced (never without sharding,
        # where there are none): runner.freeze_when_synced freezes what they hold.
        self.late_synced = asyncio.Event()

    def shared(self, name: str, make: Callable[[], Any]) -> Any:
        """One object per ``name`` for all the controllers of this manager, made by
        ``make`` on first request (the BMC pool: one set of per-BMC slots and deadlines
        whoever reads or commands a BMC)."""
        if name not in self._shared:
            self._shared[name] = make()
        return self._shared[name]

    def informer(
        self,
        resource: Any,
        *,
        namespace: str | None = None,
        labels: dict[str, Any] | None = None,
        indexes: Mapping[str, IndexFunc] | None = None,
        standby: bool = False,
    ) -> Informer:
        """The shared informer for this kind and scope (created on first request).
        ``standby``: with sharding, keep it filled on a replica that does not lead, even if
        no sharded controller watches it (see the module docstring)."""
        key = (resource, namespace, tuple(sorted((labels or {}).items())))
        if standby:
            self._standby.add(key)
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

    def add(self, controller: Controller, *, sharded: bool = False) -> Controller:
        """Run ``controller`` with the others; ``sharded`` (only with ``sharding``): on
        every replica, over the objects assigned to it, while it holds its shard Lease. A
        sharded controller reads only caches it watches (or asked for with ``standby``):
        the others are empty on a replica that does not lead."""
        if sharded and self.sharding is not None:
            self.sharded_controllers.append(controller)
        else:
            self.controllers.append(controller)
        return controller

    @property
    def all_controllers(self) -> list[Controller]:
        return [*self.controllers, *self.sharded_controllers]

    def early_informers(self) -> list[Informer]:
        """The informers this replica runs from the start, whether or not it leads (the
        module docstring says which, and why)."""
        if self.sharding is None:
            return list(self.informers.values())
        kept = {id(self.informers[key]) for key in self._standby}
        for controller in self.sharded_controllers:
            kept.update(id(i) for watched in controller.informers for i in _members(watched))
        return [i for i in self.informers.values() if id(i) in kept]

    @staticmethod
    def watches_only(controller: Controller, informers: set[int]) -> bool:
        """Whether every cache ``controller`` watches is among ``informers`` (by id)."""
        return all(id(i) in informers for w in controller.informers for i in _members(w))

    def running_informers(self) -> list[Informer]:
        """The informers this replica runs now, or will before it does any work."""
        return [*self.early_informers(), *self._late]

    # ---- state for /readyz and /healthz -------------------------------------------------

    def not_ready(self) -> list[str]:
        """Why this replica is not ready (empty: ready). See the module docstring."""
        problems = self.unsynced()
        problems += [i.unserved for i in self.informers.values() if i.unserved]
        problems += [
            f"API server out of reach: {i.last_error or i.name}"
            for i in self.informers.values()
            if i.failing_since is not None
        ]
        if self.controllers_running:
            problems += [p for c in self.controllers if (p := c.failing())]
        if self.api_silent_since is not None:
            problems.append(f"API server not answering: {self.api_silence}")
        if not problems and self.sharding is not None:
            # Every replica works on its own hosts: ready once it holds its shard Lease.
            if not self.sharded_running:
                problems.append(
                    f"waiting for the shard lease {self.sharding.namespace}/"
                    f"{self.sharding.lease_name}"
                )
            return problems
        if not problems and not self.controllers_running:
            if self.leader_election is not None:
                problems.append(
                    f"standby: waiting for the lease {self.leader_election.namespace}/"
                    f"{self.leader_election.lease_name}; another replica does the work"
                )
            else:
                problems.append("controllers not running")
        return problems

    def not_live(self) -> list[str]:
        """Why this process should be restarted (empty: live)."""
        problems = [c.died for c in self.all_controllers if c.died]
        now = time.monotonic()
        for informer in self.informers.values():
            since = informer.failing_since
            if since is not None and now - since > self.api_lost_after:
                problems.append(
                    f"API server out of reach for {now - since:.0f}s:"
                    f" {informer.last_error or informer.name}"
                )
        since = self.api_silent_since
        if since is not None and now - since > self.api_lost_after:
            problems.append(f"API server not answering for {now - since:.0f}s: {self.api_silence}")
        return problems

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.running_informers())

    def unsynced(self) -> list[str]:
        return [
            i.last_error or f"{i.name}: not synced yet"
            for i in self.running_informers()
            if not i.synced.is_set()
        ]

    # ---- running ------------------------------------------------------------------------

    def on_stop(self, cleanup: Callable[[], Awaitable[None]]) -> None:
        """Await ``cleanup`` when ``run`` ends (close BMC sessions, stop helper processes)."""
        self._on_stop.append(cleanup)

    async def run(self) -> None:
        """Run until cancelled (or, with leader election, until the lease is lost)."""
        informers = [
            asyncio.create_task(i.run(), name=f"informer {i.name}") for i in self.early_informers()
        ]
        main = asyncio.create_task(self._sync_then_lead(), name="manager")
        informers.append(asyncio.create_task(self._probe_api_forever(), name="api probe"))
        try:
            done, _ = await asyncio.wait([main, *informers], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # LeadershipLost, or a bug in an informer, ends the manager
        finally:
            for task in (main, *informers):
                task.cancel()
            await asyncio.gather(main, *informers, return_exceptions=True)
            for cleanup in self._on_stop:
                try:
                    await cleanup()
                except Exception as error:  # a cleanup must not hide why run ended
                    log.warning("clean-up failed", extra=fields(error=str(error)))

    async def _probe_api_forever(self) -> None:
        while True:
            problem = await self.probe_api()
            if problem is None:
                self.api_silent_since = None
            else:
                if self.api_silent_since is None:
                    self.api_silent_since = time.monotonic()
                    log.warning("API server not answering", extra=fields(error=problem))
                self.api_silence = problem
            await asyncio.sleep(self.api_probe_interval)

    async def probe_api(self) -> str | None:
        """Ask the API server's ``/readyz`` (allowed to every caller by the default
        ``system:public-info-viewer`` role) within ``api_probe_deadline``; None when it
        answered 200, else why not, in one line."""
        http: Any = self.client._client._client  # lightkube's HTTP client: its auth, its TLS
        try:
            async with asyncio.timeout(self.api_probe_deadline):
                answer = await http.get("/readyz", timeout=self.api_probe_deadline)
        except TimeoutError:
            return f"/readyz did not answer within {self.api_probe_deadline:g}s"
        except (httpx2.HTTPError, OSError) as error:
            text = " ".join(str(error).split()) or type(error).__name__
            return f"/readyz: {type(error).__name__}: {text}"
        if answer.status_code != 200:
            first = (answer.text.strip().splitlines() or [""])[-1][:200]
            return f"/readyz answered {answer.status_code} {first}".rstrip()
        return None

    async def _sync_then_lead(self) -> None:
        await self.wait_synced()
        log.info("caches synced", extra=fields(informers=len(self.early_informers())))
        if self.sharding is not None:
            # Both Leases at once; losing either ends run (LeadershipLost): the process
            # restarts with nothing carried over.
            # (Not a TaskGroup: the caller expects LeadershipLost itself, not a group.)
            tasks = [
                asyncio.create_task(self._shard(self.sharding), name="shard"),
                asyncio.create_task(self._lead(), name="lead"),
            ]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            return
        await self._lead()

    async def _shard(self, sharding: Sharding) -> None:
        self.shard_elector = LeaderElector(
            self.client,
            sharding.lease_name,
            sharding.namespace,
            sharding.identity,
            sharding.timing,
            self.clock,
            labels=sharding.lease_labels,
        )
        await self.shard_elector.run(self._run_sharded)

    async def _run_sharded(self) -> None:
        self.sharded_running = True
        try:
            async with asyncio.TaskGroup() as group:
                for controller in self.sharded_controllers:
                    group.create_task(controller.run(), name=f"controller {controller.name}")
                if not self.sharded_controllers:
                    await asyncio.Event().wait()  # hold the shard lease until stopped
        finally:
            self.sharded_running = False

    async def _lead(self) -> None:
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
        """Until the informers this replica runs from the start have synced."""
        await asyncio.gather(*(i.synced.wait() for i in self.early_informers()))

    async def _run_controllers(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                filled = {id(i) for i in self.running_informers()}
                late = [i for i in self.informers.values() if id(i) not in filled]
                # The caches only the leader's controllers read are listed now (an informer
                # that fails here ends the term, as one would in ``run``). A controller that
                # watches only caches already filled starts at once: the sharder, which
                # hands a dead leader's hosts over, does not wait for the fleet's Nodes.
                self._late.extend(late)
                for informer in late:
                    group.create_task(informer.run(), name=f"informer {informer.name}")
                now = [c for c in self.controllers if self.watches_only(c, filled)]
                later = [c for c in self.controllers if c not in now]
                self.controllers_running = True
                for controller in now:
                    group.create_task(controller.run(), name=f"controller {controller.name}")
                if late:
                    await asyncio.gather(*(i.synced.wait() for i in late))
                    log.info("leader's caches synced", extra=fields(informers=len(late)))
                    self.late_synced.set()
                for controller in later:
                    group.create_task(controller.run(), name=f"controller {controller.name}")
                if not self.controllers:
                    await asyncio.Event().wait()  # nothing to run: hold the lease until stopped
        finally:
            self.controllers_running = False


def _members(watched: Informer | UnionInformer) -> tuple[Informer, ...]:
    return watched.informers if isinstance(watched, UnionInformer) else (watched,)
