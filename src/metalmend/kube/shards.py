"""Shard membership over coordination.k8s.io Leases (docs/sharding.md).

Each replica run with ``--shard`` holds a Lease of its own, ``<ring>-shard-<member>`` in the
leader Lease's namespace, labelled with the ring (the leader Lease's name) and its member
name, and renews it as a leader renews its Lease (``kube.leader.LeaderElector``: every
``retry_period``; a replica that cannot renew for ``renew_deadline`` stops its sharded
controllers and exits, before ``lease_duration`` lets anyone count it dead). No database,
no extra service: the API server is the only source of truth.

``Members`` is what every replica knows of the others: fed by an informer of the ring's
Leases, it says which members are live now. A member is live while its Lease has a holder
and its record (holder, renew time, transitions) has changed within its
``leaseDurationSeconds``, measured on our own clock since we saw the record change (as
client-go measures a leader's Lease: the holder's timestamps are never compared with our
clock, which may be skewed). A Lease released on a graceful stop (no holder) is not live
at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metalmend.api import names
from metalmend.kube.leader import LeaseTiming
from metalmend.kube.store import object_key


def lease_name(ring: str, member: str) -> str:
    """The Lease of ``member`` in ``ring``."""
    return f"{ring}-shard-{member}"


@dataclass(frozen=True)
class Sharding:
    """This replica's place among the shards: its member name, the ring (the leader
    Lease's name, so that two installations in one namespace do not mix), the namespace of
    the Leases, the holder identity written on its Lease (unique per process, so that a
    restarted replica waits for its predecessor's Lease to expire before acting) and the
    Lease timing."""

    member: str
    ring: str = "metalmend"
    namespace: str = "default"
    identity: str = ""
    timing: LeaseTiming = field(default_factory=LeaseTiming)

    @property
    def lease_name(self) -> str:
        return lease_name(self.ring, self.member)

    @property
    def lease_labels(self) -> dict[str, str]:
        return {names.SHARD_RING_LABEL: self.ring, names.SHARD_REPLICA_LABEL: self.member}


@dataclass
class _Seen:
    member: str
    record: tuple[Any, ...]
    holder: str
    duration: float
    since: float  # monotonic time we first saw this record


class Members:
    """The live members of a ring, from the Leases an informer brings (``observe`` is its
    handler). ``now`` is a monotonic clock (seconds), replaceable in tests."""

    def __init__(self, default_duration: float, now: Callable[[], float] = time.monotonic):
        self.default_duration = default_duration
        self.now = now
        self._seen: dict[str, _Seen] = {}  # by the Lease's namespace/name

    def observe(self, old: Any | None, new: Any | None) -> None:
        lease = new if new is not None else old
        if lease is None:
            return
        key = object_key(lease)
        if new is None:
            self._seen.pop(key, None)
            return
        member = (lease.metadata.labels or {}).get(names.SHARD_REPLICA_LABEL) or ""
        spec = lease.spec
        holder = (spec.holderIdentity if spec is not None else None) or ""
        duration = float(
            (spec.leaseDurationSeconds if spec is not None else None) or self.default_duration
        )
        record = (
            holder,
            spec.renewTime if spec is not None else None,
            spec.leaseTransitions if spec is not None else None,
            duration,
        )
        seen = self._seen.get(key)
        if seen is None or seen.record != record or seen.member != member:
            self._seen[key] = _Seen(member, record, holder, duration, self.now())

    def live(self) -> frozenset[str]:
        """The members whose Lease is held and has not expired by our clock."""
        now = self.now()
        return frozenset(
            s.member
            for s in self._seen.values()
            if s.member and s.holder and now < s.since + s.duration
        )

    def next_change(self) -> float | None:
        """Seconds until the next live member's Lease expires unless renewed (None: no
        live member), so that the sharder looks again then."""
        now = self.now()
        ends = [
            s.since + s.duration - now
            for s in self._seen.values()
            if s.member and s.holder and now < s.since + s.duration
        ]
        return max(0.0, min(ends)) if ends else None
