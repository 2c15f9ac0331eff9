"""A controller: reconcile keys from a work queue with N workers.

A reconcile function takes a key ("namespace/name") and returns a Result; it knows
nothing of how keys arrive. Informer changes are mapped to keys by ``watch``.

Outcomes:
- Result with ``requeue_at``: the key runs again at that exact wall-clock deadline (or
  sooner, if something changes);
- a 409 Conflict from the API server: another writer won; the key is retried with backoff
  and it is not counted as an error; a 404 (deleted between cache and write) likewise;
- a transport error or a 5xx from the API server (it restarts, a connection drops): one
  log line with the cause, retried with backoff like any error;
- ``TerminalError``: the object itself is wrong (a malformed spec) and no retry can fix
  it: one warning line (not repeated while the same key keeps failing the same way),
  counted as outcome ``terminal``, and *not* retried; the key runs again when something
  it watches changes (an operator fixing the spec), like any other key. The reconcile
  says so on the object (a condition, an Event) before raising: the runtime knows no
  kind's conditions;
- any other exception: logged with the key and its traceback, counted, and retried with
  per-key exponential backoff (milliseconds growing to minutes), so a broken object never
  hot-loops.

A controller whose reconciles all raise is not doing its work, and /readyz says so
(``Controller.failing``, read by the manager): once at least ``FAILING_COUNT`` reconciles
in a row have raised over at least ``FAILING_AFTER`` seconds, with no reconcile in
between that ended otherwise (``FailureStreak``). One error, or a burst that a retry
absorbs, never shows; a broken object among healthy ones neither (their reconciles end
the streak), since restarting the replica would not fix it. A passing API server problem
(``transient``) neither counts nor ends a streak: the informers and the API probe report
those themselves.

A reconcile may name its outcome (``Result.outcome``) for /metrics: a reconcile that ended
in a BMC error returned normally (it reported the error on the object) but is counted as
``bmc_error``, not ``success``.

Watches may take a predicate: host-power ignores updates that changed only status (its
own writes among them), so that its own status patches never re-run the key.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx2
from lightkube import ApiError

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.kube import errors, metrics
from metalmend.kube.informer import Informer
from metalmend.kube.store import object_key
from metalmend.kube.union import UnionInformer
from metalmend.kube.workqueue import Backoff, WorkQueue
from metalmend.log import fields

log = logging.getLogger(__name__)

FAILING_AFTER = 30.0
"""Seconds a controller's reconciles must keep raising before /readyz says so: longer
than a retry of a passing failure (milliseconds to seconds), shorter than anyone would
wait on a reboot that never comes."""
FAILING_COUNT = 5  # ... and at least this many in a row
_SHOWN_CHARS = 200  # of an exception's message in /readyz

_TERMINAL_REMEMBERED = 4096  # keys whose TerminalError was logged (a deleted key's stays)
BACKGROUND_AFTER = 5.0
"""A reconcile's requeue at least this many seconds ahead is queued in the background
(``WorkQueue``): host-power's idle poll (20 s), a health check's next expiry. Sooner ones
(a power change landing: 0.1-1 s; a busy BMC: 0.1 s) go with the changes."""


@dataclass(frozen=True)
class Result:
    """What a reconcile asks for next: nothing, or another look at ``requeue_at``."""

    requeue_at: dt.datetime | None = None
    outcome: str | None = None  # for /metrics; None: "success"
    # The attempt did nothing (a busy BMC): the key keeps the priority it was handed out
    # with, however soon ``requeue_at`` is, so a background poll stays in the background.
    same_priority: bool = False

    @classmethod
    def at(
        cls, deadline: dt.datetime | None, outcome: str | None = None, same_priority: bool = False
    ) -> Result:
        return cls(requeue_at=deadline, outcome=outcome, same_priority=same_priority)


DONE = Result()


class TerminalError(Exception):
    """Raised by a reconcile when the object cannot be reconciled until it changes: a spec
    that can never be valid (what is wrong is the message). Retrying the same object would
    only fail the same way, so the key is not retried with backoff, only run again on the
    next change of what the controller watches."""


Reconcile = Callable[[str], Awaitable[Result]]
# Maps an informer change (old, new) to the keys of this controller it concerns.
KeyMapper = Callable[[Any | None, Any | None], Iterable[str]]
# Whether an informer change (old, new) is worth a reconcile at all.
Predicate = Callable[[Any | None, Any | None], bool]
# (key, old, new) -> seconds a change may wait before it is reconciled
Delay = Callable[[str, Any | None, Any | None], float]


@dataclass
class FailureStreak:
    """The reconciles of one controller that raised since the last one that did not: the
    pure rule behind a controller's line in /readyz (see the module docstring)."""

    since: dt.datetime | None = None  # the first of the streak (wall clock, for people)
    count: int = 0
    last: str = ""  # "OverflowError: date value out of range"

    def failed(self, now: dt.datetime, error: BaseException) -> None:
        if self.since is None:
            self.since = now
        self.count += 1
        text = " ".join(str(error).split())
        if len(text) > _SHOWN_CHARS:
            text = text[: _SHOWN_CHARS - 3] + "..."
        self.last = f"{type(error).__name__}: {text}" if text else type(error).__name__

    def ended(self) -> None:
        """A reconcile ended otherwise (success, conflict, not found, a terminal error)."""
        self.since, self.count, self.last = None, 0, ""

    def problem(
        self,
        controller: str,
        now: dt.datetime,
        after: float = FAILING_AFTER,
        count: int = FAILING_COUNT,
    ) -> str | None:
        """One line for /readyz when the streak is long enough, else None."""
        if self.since is None or self.count < count:
            return None
        lasted = (now - self.since).total_seconds()
        if lasted < after:
            return None
        since = self.since.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return (
            f"controller {controller}: every reconcile has raised since {since}"
            f" ({self.count} in a row over {lasted:.0f}s); the last: {self.last}"
            " (its log has each one with its object and traceback)"
        )


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
        max_background: int | None = None,
    ) -> None:
        """``max_background``: at most this many workers on background keys at once
        (``WorkQueue``); the others stay free for changes."""
        self.name = name
        self.reconcile = reconcile
        self.workers = workers
        self.clock = clock
        self.queue = WorkQueue(backoff, max_background)
        self.informers: list[Informer | UnionInformer] = []
        self.workers_alive = 0
        self.died: str | None = None  # why a worker ended while the controller ran
        # key -> the TerminalError last logged for it: said once, not on every change that
        # leaves the object as wrong as before (a status write, a relist)
        self._terminal: dict[str, str] = {}
        self.streak = FailureStreak()
        self.failing_after = FAILING_AFTER
        self.failing_count = FAILING_COUNT
        metrics.QUEUE_DEPTH.labels(name).set_function(lambda: len(self.queue))
        self.queue.on_background_wait = metrics.BACKGROUND_WAIT.labels(name).observe

    def failing(self) -> str | None:
        """Why /readyz should say this controller does not do its work (None: it does)."""
        return self.streak.problem(
            self.name, self.clock.now(), self.failing_after, self.failing_count
        )

    def watch(
        self,
        informer: Informer | UnionInformer,
        keys: KeyMapper = own_key,
        predicate: Predicate | None = None,
        delay: Delay | None = None,
        background: bool = False,
    ) -> None:
        """Reconcile ``keys(old, new)`` whenever ``informer`` sees a change (for which
        ``predicate(old, new)`` holds, if given); ``delay(key, old, new)``: seconds the
        key may wait (a key already due sooner keeps its time); ``background``: after
        every other waiting key (workqueue.py)."""
        self.informers.append(informer)

        def enqueue(old: Any | None, new: Any | None) -> None:
            if predicate is not None and not predicate(old, new):
                return
            for key in keys(old, new):
                if background:
                    self.queue.add_after(key, 0.0, background=True)
                elif delay is None:
                    self.queue.add(key)
                else:
                    self.queue.add_after(key, delay(key, old, new))

        informer.add_handler(enqueue)

    def enqueue_all(self, informer: Informer | UnionInformer, keys: KeyMapper = own_key) -> None:
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
        self.workers_alive += 1
        try:
            while (key := await self.queue.get()) is not None:
                try:
                    await self._process(key)
                finally:
                    self.queue.done(key)
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            self.died = f"controller {self.name}: a worker ended: {type(error).__name__}: {error}"
            raise
        finally:
            self.workers_alive -= 1

    async def _process(self, key: str) -> None:
        started = time.perf_counter()
        outcome = "success"
        try:
            result = await self.reconcile(key)
        except TerminalError as error:
            outcome = "terminal"
            self.queue.forget(key)  # no backoff carried over to the change that fixes it
            self._terminal_once(key, str(error))
        except ApiError as error:
            if errors.is_conflict(error):
                outcome = "conflict"
                self.queue.add_rate_limited(key)
                log.debug("conflict, retrying", extra=fields(controller=self.name, key=key))
            elif errors.is_not_found(error):
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
            outcome = result.outcome or outcome
            self.queue.forget(key)
            self._terminal.pop(key, None)
            if result.requeue_at is not None:
                delay = (result.requeue_at - self.clock.now()).total_seconds()
                # A schedule this far ahead is a poll or a resync; sooner, it follows work
                # in progress (a power change landing, a busy BMC): see WorkQueue.
                background = delay >= BACKGROUND_AFTER or (
                    result.same_priority and self.queue.handed_out_in_background(key)
                )
                self.queue.add_after(key, delay, background=background)
        finally:
            if outcome != "error":
                self.streak.ended()
            metrics.RECONCILE_SECONDS.labels(self.name).observe(time.perf_counter() - started)
            metrics.RECONCILE_TOTAL.labels(self.name, outcome).inc()

    def _terminal_once(self, key: str, problem: str) -> None:
        if self._terminal.get(key) == problem:
            return
        if len(self._terminal) >= _TERMINAL_REMEMBERED and key not in self._terminal:
            self._terminal.pop(next(iter(self._terminal)))  # oldest: bounded memory
        self._terminal[key] = problem
        log.warning(
            "cannot reconcile until the object changes: %s",
            problem,
            extra=fields(controller=self.name, key=key),
        )

    def _failed(self, key: str, error: Exception) -> None:
        metrics.RECONCILE_ERRORS.labels(self.name).inc()
        delay = self.queue.add_rate_limited(key)
        where = fields(controller=self.name, key=key, retry_in=f"{delay:.3f}s")
        if cause := transient(error):
            # The API server restarting or a dropped connection is weather, not a bug:
            # one line with the cause; a traceback would only bury it.
            log.warning("reconcile failed: %s", cause, extra=where)
        else:
            self.streak.failed(self.clock.now(), error)
            log.error("reconcile failed", exc_info=error, extra=where)


