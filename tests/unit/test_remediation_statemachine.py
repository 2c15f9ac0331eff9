"""Both remediation flows under random interleavings, against a simulated world (pure: no I/O).

The world: one or two hosts whose BMCs land power changes late (and fail), hosts that boot
after a delay and hang, a kubelet that registers a *new* Node (new uid, fewer labels and
annotations than the original had) whenever a running host has none, a node monitor, node-link
(Machine nodeRef follows a registered Node, and is kept when it is deleted), a health check played by rules (it creates and deletes
Metal3Remediation objects and sets and removes the annotation-based flow's annotation), the garbage
collector, Nodes deleted by others, and ``spec.online`` flips. Optionally a second Machine
names the first host (and Node), so that two remediations compete for one host. Optionally
the two hosts' systems sit behind one shared BMC endpoint (a chassis manager, a Redfish
aggregator): each host's ``spec.bmc.address`` names the endpoint and its own system.

The controllers run their real code: host-power's ``begin`` (retry schedule, BMC read,
``policy.hostpower.decide``), ``act`` and ``succeeded``; metal3-remediation's ``plan``
(observe, ``policy.remediation.decide``) and ``act``; machine-remediation's ``observe`` and
``decide``. Their executors write through ``WorldWriter``, the world's implementation of
``kube.writer.Writer`` (docs/decide-act.md), so a change to a controller's executor is a
change to this model. Every BMC reading and command of the host controller goes through
the real ``BmcPool`` (its driver cache and its slots) from the host's address and its
credentials Secret, with drivers that reach the simulated system their address names.
The world's writes behave as the API server's: status patches carry the resourceVersion
decided on (409 otherwise), a reboot key is added only if the host is unchanged since
observed, deletes have a uid precondition, a patch that changes nothing sends nothing, and
a failed write ends the reconcile. A reconcile is observed and decided at once; its
actions then run one by one, interleaved with everything else, and a crash (or a restart
of everything, which also forgets what host-power kept in memory: the commands it sent and
its retry schedules) can drop the rest at any point.

Invariants:
1. (docs/design.md, invariant 1) A Node is deleted or tainted out-of-service by remediation only while the
   host is off (the simulated BMC, ground truth) and after the host controller read it off
   from the BMC since the current attempt began (object created, and the remediation's
   reboot key last added; annotation-based flow: its reboot key last added).
2. (docs/design.md, invariant 2) After a settle phase (faults healed, remediation objects deleted, requests
   withdrawn, everything run until quiet), every online host is on and no remediation key
   remains.
3. Labels and annotations of a Node fenced by metal3-remediation are on its successor when
   the object reaches ``waiting`` or goes away, unless a Warning ``NodeLabelsNotRestored``
   said they were not (counted), or the Machine is gone.
4. Never two remediation reboot keys on one host.
7. (docs/design.md, invariant 7) Teardown and remediation never act on one host at once: a
   teardown (``metalmend serve``'s claim: ``policy.interlock.decide_claims`` on the host as
   read, the claim written conditional on that version, as ``teardown.interlock`` does) and
   the remediations decide and write interleaved; no remediation key or escalation marker
   is added while a teardown claim is on the host, no claim is written while a remediation
   key or an escalation marker is, no Node is fenced and no Machine deleted by escalation
   while its host is claimed. An operator releases claims at random.
9. (docs/design.md safety invariant 9) Every BMC command and power reading reached the
   system its host names, never another behind the same endpoint.
12. (docs/design.md, invariant 12) The out-of-service taint is never on a Node whose server
   is not confirmed off: it is added only while the host is off (ground truth), after
   host-power read it off for the current attempt and after metal3-remediation's own BMC
   reads confirmed it (``confirm_reads`` over ``confirm_window``); and at every moment a
   tainted Node's host is off, or the Node has no pod and no VolumeAttachment left. The
   world runs workloads: a scheduler puts pods (each with a VolumeAttachment) on Ready,
   untainted Nodes, and kube-controller-manager removes a tainted Node's pods and then its
   attachments, a few at a time. After settling, no Node is left tainted.

Four policy bugs this model found are replayed step by step at the end of this file, each
test named for the rule it now proves:
- an "on" in flight was forgotten when a reboot key arrived before it landed, so a host
  that powers on was reported off (invariant 1, ground truth; fixed in policy.hostpower);
- a retry reset ``fencedNodeUID`` and deletion then dropped the label backup without a
  Warning (invariant 3; fixed in policy.remediation);
- an off report written for an earlier, withdrawn reboot request counted for a later
  remediation (invariant 1, evidence; fixed in policy.hostpower and policy.fencing:
  ``status.poweredOffFor``);
- an "on" not obeyed within ``command_retry`` was forgotten while the host was held off,
  although a slow BMC still carried it out, after fencing (invariant 1, ground truth;
  fixed in policy.hostpower).

Mutation checks (done by hand, not committed): with ``policy.fencing.reported_off`` weakened to
``powered_on is False`` (in policy.remediation and controllers.machineremediation), the
state machine finds an invariant-1 violation within its 500 examples; with it ignoring
``acknowledged``, or with host-power forgetting an unobeyed "on" after ``command_retry``
again, the replays of the last two fail. (The first mutation was checked again after the
controllers' executors moved onto the Writer: invariant 1 is violated within one run.) With ``BmcPool``'s
drivers keyed by endpoint only (``bmc.pool._driver_key`` returning ``address.key``, as before
the fix: the first host's driver, and so its system, served every host on the endpoint), it
finds an invariant-9 violation at once (a shared endpoint, a power reading of h2 reached A).
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import functools
import json
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from lightkube import ApiError
from lightkube.models.meta_v1 import Status
from lightkube.resources.core_v1 import Node, Secret

from metalmend.api import names
from metalmend.api.resources import BareMetalHost, Machine, Metal3Remediation
from metalmend.api.stamps import stamp
from metalmend.bmc import BmcPool, BmcTarget, parse
from metalmend.bmc.credentials import HOSTS_ANNOTATION
from metalmend.bmc.driver import PowerAction, PowerDriver, PowerState
from metalmend.bmc.errors import BadAddress, Unreachable
from metalmend.bmc.settings import BmcSettings
from metalmend.controllers import hostpower as hostpower_controller
from metalmend.controllers import machineremediation as mr_controller
from metalmend.controllers import remediation as m3_controller
from metalmend.controllers.powerreads import BmcPowerReader
from metalmend.kube.store import Store, object_key
from metalmend.kube.writes import merge_patch
from metalmend.policy import hostpower as hostpower_policy
from metalmend.policy import interlock
from metalmend.policy import machineremediation as mr_policy
from metalmend.policy import remediation as policy
from metalmend.policy.fencing import is_remediation_key
from metalmend.settings import FenceMethod, RemediationSettings, RuntimeSettings, Settings
from tests.support import thorough

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NS = "metal3"
HOSTS = ("h1", "h2")
MACHINES = {"m1": "h1", "m2": "h2", "m3": "h1"}  # m3 exists only in the shared-host worlds
POWER = hostpower_policy.PowerSettings(
    soft_timeout=30, poll_interval=20, transition_poll=1, command_retry=10
)
HARD = json.dumps({"mode": "hard"})
OUT_OF_SERVICE = {"key": names.OUT_OF_SERVICE_TAINT, "effect": "NoExecute"}
MR_KEY = names.MACHINE_REMEDIATION_REBOOT
WORKERS = (
    *(f"host-power/{h}" for h in HOSTS),
    *(f"metal3-remediation/{m}" for m in MACHINES),
    *(f"machine-remediation/{h}" for h in HOSTS),
)
# the remediations that can act on h1 (two Machines name it in the shared-host worlds)
CONTENDERS = ("metal3-remediation/m1", "metal3-remediation/m3", "machine-remediation/h1")
TEARDOWN_H1 = "teardown/h1"  # metalmend serve claiming h1 for a teardown of its Node
LANDING_DELAYS = [0, 1, 3, 11, 40]  # seconds until the BMC obeys a power command
BOOT_DELAYS = [0, 5, 30, 90]  # seconds from power-on until the kubelet runs
SYSTEMS = {"h1": "A", "h2": "B"}  # the Redfish system of each host on its endpoint


def node_of_host(host: str) -> str:
    return f"node-{host}"


def original_labels(node: str) -> dict[str, str]:
    return {
        "kubernetes.io/hostname": node,
        "node-role.kubernetes.io/worker": "",
        "topology.kubernetes.io/rack": "r7",  # put there by an admin: the kubelet does not
    }


def original_annotations() -> dict[str, str]:
    return {"node.alpha.kubernetes.io/ttl": "0", "example.com/owner-team": "storage"}


KUBELET_LABELS = ("kubernetes.io/hostname", "node-role.kubernetes.io/worker")
KUBELET_ANNOTATIONS = ("node.alpha.kubernetes.io/ttl",)


def note(what: str) -> None:
    """Count an occurrence in hypothesis' statistics (pytest --hypothesis-show-statistics)."""
    if currently_in_test_context():
        event(what)


