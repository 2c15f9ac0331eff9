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

Thread calls: a job's database calls run in threads (``in_thread``, as
``asyncio.to_thread``). Cancelling a job (``stop()``, a lost lease) stops its waiting at
once, but a thread cannot be cancelled: ``stop()`` waits for the job's calls still in
flight, so that none of them writes or logs after the worker said it stopped (and serve
closed the database, or a test its logging).

The database unavailable (``DatabaseUnavailable``: said once per outage by
``metalmend.db``, never a traceback here): the scan backs off (doubling up to
``MAX_BACKOFF_SECONDS``), a job that could not write stops quietly and is taken again, by
its own lease, once the database answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime as dt
import functools
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.db import DatabaseUnavailable
from metalmend.db.lease import LeaseLost, Leases
from metalmend.log import fields

log = logging.getLogger(__name__)

__all__ = ["LeaseLost", "LeasedWorker", "in_thread", "replica_name"]

MAX_BACKOFF_SECONDS = 30.0  # the longest wait between looks while the database is away

T = TypeVar("T")
ThreadCalls = set["asyncio.Future[Any]"]
# The thread calls of the worker whose job (or scan, or renewal) is running in this task.
_CALLS: contextvars.ContextVar[ThreadCalls | None] = contextvars.ContextVar(
    "metalmend_leased_calls", default=None
)


async def in_thread(fn: Callable[..., T], /, *args: Any) -> T:
    """``fn(*args)`` in a thread, as ``asyncio.to_thread``; inside a leased worker's job, a
    call its ``stop()`` waits for (module docstring). Elsewhere (a request handler) the
    same as ``asyncio.to_thread``."""
    calls = _CALLS.get()
    if calls is None:
        return await asyncio.to_thread(fn, *args)
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    future: asyncio.Future[T] = loop.run_in_executor(None, call)
    calls.add(future)
    future.add_done_callback(functools.partial(_ended, calls))
    return await asyncio.shield(future)


def _ended(calls: ThreadCalls, future: asyncio.Future[Any]) -> None:
    calls.discard(future)
    if not future.cancelled():
        future.exception()  # its caller may have stopped waiting: not "never retrieved"


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
        self._renewals: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None
        self._calls: ThreadCalls = set()  # thread calls in flight (in_thread)

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
        (or this one, started again) continues them. Returns once their thread calls in
        flight have ended too (module docstring)."""
        work = [t for t in (self._loop, *self._running.values()) if t is not None]
        for task in work:
            task.cancel()
        for task in (*work, *self._renewals):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._calls:
            await asyncio.wait(set(self._calls))
        self._loop = None

    async def _scan_forever(self) -> None:
        _CALLS.set(self._calls)  # this task's context: the jobs it starts inherit it
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
        for job in await self._in_thread(self.leases.runnable, now):
            if job in self._running:
                continue
            until = now + dt.timedelta(seconds=self.lease_seconds)
            if await self._in_thread(self.leases.take, job, self.owner, now, until):
                log.info(f"{self.kind}: taken", extra=fields(job=job, owner=self.owner))
                self._running[job] = asyncio.create_task(self._run(job), name=f"{self.kind} {job}")

    async def _in_thread(self, fn: Callable[..., T], /, *args: Any) -> T:
        token = _CALLS.set(self._calls)
        try:
            return await in_thread(fn, *args)
        finally:
            _CALLS.reset(token)

    async def _run(self, job: str) -> None:
        _CALLS.set(self._calls)  # the job's own task: its calls, and its renewals'
        renewing = asyncio.create_task(self._renew(job, asyncio.current_task()))
        self._renewals.add(renewing)
        renewing.add_done_callback(self._renewals.discard)
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
                held = await in_thread(self.leases.renew, job, self.owner, until)
            except DatabaseUnavailable:  # said once: keep going until the lease runs out
                continue
            except Exception:
                log.exception("%s: cannot renew the lease of %s", self.kind, job)
                continue
            if not held and run is not None:
                log.warning("%s: lease of %s lost; stopping it here", self.kind, job)
                run.cancel()
                return
