"""Leader election on a coordination.k8s.io/v1 Lease, as client-go does it.

- A candidate takes the Lease when it is free, or when its record has not changed for
  ``lease_duration`` as measured by the candidate's own clock since it first saw that
  record (never by comparing our clock with the holder's timestamps, which may be skewed).
- The leader renews every ``retry_period``; if it cannot renew for ``renew_deadline`` it
  stops leading (its work is cancelled) before the lease can expire for others:
  renew_deadline < lease_duration is what keeps two leaders from overlapping.
- Every write carries the resourceVersion it read, so two candidates cannot both win.
- On a graceful stop the leader releases the Lease so a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.kube import errors, metrics
from metalmend.log import fields

log = logging.getLogger(__name__)


class LeadershipLost(RuntimeError):
    """The Lease could not be renewed within the renew deadline."""


@dataclass(frozen=True)
class LeaseTiming:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0")


class LeaderElector:
    def __init__(
        self,
        client: AsyncClient,
        name: str,
        namespace: str,
        identity: str,
        timing: LeaseTiming = LeaseTiming(),
        clock: Clock = SYSTEM_CLOCK,
        release_on_cancel: bool = True,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.client = client
        self.labels = dict(labels or {})  # kept on the Lease (a shard's ring and name)
        self.release_on_cancel = release_on_cancel
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.timing = timing
        self.clock = clock
        self.leading = False
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0  # monotonic time we first saw the current record
        self._lease: Lease | None = None

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Wait for the Lease, run ``lead()`` while holding it, release it when ``lead``
        returns or we are cancelled. Raises LeadershipLost if renewal fails in time."""
        while True:
            if await self._try_acquire_or_renew():
                break
            await asyncio.sleep(self.timing.retry_period * random.uniform(1.0, 1.2))
        self._set_leading(True)
        work = asyncio.create_task(lead())
        lost = False
        try:
            await self._renew_while(work)
        except LeadershipLost:
            lost = True
            raise
        finally:
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            self._set_leading(False)
            if not lost and self.release_on_cancel:
                await self._release()

    async def _renew_while(self, work: asyncio.Task[None]) -> None:
        last_renew = time.monotonic()
        while not work.done():
            done, _ = await asyncio.wait({work}, timeout=self.timing.retry_period)
            if done:
                work.result()  # let lead()'s own exception through
                return
            # A renewal may not outlast the renew deadline (client-go gives it a context
            # of renewDeadline): an API server that accepts the connection and never
            # answers must not keep the work running past it, towards the Lease's expiry.
            left = self.timing.renew_deadline - (time.monotonic() - last_renew)
            if await self._try_acquire_or_renew(within=max(left, 0.0)):
                last_renew = time.monotonic()
            elif time.monotonic() - last_renew >= self.timing.renew_deadline:
                raise LeadershipLost(f"could not renew lease {self.namespace}/{self.name}")

    def _set_leading(self, leading: bool) -> None:
        if leading != self.leading:
            log.info(
                "leader lease %s" % ("acquired" if leading else "given up"),
                extra=fields(lease=f"{self.namespace}/{self.name}", identity=self.identity),
            )
        self.leading = leading
        metrics.LEADER.labels(f"{self.namespace}/{self.name}").set(1 if leading else 0)

    async def _try_acquire_or_renew(self, within: float | None = None) -> bool:
        try:
            async with asyncio.timeout(within):
                return await self._acquire_or_renew()
        except TimeoutError:
            log.warning(
                "lease update failed",
                extra=fields(lease=self.name, error=f"no answer within {within:.1f}s"),
            )
            return False
        except ApiError as error:
            if not errors.is_conflict(error):
                log.warning(
                    "lease update failed",
                    extra=fields(
                        lease=self.name, error=f"{error.status.code} {error.status.message}"
                    ),
                )
            return False
        except (httpx2.HTTPError, OSError) as error:
            log.warning("lease update failed", extra=fields(lease=self.name, error=str(error)))
            return False

    async def _acquire_or_renew(self) -> bool:
        now = self.clock.now()
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as error:
            if not errors.is_not_found(error):
                raise
            spec = LeaseSpec(
                holderIdentity=self.identity,
                leaseDurationSeconds=round(self.timing.lease_duration),
                acquireTime=now,
                renewTime=now,
                leaseTransitions=0,
            )
            created = await self.client.create(
                Lease(
                    metadata=ObjectMeta(
                        name=self.name, namespace=self.namespace, labels=self.labels or None
                    ),
                    spec=spec,
                )
            )
            self._observe(created)
            return True
        self._observe(lease)
        spec = lease.spec or LeaseSpec()
        holder = spec.holderIdentity or ""
        expires = self._observed_at + (spec.leaseDurationSeconds or self.timing.lease_duration)
        if holder and holder != self.identity and time.monotonic() < expires:
            return False
        ours = holder == self.identity
        lease.spec = LeaseSpec(
            holderIdentity=self.identity,
            leaseDurationSeconds=round(self.timing.lease_duration),
            acquireTime=spec.acquireTime if ours else now,
            renewTime=now,
            leaseTransitions=(spec.leaseTransitions or 0) + (0 if ours or not holder else 1),
        )
        if self.labels and lease.metadata is not None:
            lease.metadata.labels = {**(lease.metadata.labels or {}), **self.labels}
        # replace() sends metadata.resourceVersion: a concurrent writer makes this a 409.
        self._observe(await self.client.replace(lease))
        return True

    def _observe(self, lease: Lease) -> None:
        spec = lease.spec or LeaseSpec()
        record = (spec.holderIdentity, spec.renewTime, spec.leaseTransitions)
        if record != self._observed:
            self._observed = record
            self._observed_at = time.monotonic()
        self._lease = lease

    async def _release(self) -> None:
        """Hand the Lease back (empty holder) so a standby need not wait for expiry."""
        lease = self._lease
        if lease is None or lease.spec is None or lease.spec.holderIdentity != self.identity:
            return
        try:
            # Bounded: a silent API server must not hold a stopping process (its Lease
            # then expires as if it had been killed).
            async with asyncio.timeout(self.timing.retry_period):
                try:
                    await self.client.replace(self._released(lease))
                except ApiError as error:
                    # A renewal our stop interrupted may have landed after we last read
                    # the Lease: read it again, and release it if it is still ours.
                    if not errors.is_conflict(error):
                        raise
                    lease = await self.client.get(Lease, self.name, namespace=self.namespace)
                    if lease.spec is None or lease.spec.holderIdentity != self.identity:
                        return
                    await self.client.replace(self._released(lease))
        except TimeoutError:
            log.warning("could not release lease", extra=fields(lease=self.name, error="no answer"))
        except (ApiError, httpx2.HTTPError, OSError) as error:
            log.warning("could not release lease", extra=fields(lease=self.name, error=str(error)))

    def _released(self, lease: Lease) -> Lease:
        transitions = lease.spec.leaseTransitions if lease.spec is not None else None
        lease.spec = LeaseSpec(
            leaseDurationSeconds=1, renewTime=self.clock.now(), leaseTransitions=transitions
        )
        return lease