class Conflict(Exception):
    """The reconcile ends here (the key is retried later)."""


def api_error(code: int) -> ApiError:
    """The API server's answer, as the controllers get it: 409 (another writer won), 404."""
    return ApiError(status=Status(code=code, message=f"answered {code}"))


# ---- API objects: just enough of lightkube's for the controllers' observe functions -----------


class Obj:
    def __init__(
        self,
        name: str,
        uid: str,
        *,
        annotations: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        finalizers: list[str] | None = None,
        owner: Any = None,
    ) -> None:
        self.metadata = SimpleNamespace(
            name=name,
            namespace=NS,
            uid=uid,
            annotations=dict(annotations or {}),
            labels={},
            finalizers=list(finalizers or []),
            deletionTimestamp=None,
            ownerReferences=[owner] if owner is not None else None,
            resourceVersion=0,
        )
        self.body: dict[str, Any] = body or {}

    def get(self, key: str) -> Any:
        return self.body.get(key)


class NodeObj:
    def __init__(
        self,
        name: str,
        uid: str,
        labels: dict[str, str],
        annotations: dict[str, str],
        ready_since: dt.datetime,
    ) -> None:
        self.metadata = SimpleNamespace(
            name=name,
            namespace=None,
            uid=uid,
            labels=dict(labels),
            annotations=dict(annotations),
            resourceVersion=0,
        )
        self.ready = True
        self.ready_since = ready_since
        self.out_of_service = False

    @property
    def status(self) -> Any:
        ready = SimpleNamespace(
            type="Ready",
            status="True" if self.ready else "False",
            lastTransitionTime=self.ready_since,
        )
        return SimpleNamespace(conditions=[ready])

    @property
    def spec(self) -> Any:
        taint = SimpleNamespace(key=names.OUT_OF_SERVICE_TAINT, to_dict=lambda: OUT_OF_SERVICE)
        return SimpleNamespace(taints=[taint] if self.out_of_service else None)


class FakeManager:
    """What the controllers' constructors take from a Manager: one shared Store per kind."""

    def __init__(self, clock: Callable[[], dt.datetime]) -> None:
        self.client = None
        self.events = None
        self.clock = SimpleNamespace(now=clock)
        self.stores: dict[Any, Store] = {}
        self._shared: dict[str, Any] = {}

    def shared(self, name: str, make: Callable[[], Any]) -> Any:
        return self._shared.setdefault(name, make())

    def informer(self, resource: Any, *, namespace: str | None = None, **kw: Any) -> Any:
        store = self.stores.setdefault(resource, Store())
        for name, func in (kw.get("indexes") or {}).items():
            store.add_index(name, func)
        # the world writes the stores itself: handlers and transforms are never called
        return SimpleNamespace(
            store=store, namespace=namespace, name=str(resource), add_handler=lambda h: None
        )


# ---- the simulated hardware -------------------------------------------------------------------


@dataclass
class Bmc:
    on: bool = True
    landing: tuple[bool, dt.datetime, float, dt.datetime] | None = None  # on?, when, boot, sent
    on_sent_at: dt.datetime | None = None  # when the command that powered it on was sent
    booted_at: dt.datetime = T0
    hung: bool = False
    broken: bool = False


class WorldDriver:
    """A Redfish driver of the simulated world, made (like the real one) for the system its
    host's address names when it is created: it reaches that system and only that one."""

    def __init__(self, world: RemediationWorld, target: BmcTarget) -> None:
        self.world = world
        self.system = (target.address.key, target.address.system_path)

    def _reach(self, what: str) -> Bmc:
        bmc = self.world.systems.get(self.system)
        if bmc is None:  # never a fallback to another system
            raise BadAddress(f"no system {self.system[1]} at {self.system[0]}")
        if bmc.broken:
            raise Unreachable("BMC unreachable")
        self.world.reached.append((self.system, what))
        return bmc

    async def power_state(self) -> PowerState:
        bmc = self._reach("power reading")
        if not bmc.on:  # ground truth for invariant 1: when host-power last read it off
            h = next(h for h, b in self.world.bmcs.items() if b is bmc)
            self.world.off_read[h] = self.world.now
            if bmc.landing is not None and bmc.landing[0]:
                note("host-power reads a host off while a power-on is still to land")
                if (self.world.now - bmc.landing[3]).total_seconds() >= POWER.command_retry:
                    note("... sent command_retry or longer ago")
        return PowerState.ON if bmc.on else PowerState.OFF

    async def act(self, action: PowerAction) -> None:
        bmc = self._reach(f"{action} command")
        delay, boot = self.world.landing_delays
        now = self.world.now
        bmc.landing = (action == PowerAction.ON, now + dt.timedelta(seconds=delay), boot, now)

    async def close(self) -> None:
        pass

    def hang_up(self) -> None:
        pass


T = TypeVar("T")


class CheckedPool(BmcPool):
    """The real BmcPool (its driver cache and slots), with invariant 9 checked on every
    call host-power makes: what the call reached is the system the host's address names."""

    def __init__(self, world: RemediationWorld, **kw: Any) -> None:
        super().__init__(**kw)
        self.world = world

    async def power_state(self, target: BmcTarget, *, background: bool = False) -> PowerState:
        self.world.reached.clear()
        try:
            return await super().power_state(target, background=background)
        finally:
            self.check(target)

    async def act(self, target: BmcTarget, action: PowerAction) -> None:
        self.world.reached.clear()
        try:
            await super().act(target, action)
        finally:
            self.check(target)
        self.world.tick(0)

    def check(self, target: BmcTarget) -> None:
        named = (target.address.key, target.address.system_path)
        for system, what in self.world.reached:
            if system != named:
                self.world.violate(
                    f"invariant 9: a {what} for system {named[1]} reached system"
                    f" {system[1]} at {system[0]}"
                )


class WorldWriter:
    """``kube.writer.Writer`` over the simulated world: the controllers' real executors
    write through it. Versioned writes answer 409 as the API server does, a patch that
    changes nothing sends nothing, and the checks of the invariants run at the writes that
    matter (a Node fenced, a phase reached, an object gone)."""

    def __init__(self, world: RemediationWorld) -> None:
        self.world = world

    def store(self, resource: Any) -> Store:
        store: Store = self.world.manager.stores[resource]
        return store

    async def patch_status(self, resource: Any, obj: Any, status: Mapping[str, Any]) -> Any:
        new = self.world.patch_status(self.store(resource), obj, status)
        if new is not None:
            self.world.status_written(self.store(resource), status)
        return new

    async def patch_metadata(
        self,
        resource: Any,
        obj: Any,
        field: str,
        changes: Mapping[str, str | None],
        *,
        require_version: bool = False,
    ) -> Any | None:
        store = self.store(resource)
        return self.world.patch_map(
            store, obj, field, dict(changes), require_version=require_version
        )

    async def set_finalizers(self, resource: Any, obj: Any, finalizers: Sequence[str]) -> Any:
        world, store = self.world, self.store(resource)
        if list(obj.metadata.finalizers or []) == list(finalizers):
            return None
        live = store.get(object_key(obj))
        if live is None:
            if finalizers:
                raise api_error(404)
            return None
        if live.metadata.resourceVersion != obj.metadata.resourceVersion:
            raise api_error(409)
        if not finalizers and live.metadata.deletionTimestamp is not None:
            store.delete(object_key(live))
            if world.acting is not None:
                world.check_gone(world.acting)
            return None

        def set_finalizers(o: Any) -> None:
            o.metadata.finalizers = list(finalizers)

        return world.changed(store, live, set_finalizers)

    async def set_taints(self, node: Any, taints: Sequence[Mapping[str, str]]) -> Any:
        world = self.world
        live = world.nodes.get(node.metadata.name)
        if live is None:
            raise api_error(404)
        if live.metadata.resourceVersion != node.metadata.resourceVersion:
            raise api_error(409)
        tainted = any(t.get("key") == names.OUT_OF_SERVICE_TAINT for t in taints)
        if tainted and not live.out_of_service:
            world.fenced(live, f"tainted Node {live.metadata.name}")

        def set_taint(n: Any) -> None:
            n.out_of_service = tainted

        return world.changed(world.nodes, live, set_taint)

    async def delete_exact(
        self, resource: Any, name: str, uid: str, *, namespace: str | None = None
    ) -> bool:
        world, store = self.world, self.store(resource)
        key = f"{namespace}/{name}" if namespace else name
        found = store.get(key)
        if found is None or found.metadata.uid != uid:
            return False
        if resource is Node:
            world.fenced(found, f"deleted Node {name}")
            world.node_deleted(found)
            world.workloads_gone(name)
        elif resource is Machine:
            world.machine_deleted(found)
            note("escalation deleted a Machine")
        store.delete(key)
        return True

    async def delete_pods_on(self, node: str) -> None:
        """The fenced Node's pods, deleted at once: only ever while its host is off."""
        world = self.world
        h = node.removeprefix("node-")
        if world.pods.get(node) and h in world.bmcs and world.bmcs[h].on:
            world.violate(f"invariant 12: pods of {node} deleted while host {h} is on")
        world.pods.pop(node, None)

    async def create(self, resource: Any, obj: Any) -> Any:
        raise AssertionError("nothing is created in this model")

    async def power(self, target: Any, action: PowerAction) -> None:
        await self.world.pool.act(target, action)

    async def record_event(self, obj: Any, type_: str, reason: str, message: str) -> None:
        self.world.event_recorded(reason, message)


