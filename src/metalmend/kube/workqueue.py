"""A work queue of reconcile keys, with client-go's guarantees, on asyncio.

- A key added several times before a worker takes it is handed out once.
- A key is never handed to two workers at once; added while being processed, it is
  handed out again after ``done``.
- ``add_after`` / ``add_at`` schedule a key at an exact loop time; the earliest schedule
  of a key wins (a reconcile that runs sooner returns a fresh deadline anyway).
- ``add_rate_limited`` backs a failing key off exponentially (base * 2**failures, capped);
  ``forget`` resets it once the key succeeds.
- Background keys (scheduled with ``background=True``: a controller's periodic polls and
  resyncs) are handed out only when no other key waits; every other key (added now, or a
  schedule that came due: a power change being watched, a retry) goes first, each in the
  order added. At 5,000 hosts host-power has 250 idle power polls a second due; in one
  first-come queue a reboot request, and the polls that watch its power change land,
  waited behind them for seconds (benchmarks/scale.py). Background keys are not starved
  in practice: other work is rare next to them. A background key that is asked for
  meanwhile moves ahead.
- ``max_background``: at most this many background keys are processed at once, so the
  other workers stay free for every other key. A background reconcile may then wait for
  what it needs (host-power's poll waits in line for a BMC slot: bmc/pool.py) without a
  change ever waiting for a worker behind it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    base: float = 0.005  # seconds, as client-go's default per-item limiter
    cap: float = 300.0

    def delay(self, failures: int) -> float:
        return float(min(self.cap, self.base * 2 ** max(failures - 1, 0)))


class WorkQueue:
    def __init__(self, backoff: Backoff | None = None, max_background: int | None = None) -> None:
        self.backoff = backoff or Backoff()
        self.max_background = max_background
        self._queue: deque[str] = deque()  # background keys
        self._urgent: deque[str] = deque()  # every other key: handed out first
        self._dirty: set[str] = set()  # waiting to be handed out
        self._asked: set[str] = set()  # dirty keys not in the background
        self._from_background: set[str] = set()  # processing keys handed out as background
        self._processing: set[str] = set()
        self._failures: dict[str, int] = {}
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}  # (when, timer)
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._shutting_down = False
        self._due: dict[str, float] = {}  # background keys waiting: loop time they came due
        self.on_background_wait: Callable[[float], None] | None = None
        """Told how long each background key waited from due to a worker (for /metrics):
        a routine poll that waits seconds means the process lacks CPU or BMC slots."""

    def __len__(self) -> int:
        """Keys waiting to be handed out (the queue depth)."""
        return len(self._dirty) - sum(1 for k in self._processing if k in self._dirty)

    @property
    def scheduled(self) -> int:
        return len(self._timers)

    @property
    def in_progress(self) -> int:
        """Keys handed out and not done yet (being reconciled)."""
        return len(self._processing)

    def add(self, key: str) -> None:
        """Hand ``key`` out as soon as a worker is free, before background keys."""
        if self._shutting_down or key in self._asked:
            return
        self._dirty.add(key)
        self._asked.add(key)  # a background entry of it left in _queue is skipped
        self._due.pop(key, None)
        if key not in self._processing:
            self._urgent.append(key)
            self._notify()

    def _add_background(self, key: str) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        self._due[key] = asyncio.get_running_loop().time()
        if key not in self._processing:
            self._queue.append(key)
            self._notify()

    def add_after(self, key: str, delay: float, *, background: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self.add_at(key, loop.time() + max(delay, 0.0), background=background)

    def add_at(self, key: str, when: float, *, background: bool = False) -> None:
        """Add ``key`` at loop time ``when`` (``asyncio.get_running_loop().time()`` scale);
        ``background``: then hand it out after every other waiting key."""
        loop = asyncio.get_running_loop()
        if when <= loop.time():
            self._fire(key, background)
            return
        existing = self._timers.get(key)
        if existing is not None:
            if existing[0] <= when:
                return
            existing[1].cancel()
        self._timers[key] = (when, loop.call_at(when, self._fire, key, background))

    def add_rate_limited(self, key: str) -> float:
        """Schedule ``key`` after its backoff; return the delay chosen."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = self.backoff.delay(failures)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> str | None:
        """The next key, marked as processing; None once the queue shuts down."""
        while not self._has_next():
            if self._shutting_down:
                return None
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and self._has_next():
                    self._notify()  # we were woken for a key: pass the wake-up on
                raise
        key = self._next()
        if key not in self._asked:
            self._from_background.add(key)
            due = self._due.pop(key, None)
            if due is not None and self.on_background_wait is not None:
                self.on_background_wait(asyncio.get_running_loop().time() - due)
        self._dirty.discard(key)
        self._asked.discard(key)
        self._processing.add(key)
        return key

    def handed_out_in_background(self, key: str) -> bool:
        """Whether ``key``, being processed, was handed out as a background key."""
        return key in self._from_background

    def _next(self) -> str:
        """The first waiting key, urgent ones first; entries left behind by a key already
        handed out, or moved to the urgent deque, are dropped on the way."""
        while self._urgent:
            key = self._urgent.popleft()
            if key in self._asked and key not in self._processing:
                return key
        while True:
            key = self._queue.popleft()
            if key in self._dirty and key not in self._asked and key not in self._processing:
                return key

    def _has_next(self) -> bool:
        while self._urgent and not (
            self._urgent[0] in self._asked and self._urgent[0] not in self._processing
        ):
            self._urgent.popleft()
        while self._queue and not (
            self._queue[0] in self._dirty
            and self._queue[0] not in self._asked
            and self._queue[0] not in self._processing
        ):
            self._queue.popleft()
        return bool(self._urgent or (self._queue and self._background_allowed()))

    def _background_allowed(self) -> bool:
        return self.max_background is None or len(self._from_background) < self.max_background

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._from_background:
            self._from_background.discard(key)
            if self._queue and self.max_background is not None:
                self._notify()  # a background place freed: a waiting worker may take it
        if key in self._dirty:
            (self._urgent if key in self._asked else self._queue).append(key)
            self._notify()

    def shutdown(self) -> None:
        self._shutting_down = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._notify(everyone=True)

    def _fire(self, key: str, background: bool = False) -> None:
        self._timers.pop(key, None)
        if background:
            self._add_background(key)
        else:
            self.add(key)

    def _notify(self, everyone: bool = False) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                if not everyone:
                    return
