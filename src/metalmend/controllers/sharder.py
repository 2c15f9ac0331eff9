"""The sharder: which replica of ``metalmend run`` owns which BareMetalHost
(docs/sharding.md). It runs on the leader only, beside the controllers that stay
leader-elected, and writes nothing but two labels on hosts:

- ``shard.metalmend.dev/replica: <member>``: the owner. host-power on each replica watches
  only the hosts labelled with its own name (a label selector), so it never sees the
  others';
- ``shard.metalmend.dev/drain: "true"``: the leader asks a live owner to let a host go
  because the ring now gives it to another member. The owner acknowledges by removing
  both labels, from host-power's own reconcile of that host (the work queue never runs
  two reconciles of one host at once, so nothing of the old owner is still in flight);
  only then does the leader label the host for its new owner.

A host whose owner is not live (its Lease expired, so it stopped acting at its renew
deadline, before the expiry; or it released its Lease on a graceful stop) is labelled for
the ring's choice at once, drain or not. What to write for one host is
``policy.sharding.step``; every write carries the resourceVersion it was decided on.

The membership comes from the ring's Leases (``kube.shards.Members``); a change of the
live members reconciles the hosts it gives something to write (a dead owner's first), and
the sharder looks again when the next live Lease would expire unless renewed. The leader's
own replica weighs ``runtime.shard_leader_weight`` on the ring
(``policy.sharding.placement``): it also runs the fleet-wide controllers.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from lightkube.resources.coordination_v1 import Lease

from metalmend.api import names
from metalmend.api.resources import BareMetalHost
from metalmend.controllers import metrics
from metalmend.kube import writes
from metalmend.kube.controller import DONE, Controller, Result
from metalmend.kube.manager import Manager
from metalmend.kube.shards import Members, Sharding
from metalmend.kube.store import object_key
from metalmend.log import fields
from metalmend.policy import sharding as policy
from metalmend.settings import Settings

log = logging.getLogger(__name__)

RING_KEY = "ring"  # the membership check; host keys are namespace/name
# Looking again a little after a Lease's expiry: it has then expired on our clock.
EXPIRY_SLACK = dt.timedelta(milliseconds=200)
NONE = "none"  # metalmend_shard_hosts' replica for hosts no live replica owns


def labels_changed(old: Any | None, new: Any | None) -> bool:
    if old is None or new is None:
        return True
    return bool((old.metadata.labels or {}) != (new.metadata.labels or {}))


class Sharder:
    def __init__(self, manager: Manager, settings: Settings, sharding: Sharding) -> None:
        self.manager = manager
        self.client = manager.client
        self.clock = manager.clock
        # Filled on every replica (``standby``), though only the leader's sharder reads
        # them: a new leader assigns its dead predecessor's hosts without listing the fleet
        # first, and counts each Lease's expiry from when it saw the Lease change.
        self.hosts = manager.informer(
            BareMetalHost, namespace=settings.runtime.namespace, standby=True
        )
        self.leases = manager.informer(
            Lease,
            namespace=sharding.namespace,
            labels={names.SHARD_RING_LABEL: sharding.ring},
            standby=True,
        )
        self.members = Members(sharding.timing.lease_duration)
        # This sharder runs on the leader: its own replica is the leader, lighter on the ring.
        self.leader = sharding.member
        self.leader_weight = settings.runtime.shard_leader_weight
        # First among the Lease handlers: the ring key then runs on what it just saw.
        self.leases.add_handler(self.members.observe)
        self._ring = policy.Ring.of(())
        self._live: frozenset[str] = frozenset()
        self.runner: Controller | None = None

    def ring(self, live: frozenset[str]) -> policy.Ring:
        if frozenset(self._ring.members) != live:
            self._ring = policy.placement(live, self.leader, self.leader_weight)
        return self._ring

    async def reconcile(self, key: str) -> Result:
        if key == RING_KEY:
            return self._check_members()
        host = self.hosts.store.get(key)
        if host is None:
            return DONE
        live = self.members.live()
        labels = host.metadata.labels or {}
        owner = labels.get(names.SHARD_REPLICA_LABEL) or None
        draining = names.SHARD_DRAIN_LABEL in labels
        match policy.step(owner, draining, live, self.ring(live), key):
            case policy.Assign(member=member):
                changes = {names.SHARD_REPLICA_LABEL: member, names.SHARD_DRAIN_LABEL: None}
                why = "unowned" if owner is None else f"{owner} is not live"
                log.info("host assigned", extra=fields(host=key, replica=member, why=why))
            case policy.Drain():
                changes = {names.SHARD_DRAIN_LABEL: "true"}
                log.info("host draining", extra=fields(host=key, replica=owner))
            case _:
                return DONE
        await writes.patch_labels(self.client, BareMetalHost, host, changes, require_version=True)
        return DONE

    def _check_members(self) -> Result:
        live = self.members.live()
        if live != self._live:
            log.info(
                "shard members",
                extra=fields(
                    live=",".join(sorted(live)) or "none", was=",".join(sorted(self._live))
                ),
            )
            self._live = live
            if self.runner is not None:
                self._enqueue_pending(live)
        after = self.members.next_change()
        if after is None:
            return DONE
        return Result.at(self.clock.now() + dt.timedelta(seconds=after) + EXPIRY_SLACK)

    def _enqueue_pending(self, live: frozenset[str]) -> None:
        """After a change of members, reconcile only the hosts it gives something to write:
        first those no live replica owns (assigned ahead of every other key: nobody serves
        them until then), then those to drain, in the background. The ring key itself is
        never queued behind hosts (they are background keys), so the next change of
        members (a Lease expiring) is seen on time however many hosts are still waiting:
        a new leader first sees its dead predecessor still live for a moment, and must see
        it expire without a pass over every host in between."""
        assert self.runner is not None
        hosts = []
        for host in self.hosts.store.values():
            labels = host.metadata.labels or {}
            owner = labels.get(names.SHARD_REPLICA_LABEL) or None
            hosts.append((object_key(host), owner, names.SHARD_DRAIN_LABEL in labels))
        assign, drain = policy.pending(hosts, live, self.ring(live))
        for key in assign:
            self.runner.queue.add(key)
        for key in drain:
            self.runner.queue.add_after(key, 0.0, background=True)

    def cache_samples(self) -> list[metrics.Sample]:
        """``metalmend_shard_hosts{replica}`` and the live replicas, from the leader's cache
        (other replicas say nothing: one series per replica, not one per Pod scraped)."""
        if not self.manager.controllers_running:
            return []
        return metrics.shard_samples(self.hosts.store.values(), self.members.live())


def setup(manager: Manager, settings: Settings, sharding: Sharding) -> Sharder:
    sharder = Sharder(manager, settings, sharding)
    runner = manager.add(Controller("sharder", sharder.reconcile, workers=4))
    sharder.runner = runner
    # A host's own change (a label written, most often by the sharder itself) waits behind
    # the ring key, which a change of members puts first (``_enqueue_pending``).
    runner.watch(sharder.hosts, predicate=labels_changed, background=True)
    runner.watch(sharder.leases, lambda old, new: [RING_KEY])
    metrics.from_cache("sharder", sharder.cache_samples)
    return sharder
