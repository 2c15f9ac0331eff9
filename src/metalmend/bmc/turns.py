"""Whose turn it is at a busy BMC endpoint: namespaces take turns, round-robin.

An endpoint serves one call at a time (bmc/pool.py). Without turns, the calls that find
it busy come back after their ``retry_after`` and whoever comes back first when it is
free takes it: a namespace with many hosts on one endpoint (a tenant naming another
tenant's BMC address, with credentials that fail slowly) takes it again and again, and a
host of another namespace waits behind all of them (in a lab, twelve such hosts made a
hard reboot of a host of another namespace wait over a minute).

The rule: a call that finds the endpoint busy waits (``wait``), in its namespace's line.
When the endpoint is free, the turn goes to the next namespace in line after the one
served last (namespaces in name order, wrapping), among the namespaces waiting; only a
call of that namespace may start, for ``TURN_HOLD`` seconds, after which anyone may. So
between two calls of one namespace that waits, every other namespace starts at most one:
a host waits behind the call under way and at most one call per other namespace (and the
calls of its own namespace's hosts, whose order is that namespace's business).

Nothing here blocks or does I/O: the pool asks ``may_start`` and turns a call away
(``Busy``) when it may not; ``freed`` names the waiter whose namespace has the turn, so
that the pool can wake it at once instead of at its ``retry_after``. Times are the
caller's monotonic clock, passed in.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

TURN_HOLD = 1.0
"""How long a freed endpoint is kept for the namespace whose turn it is: its waiter is
woken at once (a queue add, milliseconds), and a waiter that does not come (its host
deleted, its call turned away for another reason) must not keep the endpoint idle."""

WAIT_GRACE = 2.0
"""A waiter counts as waiting until its ``retry_after`` plus this has passed without it
asking again (it was served elsewhere, or its host is gone)."""


@dataclass
class _Endpoint:
    waiters: dict[str, tuple[str, float]] = field(default_factory=dict)
    """waiter -> (its namespace, when it stops counting), oldest first."""
    last: str | None = None  # the namespace served last
    freed_at: float | None = None  # None: a call is under way (or none has ended yet)


class Turns:
    def __init__(self) -> None:
        self._endpoints: dict[str, _Endpoint] = {}

    def waiting(self, endpoint: str, now: float) -> list[str]:
        """The namespaces with a call waiting for ``endpoint`` (expired waiters dropped)."""
        state = self._endpoints.get(endpoint)
        if state is None:
            return []
        for waiter in [w for w, (_, until) in state.waiters.items() if until < now]:
            del state.waiters[waiter]
        return sorted({namespace for namespace, _ in state.waiters.values()})

    def turn(self, endpoint: str, namespace: str, now: float) -> str | None:
        """The namespace that may start a call at the free ``endpoint`` now, asked by a
        call of ``namespace``; None: any may (nobody else waits, or the turn's hold
        passed)."""
        state = self._endpoints.get(endpoint)
        if state is None or state.freed_at is None or now - state.freed_at > TURN_HOLD:
            return None
        line = set(self.waiting(endpoint, now))
        if not line - {namespace}:
            return None
        return next_in_line(sorted(line | {namespace}), state.last)

    def may_start(self, endpoint: str, namespace: str, now: float) -> bool:
        turn = self.turn(endpoint, namespace, now)
        return turn is None or turn == namespace

    def ahead(self, endpoint: str, namespace: str, now: float) -> int:
        """Other namespaces whose turn at ``endpoint`` comes before ``namespace``'s: one
        call of each comes first (after the call under way)."""
        state = self._endpoints.get(endpoint)
        if state is None:
            return 0
        line = sorted(set(self.waiting(endpoint, now)) | {namespace})
        first = line.index(next_in_line(line, state.last))
        return (line.index(namespace) - first) % len(line)

    def wait(self, endpoint: str, namespace: str, waiter: str, now: float, retry: float) -> None:
        """``waiter`` (a host key) of ``namespace`` was turned away and asks again within
        ``retry`` seconds; it keeps its place in line while it does."""
        state = self._endpoints.setdefault(endpoint, _Endpoint())
        # A waiter already in line keeps its place (a dict keeps the order of first entry).
        state.waiters[waiter] = (namespace, now + retry + WAIT_GRACE)

    def started(self, endpoint: str, namespace: str, waiter: str) -> None:
        """A call of ``namespace`` (by ``waiter``, "" if anonymous) took the endpoint."""
        state = self._endpoints.setdefault(endpoint, _Endpoint())
        state.waiters.pop(waiter, None)
        state.last = namespace
        state.freed_at = None

    def freed(self, endpoint: str, now: float) -> str | None:
        """The endpoint's call ended. Returns the waiter to wake: the oldest of the
        namespace whose turn it is (None: nobody waits, and the endpoint is forgotten)."""
        state = self._endpoints.get(endpoint)
        if state is None:
            return None
        line = self.waiting(endpoint, now)
        if not line:
            del self._endpoints[endpoint]
            return None
        state.freed_at = now
        turn = next_in_line(line, state.last)
        return next(w for w, (namespace, _) in state.waiters.items() if namespace == turn)

    def waiting_by_namespace(self, now: float) -> Counter[str]:
        """Waiters per namespace, over every endpoint (for /metrics; safe to call from
        another thread: it reads copies)."""
        counts: Counter[str] = Counter()
        for state in list(self._endpoints.values()):
            for namespace, until in list(state.waiters.values()):
                if until >= now:
                    counts[namespace] += 1
        return counts


def next_in_line(namespaces: list[str], last: str | None) -> str:
    """Round-robin: the first of ``namespaces`` (sorted, not empty) after ``last``,
    wrapping to the first."""
    if last is not None:
        for namespace in namespaces:
            if namespace > last:
                return namespace
    return namespaces[0]