class WorldEvacuations:
    """``controllers.remediation.Evacuations`` over the world's pods and attachments."""

    def __init__(self, world: RemediationWorld) -> None:
        self.world = world

    async def left_on(self, node: str) -> policy.Evacuation:
        pods = tuple(sorted(self.world.pods.get(node, set())))
        return policy.Evacuation(pods, tuple(sorted(self.world.attachments.get(node, set()))))


@dataclass
class Reconcile:
    """One reconcile in flight: what it decided on, and its copy of the object it writes."""

    obj: Any
    host: Any = None
    observed: Any = None
    decision: Any = None
    host_name: str = ""
    flow: str = ""  # metal3-remediation | machine-remediation | host-power


@dataclass
class Debt:
    """What a Node fenced by a metal3 remediation carried, owed to its successor."""

    labels: dict[str, str]
    annotations: dict[str, str]
    outstanding: bool = True


Step = Callable[[], None]


class RemediationWorld(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.version = 0
        self.uids = 0
        self.bmcs: dict[str, Bmc] = {}  # host -> the system its address names (ground truth)
        self.systems: dict[tuple[str, str], Bmc] = {}  # (endpoint key, system path) -> system
        self.reached: list[tuple[tuple[str, str], str]] = []  # what BMC calls reached
        self.landing_delays: tuple[float, float] = (0, 0)  # of the command being sent
        self.loop = asyncio.new_event_loop()
        # (a CA bundle: the Redfish hosts need something to check certificates against;
        # the simulated drivers never read it)
        bmc_settings = BmcSettings(ca_bundle="/simulated/bmc-ca.crt")
        self.pool = CheckedPool(self, settings=bmc_settings, driver_factory=self.driver_for)
        self.writer = WorldWriter(self)
        self.acting: Reconcile | None = None  # the reconcile whose step is running
        self.inflight: dict[str, list[Step]] = {}
        self.violations: list[str] = []
        self.off_read: dict[str, dt.datetime] = {}  # host -> last BMC read that said off
        self.created_at: dict[str, dt.datetime] = {}  # remediation uid -> creation
        self.key_added_at: dict[tuple[str, str], dt.datetime] = {}  # (host, reboot key)
        self.debts: dict[str, Debt] = {}  # remediation uid -> labels owed
        self.pods: dict[str, set[str]] = {}  # Node name -> pods bound to it
        self.attachments: dict[str, set[str]] = {}  # Node name -> VolumeAttachments naming it
        self.workloads = 0

    # ---- set-up ---------------------------------------------------------------------------------

    @initialize(
        fence=st.sampled_from(
            [FenceMethod.DELETE_NODE, FenceMethod.DELETE_NODE, FenceMethod.OUT_OF_SERVICE_TAINT]
        ),
        two_hosts=st.booleans(),
        shared_host=st.sampled_from([True, True, False]),
        shared_endpoint=st.booleans(),
        first=st.sampled_from(["metal3", "annotation", "both", "all"]),
        starts=st.tuples(*[st.sampled_from(["on", "off", "powering on"])] * len(HOSTS)),
    )
    def build(
        self,
        fence: FenceMethod,
        two_hosts: bool,
        shared_host: bool,
        first: str,
        starts: tuple[str, ...],
        shared_endpoint: bool = False,
    ) -> None:
        """The world at T0. A host starts on; or off (spec.online false, its Node NotReady);
        or powering on (the host controller's "on" sent a second ago, landing in 5s). Its
        system is behind an endpoint of its own, or behind the endpoint both hosts share."""
        self.manager: Any = FakeManager(lambda: self.now)
        self.options = Settings(
            runtime=RuntimeSettings(namespace=NS),
            remediation=RemediationSettings(fence=fence),
            power=POWER,
        )
        self.fence = fence
        self.start_controllers()
        stores = self.manager.stores
        self.hosts: Store = stores[BareMetalHost]
        self.machines: Store = stores[Machine]
        self.rems: Store = stores[Metal3Remediation]
        self.nodes: Store = stores[Node]
        # Bound by name: a '*' Secret goes only inside allowed BMC networks (none here).
        secret = Obj("bmc-admin", "uid-secret", annotations={HOSTS_ANNOTATION: ",".join(HOSTS)})
        secret.data = {"username": "YWRtaW4=", "password": "cHc="}  # type: ignore[attr-defined]
        self.put(stores[Secret], secret)
        hosts = HOSTS if two_hosts else HOSTS[:1]
        hour_ago = T0 - dt.timedelta(hours=1)
        for h, start in zip(hosts, starts, strict=False):
            endpoint = "chassis-1.bmc.example" if shared_endpoint else f"bmc-{h}.bmc.example"
            address = f"redfish://{endpoint}/redfish/v1/Systems/{SYSTEMS[h]}"
            bmc = self.bmcs[h] = Bmc(booted_at=hour_ago)
            parsed = parse(address)
            self.systems[(parsed.key, parsed.system_path)] = bmc
            status: dict[str, Any] = {
                "poweredOn": True,
                "operationalStatus": "OK",
                "provisioning": {
                    "state": names.PROVISIONED,
                    "lastPoweredOn": stamp(hour_ago),
                },
            }
            if start != "on":
                bmc.on, status["poweredOn"] = False, False
            if start == "powering on":
                sent = T0 - dt.timedelta(seconds=1)
                bmc.landing = (True, T0 + dt.timedelta(seconds=5), 30, sent)
                status["lastPowerCommand"] = {"action": "on", "at": stamp(sent)}
            bmc_spec = {"address": address, "credentialsName": "bmc-admin"}
            spec = {"online": start != "off", "bmc": bmc_spec}
            self.put(self.hosts, Obj(h, f"uid-{h}", body={"spec": spec, "status": status}))
            name = node_of_host(h)
            node = NodeObj(
                name,
                self.new_uid("node"),
                original_labels(name),
                original_annotations(),
                ready_since=hour_ago,
            )
            node.ready = start == "on"
            self.put(self.nodes, node)
            self.pods[name], self.attachments[name] = {f"db-{h}"}, {f"va-db-{h}"}
        for m, h in MACHINES.items():
            if h not in hosts or (m == "m3" and not shared_host):
                continue
            machine = Obj(m, f"uid-{m}", annotations={names.MACHINE_HOST: f"{NS}/{h}"})
            machine.body["status"] = {}
            self.put(self.machines, machine)
            self.link(m)
        if first in ("metal3", "both", "all"):
            self.mhc_creates_remediation("m1", "reboot", 3, 30, 60)
        if first in ("annotation", "both"):
            self.mhc_requests_by_annotation("m1")
        if first == "all":
            self.mhc_creates_remediation("m2", "escalate", 1, 30, 60)
            self.mhc_creates_remediation("m3", "reboot", 2, 30, 60)
            self.mhc_requests_by_annotation("m3")

    # ---- helpers: the API -----------------------------------------------------------------------

    def new_uid(self, kind: str) -> str:
        self.uids += 1
        return f"{kind}-{self.uids}"

    def put(self, store: Store, obj: Any) -> Any:
        self.version += 1
        obj.metadata.resourceVersion = self.version
        store.upsert(obj)
        return obj

    def changed(self, store: Store, obj: Any, change: Callable[[Any], None]) -> Any:
        """A new version of ``obj`` (objects in stores are never mutated: a reconcile's copy
        stays what it observed)."""
        new = copy.deepcopy(obj)
        change(new)
        return self.put(store, new)

    def patch_map(
        self,
        store: Store,
        seen: Any,
        field_: str,
        changes: dict[str, str | None],
        *,
        require_version: bool = False,
    ) -> Any | None:
        """kube.writes.patch_metadata_map: the keys needing a change are computed on the
        object as the caller has it; nothing needed, nothing sent."""
        present = getattr(seen.metadata, field_) or {}
        needed = {
            k: v for k, v in changes.items() if (k in present if v is None else present.get(k) != v)
        }
        if not needed:
            return None
        live = store.get(object_key(seen))
        if live is None:
            raise api_error(404)
        if require_version and live.metadata.resourceVersion != seen.metadata.resourceVersion:
            if store is self.hosts and interlock.TEARDOWN_ANNOTATION in needed:
                note("a teardown claim was not written: the host changed since read")
            elif store is self.hosts:
                note("a reboot key was not added: the host changed since observed")
            raise api_error(409)

        if store is self.hosts:
            self.check_interlock(live, needed)
            for k, v in needed.items():
                if v is not None and is_remediation_key(k):
                    self.key_added_at[(seen.metadata.name, k)] = self.now

        def apply(obj: Any) -> None:
            values = getattr(obj.metadata, field_)
            for k, v in needed.items():
                if v is None:
                    values.pop(k, None)
                else:
                    values[k] = v

        return self.changed(store, live, apply)

    def patch_status(self, store: Store, seen: Any, desired: Mapping[str, Any]) -> Any | None:
        """kube.writes.patch_status: merge patch with the resourceVersion decided on."""
        if not merge_patch(seen.get("status") or {}, desired):
            return None
        live = store.get(object_key(seen))
        if live is None or live.metadata.resourceVersion != seen.metadata.resourceVersion:
            raise api_error(409)

        def apply(obj: Any) -> None:
            obj.body["status"] = copy.deepcopy(dict(desired))

        return self.changed(store, live, apply)

    def delete_object(self, store: Store, obj: Any) -> None:
        if obj.metadata.deletionTimestamp is not None:
            return
        if not obj.metadata.finalizers:
            store.delete(object_key(obj))
            return

        def mark(o: Any) -> None:
            o.metadata.deletionTimestamp = self.now

        self.changed(store, obj, mark)

    # ---- helpers: the BMCs, through the real BmcPool --------------------------------------------

    def driver_for(self, target: BmcTarget, vetted_ip: str | None) -> PowerDriver:
        return WorldDriver(self, target)

    def violate(self, message: str) -> None:
        self.violations.append(f"t={(self.now - T0).total_seconds():.3f}s {message}")

    # ---- the world ------------------------------------------------------------------------------

    def tick(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)
        for bmc in self.bmcs.values():
            if bmc.landing is not None and self.now >= bmc.landing[1]:
                target, at, boot, sent = bmc.landing
                bmc.landing = None
                if target != bmc.on:
                    bmc.on, bmc.hung = target, False
                    bmc.booted_at = at + dt.timedelta(seconds=boot)
                    bmc.on_sent_at = sent if target else None

    def running(self, h: str) -> bool:
        bmc = self.bmcs[h]
        return bmc.on and not bmc.hung and self.now >= bmc.booted_at

    @rule(seconds=st.sampled_from([0.5, 2, 5, 15, 40, 130]))
    def time_passes(self, seconds: float) -> None:
        self.tick(seconds)

    @rule(
        what=st.sampled_from(["kubelet", "node monitor", "node-link"]),
        h=st.sampled_from(HOSTS),
        m=st.sampled_from(sorted(MACHINES)),
    )
    def kubernetes(self, what: str, h: str, m: str) -> None:
        if what == "kubelet":
            self.kubelet(h)
        elif what == "node monitor":
            self.node_monitor(h)
        else:
            self.link(m)

    @rule(
        what=st.sampled_from(
            ["hang or recover", "BMC breaks or heals", "Node deleted", "online flips"]
        ),
        h=st.sampled_from(HOSTS),
    )
    def fault(self, what: str, h: str) -> None:
        if what == "hang or recover":
            self.host_hangs_or_recovers(h)
        elif what == "BMC breaks or heals":
            self.bmc_breaks_or_heals(h)
        elif what == "Node deleted":
            self.someone_deletes_the_node(h)
        else:
            self.flip_online(h)

    @rule(
        what=st.sampled_from(["create", "delete", "request", "withdraw", "garbage collector"]),
        m=st.sampled_from(sorted(MACHINES)),
        strategy=st.sampled_from(["reboot", "escalate"]),
        retries=st.sampled_from([1, 2, 3]),
        off_timeout=st.sampled_from([5, 30, 120]),
        on_timeout=st.sampled_from([20, 60, 300]),
    )
    def health_check(
        self, what: str, m: str, strategy: str, retries: int, off_timeout: int, on_timeout: int
    ) -> None:
        """The MachineHealthCheck (and the garbage collector): remediation objects created
        and deleted, the annotation-based flow's annotation set and removed, at random moments."""
        if what == "create":
            self.mhc_creates_remediation(m, strategy, retries, off_timeout, on_timeout)
        elif what == "delete":
            self.mhc_deletes_remediation(m)
        elif what == "request":
            self.mhc_requests_by_annotation(m)
        elif what == "withdraw":
            self.mhc_withdraws_annotation(m)
        else:
            self.garbage_collector()

    def kubelet(self, h: str) -> None:
        """A running host has a Ready Node: registered anew (new uid, only the labels the
        kubelet sets) if it was deleted."""
        if h not in self.bmcs or not self.running(h):
            return
        name = node_of_host(h)
        node = self.nodes.get(name)
        since = self.now.replace(microsecond=0)
        if node is None:
            labels = {k: v for k, v in original_labels(name).items() if k in KUBELET_LABELS}
            kept = {k: v for k, v in original_annotations().items() if k in KUBELET_ANNOTATIONS}
            self.put(self.nodes, NodeObj(name, self.new_uid("node"), labels, kept, since))
        elif not node.ready:

            def ready(n: Any) -> None:
                n.ready, n.ready_since = True, since

            self.changed(self.nodes, node, ready)

    def node_monitor(self, h: str) -> None:
        """The node lifecycle controller: a Node whose kubelet stopped turns NotReady."""
        node = self.nodes.get(node_of_host(h))
        if h not in self.bmcs or node is None or not node.ready or self.running(h):
            return

        def not_ready(n: Any) -> None:
            n.ready, n.ready_since = False, self.now.replace(microsecond=0)

        self.changed(self.nodes, node, not_ready)

    def link(self, m: str) -> None:
        machine = self.machines.get(f"{NS}/{m}")
        if machine is None:
            return
        node = self.nodes.get(node_of_host(MACHINES[m]))
        if node is None:
            return  # node-link keeps a nodeRef whose Node is gone (policy.nodelink)
        wanted = {"apiVersion": "v1", "kind": "Node", "name": node.metadata.name}
        wanted["uid"] = node.metadata.uid
        if (machine.get("status") or {}).get("nodeRef") == wanted:
            return

        def relink(obj: Any) -> None:
            obj.body.setdefault("status", {})["nodeRef"] = wanted

        self.changed(self.machines, machine, relink)

    def someone_deletes_the_node(self, h: str) -> None:
        self.nodes.delete(node_of_host(h))
        self.workloads_gone(node_of_host(h))

    def workloads_gone(self, node: str) -> None:
        """A Node object deleted: pod GC removes its pods, and its attachments go."""
        self.pods.pop(node, None)
        self.attachments.pop(node, None)

    @rule(what=st.sampled_from(["scheduler", "controller-manager"]), h=st.sampled_from(HOSTS))
    def workloads(self, what: str, h: str) -> None:
        if what == "scheduler":
            self.schedule(h)
        else:
            self.evict(h)

    def schedule(self, h: str) -> None:
        """A pod with a volume lands on a Ready Node without the out-of-service taint."""
        name = node_of_host(h)
        node = self.nodes.get(name)
        if node is None or not node.ready or node.out_of_service:
            return
        self.workloads += 1
        self.pods.setdefault(name, set()).add(f"p{self.workloads}")
        self.attachments.setdefault(name, set()).add(f"va-p{self.workloads}")

    def evict(self, h: str) -> None:
        """kube-controller-manager on a tainted Node: a pod force-deleted (taint manager and
        pod GC), or, once no pod is left, an attachment detached."""
        name = node_of_host(h)
        node = self.nodes.get(name)
        if node is None or not node.out_of_service:
            return
        pods, attachments = self.pods.get(name, set()), self.attachments.get(name, set())
        if pods:
            pods.remove(min(pods))
            note("a tainted Node's pod removed")
        elif attachments:
            attachments.remove(min(attachments))
            note("a tainted Node's volume detached")

    def host_hangs_or_recovers(self, h: str) -> None:
        if h in self.bmcs:
            self.bmcs[h].hung = not self.bmcs[h].hung

    def bmc_breaks_or_heals(self, h: str) -> None:
        if h in self.bmcs:
            self.bmcs[h].broken = not self.bmcs[h].broken

    def flip_online(self, h: str) -> None:
        host = self.hosts.get(f"{NS}/{h}")
        if host is not None:

            def flip(obj: Any) -> None:
                obj.body["spec"]["online"] = not obj.body["spec"]["online"]

            self.changed(self.hosts, host, flip)

    # ---- the health check and the garbage collector --------------------------------------------

    def mhc_creates_remediation(
        self, m: str, strategy: str, retries: int, off_timeout: int, on_timeout: int
    ) -> None:
        machine = self.machines.get(f"{NS}/{m}")
        if machine is None or self.rems.get(f"{NS}/{m}") is not None:
            return
        owner = SimpleNamespace(
            apiVersion="cluster.x-k8s.io/v1beta1", kind="Machine", name=m, uid=machine.metadata.uid
        )
        spec = {
            "strategy": strategy,
            "deleteAfterRetries": retries,
            "powerOffTimeoutSeconds": off_timeout,
            "powerOnTimeoutSeconds": on_timeout,
        }
        rem = Obj(m, self.new_uid("rem"), body={"spec": spec, "status": {}}, owner=owner)
        self.created_at[rem.metadata.uid] = self.now
        self.put(self.rems, rem)

    def mhc_deletes_remediation(self, m: str) -> None:
        rem = self.rems.get(f"{NS}/{m}")
        if rem is not None:
            self.delete_object(self.rems, rem)

    def mhc_requests_by_annotation(self, m: str) -> None:
        machine = self.machines.get(f"{NS}/{m}")
        if machine is None or names.EXTERNAL_REMEDIATION in machine.metadata.annotations:
            return
        self.patch_map(self.machines, machine, "annotations", {names.EXTERNAL_REMEDIATION: ""})

    def mhc_withdraws_annotation(self, m: str) -> None:
        machine = self.machines.get(f"{NS}/{m}")
        if machine is not None:
            self.patch_map(
                self.machines, machine, "annotations", {names.EXTERNAL_REMEDIATION: None}
            )

    def garbage_collector(self) -> None:
        """A remediation whose owner Machine is gone is deleted (its finalizer still runs)."""
        for rem in list(self.rems.values()):
            owner = rem.metadata.ownerReferences[0]
            machine = self.machines.get(f"{NS}/{owner.name}")
            if machine is None or machine.metadata.uid != owner.uid:
                self.delete_object(self.rems, rem)

    # ---- controllers: observe and decide now, write step by step --------------------------------

    def plan(self, worker: str, delay: float, boot: float) -> list[Step]:
        kind, _, name = worker.partition("/")
        self.tick(0.001)  # every reconcile at its own instant
        if kind == "host-power":
            return self.plan_host_power(name, delay, boot)
        if kind == "metal3-remediation":
            return self.plan_metal3(name)
        if kind == "teardown":
            return self.plan_teardown(name)
        return self.plan_annotation_flow(name)

    def advance(self, worker: str, count: int | None) -> None:
        steps = self.inflight.get(worker)
        while steps and (count is None or count > 0):
            step = steps.pop(0)
            try:
                step()
            except (ApiError, Conflict, LookupError):  # 409/404, or a host gone: ends here
                steps.clear()
            if count is not None:
                count -= 1
        if not steps:
            self.inflight.pop(worker, None)

    def run_fully(self, worker: str, delay: float, boot: float) -> None:
        if worker not in self.inflight:
            self.inflight[worker] = self.plan(worker, delay, boot)
        self.advance(worker, None)

    @rule(
        worker=st.sampled_from(WORKERS),
        delay=st.sampled_from(LANDING_DELAYS),
        boot=st.sampled_from(BOOT_DELAYS),
    )
    def observe(self, worker: str, delay: float, boot: float) -> None:
        """A reconcile reads and decides; its writes are still to come."""
        if worker not in self.inflight:
            self.inflight[worker] = self.plan(worker, delay, boot)

    @rule(worker=st.sampled_from(WORKERS), count=st.integers(1, 3))
    def write(self, worker: str, count: int) -> None:
        self.advance(worker, count)

    @rule(
        worker=st.sampled_from(WORKERS),
        delay=st.sampled_from(LANDING_DELAYS),
        boot=st.sampled_from(BOOT_DELAYS),
    )
    def reconcile(self, worker: str, delay: float, boot: float) -> None:
        self.run_fully(worker, delay, boot)

    @rule(
        order=st.permutations(WORKERS),
        rounds=st.integers(1, 8),
        seconds=st.sampled_from([0.5, 2, 5, 15]),
        delay=st.sampled_from(LANDING_DELAYS),
        boot=st.sampled_from(BOOT_DELAYS),
    )
    def everyone_reconciles(
        self, order: list[str], rounds: int, seconds: float, delay: float, boot: float
    ) -> None:
        """Rounds of everything: time, kubelets, node monitor, node-link, every controller."""
        for _ in range(rounds):
            self.tick(seconds)
            self.world_round()
            for worker in order:
                self.run_fully(worker, delay, boot)

    @rule(
        order=st.lists(st.sampled_from(WORKERS), min_size=1, unique=True),
        rounds=st.integers(1, 8),
        seconds=st.sampled_from([0.5, 2, 5, 15]),
        delay=st.sampled_from(LANDING_DELAYS),
        boot=st.sampled_from(BOOT_DELAYS),
    )
    def some_reconcile(
        self, order: list[str], rounds: int, seconds: float, delay: float, boot: float
    ) -> None:
        """Rounds in which only some controllers run: the others lag (slow, restarting, or
        their watch events delayed)."""
        self.everyone_reconciles(order, rounds, seconds, delay, boot)

    def world_round(self) -> None:
        for h in self.bmcs:
            self.kubelet(h)
            self.node_monitor(h)
        for m in MACHINES:
            self.link(m)

    @rule(
        pair=st.lists(st.sampled_from(WORKERS), min_size=2, max_size=2, unique=True),
        delay=st.sampled_from(LANDING_DELAYS),
        boot=st.sampled_from(BOOT_DELAYS),
    )
    def concurrently(self, pair: list[str], delay: float, boot: float) -> None:
        """Two reconciles read the same state, then write one after the other."""
        for worker in pair:
            self.observe(worker, delay, boot)
        for worker in pair:
            self.advance(worker, None)

    @rule(order=st.permutations(CONTENDERS))
    def race_for_h1(self, order: list[str]) -> None:
        """Every remediation that can act on h1 reads, then each writes, in some order."""
        self.concurrently(order, 0, 0)

    @rule(order=st.permutations((*CONTENDERS, TEARDOWN_H1)))
    def teardown_races_for_h1(self, order: list[str]) -> None:
        """A teardown of h1's Node and every remediation that can act on h1 read, then each
        writes, in some order (invariant 7)."""
        self.concurrently(order, 0, 0)

    @rule(
        what=st.sampled_from(["reads", "writes", "claims", "operator releases"]),
        h=st.sampled_from(HOSTS),
    )
    def node_teardown(self, what: str, h: str) -> None:
        """metalmend serve claiming a host for a teardown of its Node (read and decided now,
        written later or at once), or an operator releasing the claim."""
        worker = f"teardown/{h}"
        if what == "reads" and worker not in self.inflight:
            self.inflight[worker] = self.plan_teardown(h)
        elif what == "writes":
            self.advance(worker, None)
        elif what == "claims":
            self.run_fully(worker, 0, 0)
        else:
            host = self.hosts.get(f"{NS}/{h}")
            if host is not None:
                self.patch_map(
                    self.hosts, host, "annotations", {interlock.TEARDOWN_ANNOTATION: None}
                )

    @rule(worker=st.sampled_from(WORKERS))
    def crash(self, worker: str) -> None:
        """The reconcile dies between two writes (or the process with it)."""
        self.inflight.pop(worker, None)

    @rule()
    def restart(self) -> None:
        """metalmend restarts: reconciles in flight are lost, and so is every controller's
        memory (host-power's commands sent and retry schedules)."""
        self.inflight.clear()
        self.start_controllers()

    def start_controllers(self) -> None:
        """The real controllers, on the world's caches, writing through the world."""
        manager, options, writer = self.manager, self.options, self.writer
        self.hp = hostpower_controller.HostPowerController(
            manager, options, writer=writer, bmcs=self.pool
        )
        self.hp.random = random.Random(0)  # retry jitter: the same run replays the same
        reader = BmcPowerReader(manager, options, pool=self.pool)
        self.m3 = m3_controller.RemediationController(
            manager, options, writer, reader=reader, evacuations=WorldEvacuations(self)
        )
        self.mr = mr_controller.MachineRemediationController(manager, options, writer)

    # ---- host power: controllers/hostpower.py, its real observe / decide / act ------------

    def plan_host_power(self, h: str, delay: float, boot: float) -> list[Step]:
        """``HostPowerController.reconcile`` split where a crash or another controller can
        come in: ``observe`` (cache, memory, BMC read) and ``decide`` now, then each action
        a step (the memory it changes kept with the action before it, as one await). A
        host not read (gone, waiting for its schedule, its BMC busy or failing) is
        reported at once."""
        attempt = self.run(self.hp.observe(f"{NS}/{h}"))
        decision = self.hp.decide(attempt)
        if not isinstance(attempt.observed.bmc, hostpower_policy.PowerRead):
            self.run(self.hp.carry_out(attempt, decision))
            return []
        ctx = Reconcile(obj=attempt.host, host_name=h, decision=decision, flow="host-power")
        current = [attempt]

        def act(actions: list[hostpower_policy.Step]) -> None:
            for action in actions:
                if isinstance(action, hostpower_policy.SendPower):
                    self.landing_delays = (delay, boot)
                done = self.run(self.hp.act(current[0], action), ctx)
                if not isinstance(done, hostpower_controller.Attempt):
                    # the BMC refused the command, or the API server a write: reported, ends
                    self.run(self.hp.end(current[0], done), ctx)
                    raise Conflict("attempt ended")
                current[0] = done

        grouped: list[list[hostpower_policy.Step]] = []
        for action in decision.actions:
            if isinstance(action, hostpower_policy.Remember) and grouped:
                grouped[-1].append(action)
            else:
                grouped.append([action])
        return [functools.partial(act, actions) for actions in grouped]

    # ---- metal3-remediation: controllers/remediation.py, its real plan and act ------------

    def plan_metal3(self, m: str) -> list[Step]:
        planned = self.run(self.m3.plan(f"{NS}/{m}"))
        if planned is None:
            return []
        ctx = Reconcile(
            obj=planned.remediation,
            host=planned.host,
            observed=planned.observed,
            decision=planned.decision,
            flow="metal3-remediation",
        )

        def act(action: policy.Action) -> None:
            ctx.obj = self.run(self.m3.act(ctx.obj, action, ctx.host), ctx) or ctx.obj

        return [functools.partial(act, action) for action in planned.decision.actions]

    def run(self, work: Awaitable[T], ctx: Reconcile | None = None) -> T:
        """Run one controller coroutine to its end; ``ctx``: whose step it is (the checks
        at the world's writes read it)."""
        self.acting = ctx
        try:
            return self.loop.run_until_complete(work)
        finally:
            self.acting = None

    # ---- what the writes of a reconcile tell the checks ---------------------------------

    def fenced(self, node: Any, what: str) -> None:
        """A Node is deleted or tainted out-of-service: invariant 1 for the flow doing it."""
        ctx = self.acting
        assert ctx is not None, "a Node fenced outside any reconcile"
        seen = ctx.host if ctx.flow == "metal3-remediation" else ctx.obj
        live = self.hosts.get(object_key(seen)) if seen is not None else None
        if live is not None and interlock.TEARDOWN_ANNOTATION in live.metadata.annotations:
            self.violate(f"invariant 7: {what} while a teardown claims {live.metadata.name}")
        if ctx.flow == "metal3-remediation":
            uid = ctx.obj.metadata.uid
            key = m3_controller.reboot_key(ctx.obj)
            self.check_fence(ctx.host, key, self.created_at[uid], what)
            if what.startswith("tainted"):
                confirm = self.options.remediation.confirm_reads
                reads = ctx.observed.progress.off_reads
                if ctx.observed.progress.phase != policy.FENCING or reads < confirm:
                    self.violate(
                        f"invariant 12: {what} with {reads} of {confirm} confirming reads"
                        f" (phase {ctx.observed.progress.phase})"
                    )
            note(f"metal3-remediation {what.split()[0]} a Node")
        else:
            # The annotation-based flow is keyed by host: its request is its reboot key (a
            # Machine asking while the key is held joins that request).
            since = self.key_added_at[(ctx.host_name, MR_KEY)]
            self.check_fence(ctx.obj, MR_KEY, since, what)
            note("machine-remediation deleted a Node")

    def machine_deleted(self, machine: Any) -> None:
        """Escalation deletes a Machine: invariant 7, its host not claimed by a teardown."""
        host = self.hosts.get(f"{NS}/{MACHINES[machine.metadata.name]}")
        if host is not None and interlock.TEARDOWN_ANNOTATION in host.metadata.annotations:
            self.violate(
                f"invariant 7: Machine {machine.metadata.name} deleted by escalation while a"
                f" teardown claims {host.metadata.name}"
            )

    def node_deleted(self, node: Any) -> None:
        ctx = self.acting
        if ctx is None or ctx.flow != "metal3-remediation":
            return
        uid = ctx.obj.metadata.uid
        debt = self.debts.get(uid)
        if debt is None:
            labels, kept = dict(node.metadata.labels), dict(node.metadata.annotations)
            self.debts[uid] = Debt(labels, kept)
        else:
            debt.outstanding = True

    def status_written(self, store: Store, status: Mapping[str, Any]) -> None:
        ctx = self.acting
        if store is not self.rems or ctx is None or ctx.flow != "metal3-remediation":
            return
        phase = status.get("phase")
        note(f"metal3-remediation phase {phase or '(none)'}")
        if phase == policy.WAITING and ctx.observed.progress.phase != policy.WAITING:
            self.check_restored(ctx, "reached waiting")

    def event_recorded(self, reason: str, message: str) -> None:
        if reason == names.REASON_WAITING_FOR_HOST and "host-power" in message:
            note("metal3-remediation waits: host-power has not seen its key withdrawn")
        elif reason == names.REASON_WAITING_FOR_HOST:
            note("metal3-remediation waits: another remediation holds the host")

    # ---- teardown: teardown.interlock's claim, by policy.interlock's rule -------------------

    def plan_teardown(self, h: str) -> list[Step]:
        """As ``teardown.interlock.Interlock.claim``: the host read, then what could hold it
        (the remediations of its Machines, their requests), ``decide_claims``, and the claim
        written conditional on the host as read (a step of its own: anything may come
        between)."""
        host = self.hosts.get(f"{NS}/{h}")
        if host is None:
            return []
        key = object_key(host)
        mine = {m for m, named in MACHINES.items() if named == h}
        remediations = tuple(
            interlock.RemediationFacts(
                object_key(rem), str((rem.get("status") or {}).get("phase") or "")
            )
            for rem in self.rems.values()
            if rem.metadata.ownerReferences[0].name in mine
            or (rem.get("status") or {}).get("host") == key
        )
        requests = tuple(
            object_key(machine)
            for m in sorted(mine)
            if (machine := self.machines.get(f"{NS}/{m}")) is not None
            and names.EXTERNAL_REMEDIATION in machine.metadata.annotations
        )
        facts = interlock.HostFacts(key, dict(host.metadata.annotations), remediations, requests)
        node = self.nodes.get(node_of_host(h))
        uid = node.metadata.uid if node is not None else ""
        view = interlock.TeardownView(node_of_host(h), uid, "drain", "model", (facts,))
        decision = interlock.decide_claims(view, self.now)
        if decision.refused:
            note("teardown refused: a remediation holds the host")
            return []

        def claim(value: str) -> None:
            self.patch_map(self.hosts, host, "annotations",
                           {interlock.TEARDOWN_ANNOTATION: value}, require_version=True)  # fmt: skip
            note("teardown claimed a host")

        return [functools.partial(claim, c.value) for c in decision.claims]

    def check_interlock(self, live: Any, needed: Mapping[str, str | None]) -> None:
        """Invariant 7 at a host write: a remediation key never added while a teardown
        claim is on the host, a claim never written while a remediation key is."""
        annotations = live.metadata.annotations
        claimed = interlock.TEARDOWN_ANNOTATION in annotations
        held = sorted(k for k in annotations if is_remediation_key(k))
        escalating = names.ESCALATING in annotations
        name = live.metadata.name
        for k, v in needed.items():
            if v is not None and is_remediation_key(k) and claimed:
                self.violate(f"invariant 7: {k} added to {name} while a teardown claims it")
            if v is not None and k == interlock.TEARDOWN_ANNOTATION and held:
                self.violate(f"invariant 7: {name} claimed for teardown while {held} holds it")
            if v is not None and k == interlock.TEARDOWN_ANNOTATION and escalating:
                self.violate(f"invariant 7: {name} claimed for teardown while being escalated")
            if v is not None and k == names.ESCALATING and claimed:
                self.violate(f"invariant 7: {name} marked for escalation while claimed")

    # ---- annotation-based flow: controllers/machineremediation.py -------------------------------------------

    def plan_annotation_flow(self, h: str) -> list[Step]:
        """machine-remediation's real ``observe`` and ``decide`` now, then its real ``act``
        through the world's Writer, one action per step."""
        key = f"{NS}/{h}"
        host = self.hosts.get(key)
        if host is None:
            return []
        quiet = logging.getLogger(mr_controller.__name__)
        quiet.disabled = True  # "several Machines name one host": that is the point here
        try:
            view = self.mr.observe(key, host)
        finally:
            quiet.disabled = False
        decision = mr_policy.decide(view, self.now)
        ctx = Reconcile(obj=host, host=host, observed=view, decision=decision, host_name=h,
                        flow="machine-remediation")  # fmt: skip
        for told in decision.events:
            if "being remediated by" in told.message:
                note("machine-remediation waits: another remediation holds the host")
            elif "withdrawn" in told.message:
                note("machine-remediation waits: host-power has not seen its key withdrawn")
        machine = [self.machines.get(view.machine) if view.machine else None]

        def act(action: mr_policy.Action) -> None:
            machine[0] = self.run(self.mr.act(host, machine[0], action), ctx) or machine[0]

        return [functools.partial(act, action) for action in decision.actions]

    # ---- checks ----------------------------------------------------------------------------------

    def check_fence(self, seen: Any, key: str, since: dt.datetime, what: str) -> None:
        """Invariant 1, against ground truth, when a Node is deleted or tainted. ``seen``: the
        host as the fencing decision observed it; ``key``: the fencing remediation's. The
        evidence must be a BMC reading taken after ``since`` (the remediation began) and
        after this key was last added (the current attempt)."""
        h = seen.metadata.name
        flow = f"{key.removeprefix(names.REBOOT_PREFIX)} {what}"
        bmc, read = self.bmcs[h], self.off_read.get(h)
        if bmc.on:
            self.violate(f"invariant 1: {flow} while host {h} is powered on")
        added = self.key_added_at.get((h, key))
        since = max(since, added) if added is not None else since
        if read is None or read < since:
            when = (since - T0).total_seconds()
            self.violate(
                f"invariant 1: {flow}: the host controller has not read {h} off since this"
                f" attempt began (t={when:.3f}s)"
            )

    def check_restored(self, ctx: Reconcile, moment: str) -> None:
        """Invariant 3 at the moment a decision that saw the Node back is carried out."""
        uid = ctx.obj.metadata.uid
        debt = self.debts.get(uid)
        seen = ctx.observed.node
        if debt is None or not debt.outstanding or seen is None:
            return
        node = self.nodes.get(seen.name)
        if node is None or node.metadata.uid != seen.uid:
            note("label check inconclusive: the Node changed meanwhile")
            return
        lost = {k for k, v in debt.labels.items() if node.metadata.labels.get(k) != v}
        lost |= {k for k, v in debt.annotations.items() if node.metadata.annotations.get(k) != v}
        if lost:
            self.violate(f"invariant 3: {moment}: Node {seen.name} lacks {sorted(lost)}")
        else:
            debt.outstanding = False
            note("labels restored")

    def check_gone(self, ctx: Reconcile) -> None:
        """Invariant 3 when the object goes: restored, or a Warning said what was not."""
        uid = ctx.obj.metadata.uid
        debt = self.debts.get(uid)
        if debt is None or not debt.outstanding:
            return
        reasons = {a.reason for a in ctx.decision.actions if isinstance(a, policy.Event)}
        if names.REASON_BACKUP_LOST in reasons:
            note("NodeLabelsNotRestored")
            return
        if not ctx.observed.machine_found:
            note("labels not restored: the Machine is gone")
            return
        seen = ctx.observed.node
        fenced = ctx.observed.progress.fenced_node_uid if self.fence == "delete-node" else None
        if seen is not None and seen.uid != fenced:
            self.check_restored(ctx, "object deleted")
            return
        lost = sorted({*debt.labels, *debt.annotations} - {*KUBELET_LABELS, *KUBELET_ANNOTATIONS})
        self.violate(
            f"invariant 3: {object_key(ctx.obj)} went away with its Node not back and without"
            f" a {names.REASON_BACKUP_LOST} Warning: {lost} are lost"
        )

    @invariant()
    def one_remediation_per_host(self) -> None:
        for host in self.hosts.values():
            keys = sorted(k for k in host.metadata.annotations if is_remediation_key(k))
            if len(keys) > 1:
                self.violate(f"invariant 4: {host.metadata.name} carries {keys}")

    @invariant()
    def taint_only_while_off_or_evacuated(self) -> None:
        for node in self.nodes.values():
            if not node.out_of_service:
                continue
            name = node.metadata.name
            h = name.removeprefix("node-")
            left = sorted(self.pods.get(name, set()) | self.attachments.get(name, set()))
            if self.bmcs[h].on and left:
                self.violate(f"invariant 12: {name} tainted, host {h} on, {left} still on it")

    @invariant()
    def no_violation(self) -> None:
        assert not self.violations, "\n".join(self.violations)

    # ---- settle: invariant 2 -------------------------------------------------------------------

    @rule()
    def settle(self) -> None:
        """Faults stop, every request is withdrawn (the health check finds the Nodes healthy)
        and everything runs until quiet: every online host is on, no remediation key left."""
        self.inflight.clear()
        for bmc in self.bmcs.values():
            bmc.broken = bmc.hung = False
        for rem in list(self.rems.values()):
            self.delete_object(self.rems, rem)
        for m in MACHINES:
            self.mhc_withdraws_annotation(m)
        for _ in range(150):
            self.tick(3)
            self.world_round()
            for worker in WORKERS:
                self.run_fully(worker, delay=1, boot=5)
            if self.quiet():
                break
        for host in self.hosts.values():
            h = host.metadata.name
            keys = sorted(k for k in host.metadata.annotations if is_remediation_key(k))
            if keys:
                self.violate(f"invariant 2: {h} still carries {keys} after settling")
            if host.body["spec"]["online"] and not self.bmcs[h].on:
                self.violate(f"invariant 2: online host {h} left off after settling")
        if self.rems.values():
            self.violate(f"settle: remediations never went away: {self.rems.keys()}")
        for node in self.nodes.values():
            if node.out_of_service:
                self.violate(f"settle: {node.metadata.name} left tainted out-of-service")
        note("settled")

    def quiet(self) -> bool:
        if self.rems.values() or self.inflight:
            return False
        for host in self.hosts.values():
            h, bmc = host.metadata.name, self.bmcs[host.metadata.name]
            if any(is_remediation_key(k) for k in host.metadata.annotations):
                return False
            if bmc.landing is not None or bmc.on != host.body["spec"]["online"]:
                return False
            if bmc.on and self.nodes.get(node_of_host(h)) is None:
                return False
        return True

    def teardown(self) -> None:
        try:
            if not self.violations:
                self.settle()
                assert not self.violations, "\n".join(self.violations)
        finally:
            self.loop.run_until_complete(self.pool.close())
            self.loop.close()


RemediationWorld.TestCase.settings = settings(
    max_examples=thorough(100, 500),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_remediation_state_machine = RemediationWorld.TestCase
# Seconds on an idle machine, but hundreds of examples: on a busy one (CI beside other
# jobs) it may run far past pytest's default 300 s without being stuck.
test_remediation_state_machine.pytestmark = [pytest.mark.timeout(1200)]  # type: ignore[attr-defined]


# ---- bugs this model found, replayed step by step ----------------------------------------------
# Each replay failed before its fix; the state machine above fails on any of them.


def strict_world(first: str, start: str) -> RemediationWorld:
    world = RemediationWorld()
    world.build(
        fence="delete-node", two_hosts=False, shared_host=False, first=first, starts=(start, "on")
    )
    return world


def reconcile(world: RemediationWorld, *workers: str, delay: float = 0, boot: float = 0) -> None:
    for worker in workers:
        world.reconcile(worker, delay, boot)


def test_a_power_on_in_flight_is_never_forgotten_when_a_reboot_key_arrives() -> None:
    """Found by this model, fixed: policy.hostpower cleared lastPowerCommand "on" as soon as
    it reads the power it now
    wants (off, because a reboot key arrived), although the "on" it sent may still land;
    policy.fencing then reports the host off ("not in the middle of powering it on")."""
    world = strict_world(first="metal3", start="powering on")  # "on" sent at T0-1s, lands T0+5s
    m3 = "metal3-remediation/m1"
    reconcile(world, m3, m3)  # finalizer; reboot key added
    reconcile(world, "host-power/h1")  # reads off: pendingRebootSince; lastPowerCommand cleared
    reconcile(world, m3)  # reported off -> phase fencing
    world.restart()  # metalmend restarts: the fencing reconcile comes after the host booted
    world.bmc_breaks_or_heals("h1")  # and the BMC does not answer reads for a while
    world.time_passes(40)  # the "on" lands at T0+5s; the host boots
    world.kubelet("h1")  # its Node is Ready again: pods may run there
    reconcile(world, "host-power/h1")  # cannot read the BMC: status still says off
    reconcile(world, m3)  # fencing: deletes the Node of a running host
    assert not world.violations, world.violations


def test_a_retry_remembers_the_deleted_node_and_deletion_keeps_its_labels() -> None:
    """Found by this model, fixed: a new attempt reset status.fencedNodeUID; deletion
    decides whether to wait for the
    Node (to restore the backup) on fencedNodeUID, so the backup is dropped silently."""
    world = strict_world(first="metal3", start="on")  # reboot, powerOnTimeout 60s
    m3 = "metal3-remediation/m1"
    reconcile(world, m3, m3)  # finalizer; reboot key added
    reconcile(world, "host-power/h1", "host-power/h1")  # hard off; reads off
    reconcile(world, m3, m3)  # reported off -> fencing; backup, Node deleted, power-on
    reconcile(world, "host-power/h1")  # powers on
    world.host_hangs_or_recovers("h1")  # hangs before its kubelet registers the Node
    world.time_passes(61)
    reconcile(world, m3)  # attempt 1 failed: backoff 30s (fencedNodeUID kept)
    world.time_passes(31)
    reconcile(world, m3)  # attempt 2: power-off requested, fencedNodeUID reset
    world.mhc_deletes_remediation("m1")
    reconcile(world, m3)  # released, finalizer removed: no restore, no Warning
    assert not world.violations, world.violations


def test_fencing_never_trusts_an_off_report_older_than_its_own_request() -> None:
    """Found by this model, fixed : "reported off" meant pendingRebootSince
    later than lastPoweredOn. A withdrawn reboot request leaves that true while the host
    stays off, so a later remediation's key made the host "reported off" at once, on a BMC
    reading older than its request (a host powered on from outside meanwhile would have
    been fenced running). Now host-power lists each key it read the host off for
    (status.poweredOffFor) and fencing waits for its own key there."""
    world = strict_world(first="metal3", start="off")  # spec.online false, host off
    m3 = "metal3-remediation/m1"
    reconcile(world, m3, m3)  # finalizer; reboot key added
    reconcile(world, "host-power/h1")  # reads off: pendingRebootSince, poweredOffFor [key]
    world.mhc_deletes_remediation("m1")
    reconcile(world, m3)  # key removed, finalizer removed
    world.time_passes(130)
    world.mhc_creates_remediation("m1", "reboot", 3, 30, 60)
    reconcile(world, m3, m3, m3)  # finalizer; key; was "reported off" at once -> fencing
    reconcile(world, m3)  # was: Node deleted; the host controller has not read the BMC since
    assert not world.violations, world.violations
    rem = world.rems.get(f"{NS}/m1")
    assert rem is not None
    assert rem.body["status"]["phase"] == policy.POWER_OFF
    assert world.nodes.get("node-h1") is not None  # nothing fenced on the old reading
    reconcile(world, "host-power/h1")  # reads off while the new key is there: acknowledged
    reconcile(world, m3, m3)  # reported off -> fencing; Node deleted
    assert world.nodes.get("node-h1") is None
    assert not world.violations, world.violations


def test_fencing_never_trusts_an_off_report_while_a_power_on_may_still_land() -> None:
    """Found by this model, fixed: host-power forgot a power-on it had sent once
    ``command_retry`` passed without the BMC obeying it, even while a reboot key held the
    host off; a slow BMC then carried the "on" out after metal3-remediation, seeing the host
    off and no "on" in flight, had fenced: a Node deleted while its server runs. Here the
    annotation-based flow powers h1 off and releases it, host-power sends "on" to a BMC that takes
    11 s, and a Metal3Remediation asks for h1 meanwhile. Now an unobeyed "on" stays on
    record until the host is read on, and the key is listed only after it was powered off
    again."""
    world = strict_world(first="annotation", start="on")  # m1 asks by annotation
    mr, hp, m3 = "machine-remediation/h1", "host-power/h1", "metal3-remediation/m1"
    reconcile(world, mr)  # the annotation-based flow's reboot key
    reconcile(world, hp, hp)  # hard off (lands at once); reads off: key listed
    reconcile(world, mr)  # reported off: Node deleted
    world.link("m1")  # nodeRef gone
    reconcile(world, mr, mr)  # remediation request removed; reboot key removed
    reconcile(world, hp, delay=11)  # no key: "on" sent, the BMC carries it out in 11 s
    world.mhc_creates_remediation("m1", "reboot", 3, 30, 60)
    reconcile(world, m3, m3)  # finalizer; its reboot key added: the host must stay off
    world.time_passes(10)  # command_retry (10 s here) passes, the "on" not obeyed yet
    reconcile(world, hp)  # reads off; was: the "on" forgotten. Now kept on record
    reconcile(world, hp)  # was: reads off, nothing on record: the new key listed
    reconcile(world, m3)  # was: reported off -> fencing
    world.time_passes(2)  # the "on" lands, the host boots...
    world.kubelet("h1")  # ...and its kubelet registers a Node, where pods may run
    world.link("m1")  # the Machine's nodeRef names it
    reconcile(world, m3)  # was: that Node deleted while its server runs
    assert not world.violations, world.violations
    assert world.nodes.get("node-h1") is not None
    reconcile(world, hp, hp)  # reads on: held off, hard off; reads off: the key listed
    reconcile(world, m3, m3)  # reported off -> fencing: Node deleted, its server off
    assert world.nodes.get("node-h1") is None
    assert not world.violations, world.violations


def test_an_escalation_never_deletes_the_machine_of_a_host_a_teardown_claimed_meanwhile() -> None:
    """Invariant 7 for escalation, which writes nothing else to the host: it decides to
    delete the Machine, a teardown claims the host, then its actions run. Its marker is
    written on the host as decided on, so the claim makes it fail and the Machine stays;
    the next decision sees the claim and holds."""
    world = strict_world(first="none", start="on")
    m3 = "metal3-remediation/m1"
    world.mhc_creates_remediation("m1", "escalate", 0, 30, 60)
    reconcile(world, m3)  # finalizer
    world.observe(m3, 0, 0)  # decides: deleting-machine, mark the host, delete the Machine
    world.node_teardown("claims", "h1")  # the teardown claims h1 meanwhile
    world.advance(m3, None)  # the marker's write is refused (409): the Machine stays
    reconcile(world, m3)  # held by the teardown
    assert world.machines.get(f"{NS}/m1") is not None
    assert not world.violations, world.violations
    world.node_teardown("operator releases", "h1")
    reconcile(world, m3, m3)  # marker written, Machine deleted
    assert world.machines.get(f"{NS}/m1") is None
    assert not world.violations, world.violations
