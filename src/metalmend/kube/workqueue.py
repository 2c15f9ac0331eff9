"""A work queue of reconcile keys, with client-go's guarantees, on asyncio.

- A key added several times before a worker takes it is handed out once.
- A key is never handed to two workers at once; added while being processed, it is
  handed out again after ``done``.
- ``add_after`` / ``add_at`` schedule a key at an exact loop time; the earliest schedule
  of a key wins (a reconcile that runs sooner returns a fresh deadline anyway).
- ``add_rate_limited`` backs a failing key off exponentially (base * 2**failures, capped);
  ``forget`` resets it once the key succeeds.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    base: float = 0.005  # seconds, as client-go's default per-item limiter
    cap: float = 300.0

    def delay(self, failures: int) -> float:
        return float(min(self.cap, self.base * 2 ** max(failures - 1, 0)))


class WorkQueue:
    def __init__(self, backoff: Backoff | None = None) -> None:
        self.backoff = backoff or Backoff()
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()  # waiting to be handed out
        self._processing: set[str] = set()
        self._failures: dict[str, int] = {}
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._shutting_down = False

    def __len__(self) -> int:
        """Keys waiting to be handed out (the queue depth)."""
        return len(self._queue)

    @property
    def scheduled(self) -> int:
        return len(self._timers)

    def add(self, key: str) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._notify()

    def add_after(self, key: str, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self.add_at(key, loop.time() + max(delay, 0.0))

    def add_at(self, key: str, when: float) -> None:
        """Add ``key`` at loop time ``when`` (``asyncio.get_running_loop().time()`` scale)."""
        loop = asyncio.get_running_loop()
        if when <= loop.time():
            self.add(key)
            return
        existing = self._timers.get(key)
        if existing is not None:
            if existing[0] <= when:
                return
            existing[1].cancel()
        self._timers[key] = (when, loop.call_at(when, self._fire, key))

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
        while not self._queue:
            if self._shutting_down:
                return None
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and self._queue:
                    self._notify()  # we were woken for a key: pass the wake-up on
                raise
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._notify()

    def shutdown(self) -> None:
        self._shutting_down = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._notify(everyone=True)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _notify(self, everyone: bool = False) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                if not everyone:
                    return
