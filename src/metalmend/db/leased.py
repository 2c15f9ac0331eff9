"""``LeasedWorker``: runs the stored jobs of one kind (Drydock tasks, Shipyard actions) in
``metalmend serve``, each in one replica at a time (``metalmend.db.lease``).

Started from the application's lifespan, it looks for jobs every ``scan_seconds`` (and at
once when woken: a job was just stored), takes each runnable one with a conditional
UPDATE and runs it as an asyncio task, renewing the lease every third of ``lease_seconds``.
A replica that loses a lease cancels that job at once (its writes are conditional on the
lease too); a replica killed mid-job leaves its lease to expire, and the next one to look
(itself, restarted, or another) takes the job and continues from what the job stored.
What a job does is the caller's ``run(job_id)``; it raises ``LeaseLost`` when a
conditional write finds the lease gone.

The database unavailable (``DatabaseUnavailable``: said once per outage by
``metalmend.db``, never a traceback here): the scan backs off (doubling up to
``MAX_BACKOFF_SECONDS``), a job that could not write stops quietly and is taken again, by
its own lease, once the database answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.db import DatabaseUnavailable
from metalmend.db.lease import LeaseLost, Leases
from metalmend.log import fields

log = logging.getLogger(__name__)

__all__ = ["LeaseLost", "LeasedWorker", "replica_name"]

MAX_BACKOFF_SECONDS = 30.0  # the longest wait between looks while the database is away


def replica_name() -> str:
    """Who holds a lease: host, process and a random part (a pid can be reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeasedWorker:
    def __init__(
        self,
        kind: str,
        leases: Leases,
        run: Callable[[str], Awaitable[None]],
        lease_seconds: float,
        *,
        scan_seconds: float = 2.0,
        clock: Clock = SYSTEM_CLOCK,
        owner: str | None = None,
    ) -> None:
        self.kind, self.leases, self.run = kind, leases, run
        self.lease_seconds, self.scan_seconds, self.clock = lease_seconds, scan_seconds, clock
        self.owner = owner or replica_name()
        self._wake = asyncio.Event()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.create_task(self._scan_forever(), name=f"{self.kind}-worker")

    def wake(self) -> None:
        self._wake.set()

    @property
    def running(self) -> frozenset[str]:
        return frozenset(self._running)

    async def stop(self) -> None:
        """Stop looking and stop every job run here; their leases expire and a replica
        (or this one, started again) continues them."""
        work = [t for t in (self._loop, *self._running.values()) if t is not None]
        for task in work:
            task.cancel()
        for task in work:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._loop = None

    async def _scan_forever(self) -> None:
        wait = self.scan_seconds
        while True:
            try:
                await self.scan()
                wait = self.scan_seconds
            except DatabaseUnavailable:  # said once by metalmend.db: look again later
                wait = min(wait * 2, max(MAX_BACKOFF_SECONDS, self.scan_seconds))
            except Exception:
                log.exception("%s: cannot look for work", self.kind)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            self._wake.clear()

    async def scan(self) -> None:
        now = self.clock.now()
        for job in await asyncio.to_thread(self.leases.runnable, now):
            if job in self._running:
                continue
            until = now + dt.timedelta(seconds=self.lease_seconds)
            if await asyncio.to_thread(self.leases.take, job, self.owner, now, until):
                log.info(f"{self.kind}: taken", extra=fields(job=job, owner=self.owner))
                self._running[job] = asyncio.create_task(self._run(job), name=f"{self.kind} {job}")

    async def _run(self, job: str) -> None:
        renewing = asyncio.create_task(self._renew(job, asyncio.current_task()))
        try:
            await self.run(job)
        except (LeaseLost, asyncio.CancelledError):
            log.info(f"{self.kind}: left to another replica", extra=fields(job=job))
        except DatabaseUnavailable:
            log.debug(f"{self.kind}: paused until the database answers", extra=fields(job=job))
        except Exception:
            log.exception("%s: %s stopped; its lease expires and it is taken again", self.kind, job)
        finally:
            renewing.cancel()
            self._running.pop(job, None)

    async def _renew(self, job: str, run: asyncio.Task[object] | None) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            until = self.clock.now() + dt.timedelta(seconds=self.lease_seconds)
            try:
                held = await asyncio.to_thread(self.leases.renew, job, self.owner, until)
            except DatabaseUnavailable:  # said once: keep going until the lease runs out
                continue
            except Exception:
                log.exception("%s: cannot renew the lease of %s", self.kind, job)
                continue
            if not held and run is not None:
                log.warning("%s: lease of %s lost; stopping it here", self.kind, job)
                run.cancel()
                return