def transient(error: BaseException) -> str | None:
    """One line naming the cause if ``error`` is a passing API server problem (transport
    error, timeout, 5xx, 429); None for anything that deserves a traceback."""
    if isinstance(error, ApiError):
        if errors.is_unavailable(error):
            return f"API server answered {errors.code(error)}: {error.status.message}"
        return None
    if isinstance(error, httpx2.HTTPError | OSError | TimeoutError):
        text = " ".join(str(error).split()) or "no detail"
        cause = error.__cause__ or error.__context__
        if cause is not None and str(cause) and str(cause) not in text:
            text += f" ({type(cause).__name__}: {' '.join(str(cause).split())})"
        return f"cannot reach the API server: {type(error).__name__}: {text}"
    return None


_METADATA_COMPARED = ("generation", "annotations", "labels", "deletionTimestamp", "finalizers")


def beyond_status(old: Any | None, new: Any | None) -> bool:
    """A watch predicate: False when an update changed only status (or managedFields,
    resourceVersion: what every write changes), True for additions, deletions and any
    other change. Spec changes are seen through ``metadata.generation``, which the API
    server bumps on spec changes only; for kinds without a generation the spec is
    compared itself."""
    if old is None or new is None:
        return True
    before, after = old.metadata, new.metadata
    if any(getattr(before, n, None) != getattr(after, n, None) for n in _METADATA_COMPARED):
        return True
    if before.generation is None and after.generation is None:
        return bool(_part(old, "spec") != _part(new, "spec"))
    return False


def _part(obj: Any, name: str) -> Any:
    if hasattr(obj, "get"):
        return obj.get(name)
    return getattr(obj, name, None)
