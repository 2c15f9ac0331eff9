"""Which caches a replica fills before it leads (kube/manager.py, docs/sharding.md): with
sharding, only what its sharded controllers watch and what the sharder needs at once; the
caches only the leader's controllers read are filled when it leads. Without sharding, all
of them (a standby's warm cache is its fast takeover)."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Secret

from metalmend.api.resources import BareMetalHost, Machine, OpenShiftMachine
from metalmend.controllers import machines as machine_kinds
from metalmend.controllers import sharder
from metalmend.controllers.registry import CONTROLLERS
from metalmend.kube.informer import Informer
from metalmend.kube.manager import LeaderElection, Manager
from metalmend.kube.shards import Sharding
from metalmend.kube.union import UnionInformer
from metalmend.settings import RuntimeSettings, Settings

NAMESPACE = "fleet"


def wired(*, sharded: bool) -> tuple[Manager, sharder.Sharder | None]:
    """A manager with every controller ``metalmend run`` can start, as it wires them."""
    runtime = RuntimeSettings(
        namespace=NAMESPACE, leader_elect=True, shard=sharded, shard_id="r0" if sharded else None
    )
    settings = dataclasses.replace(Settings(), runtime=runtime)
    sharding = Sharding(member="r0", namespace=NAMESPACE) if sharded else None
    manager = Manager(cast(Any, None), leader_election=LeaderElection(), sharding=sharding)
    machine_kinds.use_kinds(manager, (Machine, OpenShiftMachine))
    machine_kinds.use_metal3machines(manager, True)
    for setup in CONTROLLERS.values():
        setup(manager, settings)
    if sharding is None:
        return manager, None
    return manager, sharder.setup(manager, settings, sharding)


def kinds(informers: list[Informer]) -> set[tuple[Any, str | None, bool]]:
    return {(i.resource, i.namespace, bool(i.labels)) for i in informers}


def informers_in(obj: Any) -> list[Informer]:
    """The informers an object holds in its attributes (directly, in a dict or a union)."""
    found: list[Informer] = []
    for value in vars(obj).values():
        values = value.values() if isinstance(value, dict) else [value]
        for one in values:
            if isinstance(one, Informer):
                found.append(one)
            elif isinstance(one, UnionInformer):
                found.extend(one.informers)
    return found


def test_without_sharding_every_cache_is_filled_before_leading() -> None:
    manager, _ = wired(sharded=False)
    assert manager.early_informers() == list(manager.informers.values())


def test_with_sharding_a_replica_that_does_not_lead_fills_only_what_every_replica_reads() -> None:
    manager, _ = wired(sharded=True)
    early = manager.early_informers()
    assert kinds(early) == {
        (BareMetalHost, NAMESPACE, True),  # host-power's own hosts (the shard label)
        (Secret, NAMESPACE, True),  # their labelled BMC Secrets
        (BareMetalHost, NAMESPACE, False),  # the sharder's: every host, for a new leader
        (Lease, NAMESPACE, True),  # the ring's Leases
    }
    late = [i for i in manager.informers.values() if i not in early]
    assert Node in {i.resource for i in late}
    assert len(early) + len(late) == len(manager.informers)


def test_every_cache_a_sharded_controller_holds_is_filled_before_leading() -> None:
    """A sharded controller reads only caches filled on every replica: any other would be
    empty on a replica that does not lead, and an empty cache reads as "no such object"."""
    manager, the_sharder = wired(sharded=True)
    early = {id(i) for i in manager.early_informers()}
    sharded = [c.reconcile.__self__ for c in manager.sharded_controllers]  # type: ignore[attr-defined]
    sharded.append(the_sharder)
    held = [i for obj in sharded for i in informers_in(obj)]
    assert held, "the sharded controllers hold their informers as attributes"
    assert all(id(i) in early for i in held), [i.name for i in held if id(i) not in early]


def test_a_new_leader_starts_at_once_only_controllers_whose_caches_are_filled() -> None:
    """The sharder (a dead leader's hosts handed over) starts without waiting for the
    fleet's Nodes; every controller started at once holds no cache listed later."""
    manager, _ = wired(sharded=True)
    early = {id(i) for i in manager.early_informers()}
    now = [c for c in manager.controllers if manager.watches_only(c, early)]
    assert [c.name for c in now] == ["sharder"]
    for controller in now:
        held = informers_in(controller.reconcile.__self__)  # type: ignore[attr-defined]
        assert all(id(i) in early for i in held), [i.name for i in held if id(i) not in early]


def test_readiness_counts_only_the_caches_this_replica_runs() -> None:
    manager, _ = wired(sharded=True)
    for informer in manager.early_informers():
        informer.synced.set()
    assert manager.synced()
    assert manager.unsynced() == []
    assert not all(i.synced.is_set() for i in manager.informers.values())
