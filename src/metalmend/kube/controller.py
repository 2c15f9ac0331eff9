"""A controller: reconcile keys from a work queue with N workers.

A reconcile function takes a key ("namespace/name") and returns a Result; it knows
nothing of how keys arrive. Informer changes are mapped to keys by ``watch``.

Outcomes:
- Result with ``requeue_at``: the key runs again at that exact wall-clock deadline (or
  sooner, if something changes);
- a 409 Conflict from the API server: another writer won; the key is retried with backoff
  and it is not counted as an error; a 404 (deleted between cache and write) likewise;
- any other exception: logged with the key, counted, and retried with per-key exponential
  backoff (milliseconds growing to minutes), so a broken object never hot-loops.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lightkube import ApiError

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.kube import metrics
from metalmend.kube.informer import Informer
from metalmend.kube.store import object_key
from metalmend.kube.workqueue import Backoff, WorkQueue
from metalmend.log import fields

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    """What a reconcile asks for next: nothing, or another look at ``requeue_at``."""

    requeue_at: dt.datetime | None = None

    @classmethod
    def at(cls, deadline: dt.datetime | None) -> Result:
        return cls(requeue_at=deadline)


DONE = Result()

Reconcile = Callable[[str], Awaitable[Result]]
# Maps an informer change (old, new) to the keys of this controller it concerns.
KeyMapper = Callable[[Any | None, Any | None], Iterable[str]]


def own_key(old: Any | None, new: Any | None) -> Iterable[str]:
    obj = new if new is not None else old
    return [object_key(obj)] if obj is not None else []


class Controller:
    def __init__(
        self,
        name: str,
        reconcile: Reconcile,
        *,
        workers: int = 1,
        clock: Clock = SYSTEM_CLOCK,
        backoff: Backoff | None = None,
    ) -> None:
        self.name = name
        self.reconcile = reconcile
        self.workers = workers
        self.clock = clock
        self.queue = WorkQueue(backoff)
        self.informers: list[Informer] = []
        metrics.QUEUE_DEPTH.labels(name).set_function(lambda: len(self.queue))

    def watch(self, informer: Informer, keys: KeyMapper = own_key) -> None:
        """Reconcile ``keys(old, new)`` whenever ``informer`` sees a change."""
        self.informers.append(informer)

        def enqueue(old: Any | None, new: Any | None) -> None:
            for key in keys(old, new):
                self.queue.add(key)

        informer.add_handler(enqueue)

    def enqueue_all(self, informer: Informer, keys: KeyMapper = own_key) -> None:
        for obj in informer.store.values():
            for key in keys(None, obj):
                self.queue.add(key)

    async def run(self) -> None:
        """Run the workers until cancelled; the queue is shut down on the way out."""
        log.info("controller starting", extra=fields(controller=self.name, workers=self.workers))
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(self.workers):
                    group.create_task(self._worker())
        finally:
            self.queue.shutdown()

    async def _worker(self) -> None:
        while (key := await self.queue.get()) is not None:
            try:
                await self._process(key)
            finally:
                self.queue.done(key)

    async def _process(self, key: str) -> None:
        started = time.perf_counter()
        outcome = "success"
        try:
            result = await self.reconcile(key)
        except ApiError as error:
            if error.status.code == 409:
                outcome = "conflict"
                self.queue.add_rate_limited(key)
                log.debug("conflict, retrying", extra=fields(controller=self.name, key=key))
            elif error.status.code == 404:
                # Deleted between our cache and our write: the retry sees it gone. Said in
                # one line, not a traceback (a missing kind would say so here too).
                outcome = "not_found"
                self.queue.add_rate_limited(key)
                log.info(
                    "not found, retrying",
                    extra=fields(controller=self.name, key=key, error=str(error.status.message)),
                )
            else:
                outcome = "error"
                self._failed(key, error)
        except Exception as error:
            outcome = "error"
            self._failed(key, error)
        else:
            self.queue.forget(key)
            if result.requeue_at is not None:
                delay = (result.requeue_at - self.clock.now()).total_seconds()
                self.queue.add_after(key, delay)
        finally:
            metrics.RECONCILE_SECONDS.labels(self.name).observe(time.perf_counter() - started)
            metrics.RECONCILE_TOTAL.labels(self.name, outcome).inc()

    def _failed(self, key: str, error: Exception) -> None:
        metrics.RECONCILE_ERRORS.labels(self.name).inc()
        delay = self.queue.add_rate_limited(key)
        log.error(
            "reconcile failed",
            exc_info=error,
            extra=fields(controller=self.name, key=key, retry_in=f"{delay:.3f}s"),
        )
