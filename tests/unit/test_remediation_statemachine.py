"""Both remediation flows under random interleavings, against a simulated world (pure: no I/O).

The world: one or two hosts whose BMCs land power changes late (and fail), hosts that boot
after a delay and hang, a kubelet that registers a *new* Node (new uid, fewer labels and
annotations than the original had) whenever a running host has none, a node monitor, node-link
(Machine nodeRef follows the Node), a health check played by rules (it creates and deletes
Metal3Remediation objects and sets and removes the annotation-based flow's annotation), the garbage
collector, Nodes deleted by others, and ``spec.online`` flips. Optionally a second Machine
names the first host (and Node), so that two remediations compete for one host. Optionally
the two hosts' systems sit behind one shared BMC endpoint (a chassis manager, a Redfish
aggregator): each host's ``spec.bmc.address`` names the endpoint and its own system.

The controllers run their real code where it is pure: ``policy.hostpower.decide`` (the host
controller), ``policy.remediation.decide`` with ``RemediationController.observe``
(metal3-remediation) and ``policy.machineremediation.decide`` with ``host_is_on`` and
``machine_for`` (the annotation-based flow). Every BMC reading and command of the host controller goes
through the real ``BmcPool`` (its driver cache and its slots) from the host's address, with
drivers that reach the simulated system their address names. Their writes are modelled as the controllers carry them out:
status patches carry the resourceVersion decided on (409 otherwise), a reboot key is added
only if the host is unchanged since observed, DeleteNode has a uid precondition, a patch
that changes nothing sends nothing, and a failed write ends the reconcile. A reconcile is
observed and decided at once; its writes then run one by one, interleaved with everything
else, and a crash (or a restart of everything) can drop the rest at any point. Controllers
keep no state: everything is read from the modelled API objects.

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
9. (docs/design.md safety invariant 9) Every BMC command and power reading reached the
   system its host names, never another behind the same endpoint.

Four policy bugs this model found are replayed step by step at the end of this file:
A. (fixed in policy.hostpower) an "on" in flight was forgotten when a reboot key arrived
   before it landed, so a host that powers on was reported off (invariant 1, ground truth);
B. (fixed in policy.remediation) a retry reset ``fencedNodeUID`` and deletion then dropped
   the label backup without a Warning (invariant 3);
C. (fixed in policy.hostpower and policy.fencing: ``status.poweredOffFor``) an off report
   written for an earlier, withdrawn reboot request counted for a later remediation
   (invariant 1, evidence);
D. (fixed in policy.hostpower) an "on" not obeyed within ``command_retry`` was forgotten
   while the host was held off, although a slow BMC still carried it out, after fencing
   (invariant 1, ground truth).

Mutation checks (done by hand, not committed): with ``policy.fencing.reported_off`` weakened to
``powered_on is False`` (in policy.remediation and controllers.machineremediation), the
state machine finds an invariant-1 violation within its 500 examples; with it ignoring
``acknowledged``, or with host-power forgetting an unobeyed "on" after ``command_retry``
again, the replays of C and D fail. With ``BmcPool``'s
drivers keyed by endpoint only (``bmc.pool._driver_key`` returning ``address.key``, as before
the fix: the first host's driver, and so its system, served every host on the endpoint), it
finds an invariant-9 violation at once (a shared endpoint, a power reading of h2 reached A).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from lightkube.resources.core_v1 import Node

from metalmend.api import names
from metalmend.api.resources import BareMetalHost, Machine, Metal3Remediation
from metalmend.bmc import BmcPool, BmcTarget, Credentials, parse
from metalmend.bmc.driver import PowerAction, PowerDriver, PowerState
from metalmend.bmc.errors import BadAddress
from metalmend.controllers import hostpower as hostpower_controller
from metalmend.controllers import machineremediation as mr_controller
from metalmend.controllers import remediation as m3_controller
from metalmend.kube.store import Store, object_key
from metalmend.kube.writes import merge_patch
from metalmend.policy import hostpower as hostpower_policy
from metalmend.policy import machineremediation as mr_policy
from metalmend.policy import remediation as policy
from metalmend.policy.fencing import is_remediation_key, other_remediation
from metalmend.settings import FenceMethod, RemediationSettings, RuntimeSettings, Settings

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NS = "metal3"
HOSTS = ("h1", "h2")
MACHINES = {"m1": "h1", "m2": "h2", "m3": "h1"}  # m3 exists only in the shared-host worlds
POWER = hostpower_policy.PowerSettings(
    soft_timeout=30, poll_interval=20, transition_poll=1, command_retry=10
)
HARD = json.dumps({"mode": "hard"})
MR_KEY = names.MACHINE_REMEDIATION_REBOOT
WORKERS = (
    *(f"host-power/{h}" for h in HOSTS),
    *(f"metal3-remediation/{m}" for m in MACHINES),
    *(f"machine-remediation/{h}" for h in HOSTS),
)
# the remediations that can act on h1 (two Machines name it in the shared-host worlds)
CONTENDERS = ("metal3-remediation/m1", "metal3-remediation/m3", "machine-remediation/h1")
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
    """A 409 or 404 answer: the reconcile ends here (the key is retried later)."""


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
        taint = SimpleNamespace(key=names.OUT_OF_SERVICE_TAINT)
        return SimpleNamespace(taints=[taint] if self.out_of_service else None)


class FakeManager:
    """What the controllers' constructors take from a Manager: one shared Store per kind."""

    def __init__(self, clock: Callable[[], dt.datetime]) -> None:
        self.client = None
        self.events = None
        self.clock = SimpleNamespace(now=clock)
        self.stores: dict[Any, Store] = {}

    def informer(self, resource: Any, *, namespace: str | None = None, **kw: Any) -> Any:
        store = self.stores.setdefault(resource, Store())
        for name, func in (kw.get("indexes") or {}).items():
            store.add_index(name, func)
        return SimpleNamespace(store=store)


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
        self.world.reached.append((self.system, what))
        return bmc

    async def power_state(self) -> PowerState:
        return PowerState.ON if self._reach("power reading").on else PowerState.OFF

    async def act(self, action: PowerAction) -> None:
        bmc = self._reach(f"{action} command")
        delay, boot = self.world.landing_delays
        now = self.world.now
        bmc.landing = (action == PowerAction.ON, now + dt.timedelta(seconds=delay), boot, now)

    async def close(self) -> None:
        pass


@dataclass
class Reconcile:
    """One reconcile in flight: what it decided on, and its copy of the object it writes."""

    obj: Any
    host: Any = None
    observed: Any = None
    decision: Any = None
    host_name: str = ""


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
        self.pool = BmcPool(driver_factory=self.driver_for)
        self.inflight: dict[str, list[Step]] = {}
        self.violations: list[str] = []
        self.off_read: dict[str, dt.datetime] = {}  # host -> last BMC read that said off
        self.created_at: dict[str, dt.datetime] = {}  # remediation uid -> creation
        self.key_added_at: dict[tuple[str, str], dt.datetime] = {}  # (host, reboot key)
        self.debts: dict[str, Debt] = {}  # remediation uid -> labels owed
        self.sent: dict[str, hostpower_policy.LastCommand] = {}  # host-power's memory

    # ---- set-up ---------------------------------------------------------------------------------

    @initialize(
        fence=st.sampled_from(
            [FenceMethod.DELETE_NODE, FenceMethod.DELETE_NODE, FenceMethod.OUT_OF_SERVICE_TAINT]
        ),
        two_hosts=st.booleans(),
        shared_host=st.sampled_from([True, True, False]),
        shared_endpoint=st.booleans(),
        first=st.sampled_from(["metal3", "seed-001", "both", "all"]),
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
        manager: Any = FakeManager(lambda: self.now)
        options = Settings(
            runtime=RuntimeSettings(namespace=NS), remediation=RemediationSettings(fence=fence)
        )
        self.fence = fence
        self.m3 = m3_controller.RemediationController(manager, options)
        self.mr = mr_controller.MachineRemediationController(manager, options)
        self.hosts: Store = manager.stores[BareMetalHost]
        self.machines: Store = manager.stores[Machine]
        self.rems: Store = manager.stores[Metal3Remediation]
        self.nodes: Store = manager.stores[Node]
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
                    "lastPoweredOn": hostpower_policy.stamp(hour_ago),
                },
            }
            if start != "on":
                bmc.on, status["poweredOn"] = False, False
            if start == "powering on":
                sent = T0 - dt.timedelta(seconds=1)
                bmc.landing = (True, T0 + dt.timedelta(seconds=5), 30, sent)
                status["lastPowerCommand"] = {"action": "on", "at": hostpower_policy.stamp(sent)}
            spec = {"online": start != "off", "bmc": {"address": address}}
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
        for m, h in MACHINES.items():
            if h not in hosts or (m == "m3" and not shared_host):
                continue
            machine = Obj(m, f"uid-{m}", annotations={names.MACHINE_HOST: f"{NS}/{h}"})
            machine.body["status"] = {}
            self.put(self.machines, machine)
            self.link(m)
        if first in ("metal3", "both", "all"):
            self.mhc_creates_remediation("m1", "reboot", 3, 30, 60)
        if first in ("seed-001", "both"):
            self.mhc_requests_seed001("m1")
        if first == "all":
            self.mhc_creates_remediation("m2", "escalate", 1, 30, 60)
            self.mhc_creates_remediation("m3", "reboot", 2, 30, 60)
            self.mhc_requests_seed001("m3")

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
            raise Conflict("404")
        if require_version and live.metadata.resourceVersion != seen.metadata.resourceVersion:
            if store is self.hosts:
                note("a reboot key was not added: the host changed since observed")
            raise Conflict("409")

        if store is self.hosts:
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

    def patch_status(self, store: Store, ctx: Reconcile, desired: dict[str, Any]) -> None:
        """kube.writes.patch_status: merge patch with the resourceVersion decided on."""
        if not merge_patch(ctx.obj.get("status") or {}, desired):
            return
        live = store.get(object_key(ctx.obj))
        if live is None or live.metadata.resourceVersion != ctx.obj.metadata.resourceVersion:
            raise Conflict("409")

        def apply(obj: Any) -> None:
            obj.body["status"] = copy.deepcopy(desired)

        ctx.obj = self.changed(store, live, apply)

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

    def bmc_call(self, host: Any, call: str, **args: Any) -> Any:
        """``BmcPool.<call>`` for ``host`` as the host controller makes it, from its address;
        then invariant 9: what the call reached is the system the host names."""
        target = BmcTarget(
            parse(host.body["spec"]["bmc"]["address"]), Credentials("admin", "pw"), namespace=NS
        )
        self.reached.clear()
        result = self.loop.run_until_complete(getattr(self.pool, call)(target, **args))
        named = (target.address.key, target.address.system_path)
        for system, what in self.reached:
            if system != named:
                self.violate(
                    f"invariant 9: a {what} for host {host.metadata.name} reached system"
                    f" {system[1]} at {system[0]}, not {named[1]}"
                )
        if not self.reached:
            self.violate(f"invariant 9: a BMC call for {host.metadata.name} reached no system")
        return result

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
            self.mhc_requests_seed001(m)
        elif what == "withdraw":
            self.mhc_withdraws_seed001(m)
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
        wanted = None
        if node is not None:
            wanted = {"apiVersion": "v1", "kind": "Node", "name": node.metadata.name}
            wanted["uid"] = node.metadata.uid
        if (machine.get("status") or {}).get("nodeRef") == wanted:
            return

        def relink(obj: Any) -> None:
            status = obj.body.setdefault("status", {})
            if wanted is None:
                status.pop("nodeRef", None)
            else:
                status["nodeRef"] = wanted

        self.changed(self.machines, machine, relink)

    def someone_deletes_the_node(self, h: str) -> None:
        self.nodes.delete(node_of_host(h))

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
        owner = SimpleNamespace(kind="Machine", name=m, uid=machine.metadata.uid)
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

    def mhc_requests_seed001(self, m: str) -> None:
        machine = self.machines.get(f"{NS}/{m}")
        if machine is None or names.EXTERNAL_REMEDIATION in machine.metadata.annotations:
            return
        self.patch_map(self.machines, machine, "annotations", {names.EXTERNAL_REMEDIATION: ""})

    def mhc_withdraws_seed001(self, m: str) -> None:
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
        return self.plan_seed001(name)

    def advance(self, worker: str, count: int | None) -> None:
        steps = self.inflight.get(worker)
        while steps and (count is None or count > 0):
            step = steps.pop(0)
            try:
                step()
            except Conflict:
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

    @rule(worker=st.sampled_from(WORKERS))
    def crash(self, worker: str) -> None:
        """The reconcile dies between two writes (or the process with it)."""
        self.inflight.pop(worker, None)

    @rule()
    def restart(self) -> None:
        self.inflight.clear()
        self.sent.clear()  # host-power's memory of the commands it sent

    # ---- host power: controllers/hostpower.py --------------------------------------------------

    def plan_host_power(self, h: str, delay: float, boot: float) -> list[Step]:
        host = self.hosts.get(f"{NS}/{h}")
        if host is None:
            return []
        ctx = Reconcile(obj=host)
        now, bmc = self.now, self.bmcs[h]
        if bmc.broken:
            return [functools.partial(self.host_power_failed, ctx, now, False)]
        power = self.bmc_call(host, "power_state")
        if power == PowerState.OFF:
            self.off_read[h] = now
        if bmc.landing is not None and bmc.landing[0] and not bmc.on:
            note("host-power reads a host off while a power-on is still to land")
            if (now - bmc.landing[3]).total_seconds() >= POWER.command_retry:
                note("... sent command_retry or longer ago")
        view = hostpower_controller._view(host, power)
        # as HostPowerController._attempt: "confirmed" is "this process sent it itself"
        view = dataclasses.replace(view, command_confirmed=view.last_command == self.sent.get(h))
        decision = hostpower_policy.decide(view, now, POWER)
        steps: list[Step] = [functools.partial(self.host_power_status, ctx, decision.status)]
        if decision.remove_annotations:
            removals: dict[str, str | None] = {k: None for k in decision.remove_annotations}
            steps.append(functools.partial(self.host_power_annotations, ctx, removals))
        if decision.command is not None:
            steps.append(
                functools.partial(self.host_power_command, h, ctx, decision, now, delay, boot)
            )
        return steps

    def host_power_status(self, ctx: Reconcile, changes: dict[str, Any]) -> None:
        status = hostpower_controller._with_changes(ctx.obj.get("status") or {}, changes)
        if status.get("errorType") or status.get("operationalStatus") == "error":
            status.update(errorType="", errorMessage="", errorCount=0, operationalStatus="OK")
        status.setdefault("operationalStatus", "OK")
        self.patch_status(self.hosts, ctx, status)

    def host_power_annotations(self, ctx: Reconcile, removals: dict[str, str | None]) -> None:
        ctx.obj = self.patch_map(self.hosts, ctx.obj, "annotations", removals) or ctx.obj

    def host_power_command(
        self,
        h: str,
        ctx: Reconcile,
        decision: hostpower_policy.Decision,
        now: dt.datetime,
        delay: float,
        boot: float,
    ) -> None:
        bmc, command = self.bmcs[h], decision.command
        if bmc.broken:  # unreachable: nothing sent, the command is forgotten
            self.host_power_failed(ctx, now, True)
            raise Conflict("BMC error")
        self.landing_delays = (delay, boot)
        if command == "on":
            self.bmc_call(ctx.obj, "power_on")
        else:
            self.bmc_call(ctx.obj, "power_off", hard=command == "hard off")
        recorded = decision.status.get("lastPowerCommand") or {}
        assert command is not None
        self.sent[h] = hostpower_policy.LastCommand(command, recorded.get("at", now))
        self.tick(0)

    def host_power_failed(self, ctx: Reconcile, now: dt.datetime, forget: bool) -> None:
        status = dict(ctx.obj.get("status") or {})
        count = int(status.get("errorCount") or 0) + 1
        status.update(
            errorType="power management error",
            errorMessage="BMC unreachable",
            errorCount=count,
            operationalStatus="error",
        )
        if forget:
            status.pop("lastPowerCommand", None)
        self.patch_status(self.hosts, ctx, status)

    # ---- metal3-remediation: controllers/remediation.py ----------------------------------------

    def plan_metal3(self, m: str) -> list[Step]:
        rem = self.rems.get(f"{NS}/{m}")
        if rem is None:
            return []
        host = self.m3.host_object(rem)
        observed = self.m3.observe(rem, host)
        decision = policy.decide(observed, self.now, self.m3.settings)
        ctx = Reconcile(obj=rem, host=host, observed=observed, decision=decision)
        return [functools.partial(self.metal3_act, ctx, action) for action in decision.actions]

    def metal3_act(self, ctx: Reconcile, action: policy.Action) -> None:
        uid = ctx.obj.metadata.uid
        key = m3_controller.reboot_key(ctx.obj)
        match action:
            case policy.SetProgress(progress=progress):
                status = m3_controller.progress_to(ctx.obj.get("status") or {}, progress)
                self.patch_status(self.rems, ctx, status)
                note(f"metal3-remediation phase {progress.phase or '(none)'}")
                was = ctx.observed.progress.phase
                if progress.phase == policy.WAITING and was != policy.WAITING:
                    self.check_restored(ctx, "reached waiting")
            case policy.AddFinalizer() | policy.RemoveFinalizer():
                self.metal3_finalizer(ctx, isinstance(action, policy.AddFinalizer))
            case policy.BackupNode(labels=labels, annotations=annotations):
                backup: dict[str, str | None] = {
                    names.NODE_LABELS_BACKUP: json.dumps(dict(labels), sort_keys=True),
                    names.NODE_ANNOTATIONS_BACKUP: json.dumps(dict(annotations), sort_keys=True),
                }
                new = self.patch_map(
                    self.rems, ctx.obj, "annotations", backup, require_version=True
                )
                ctx.obj = new or ctx.obj
            case policy.Event(reason=reason, message=message):
                if reason == names.REASON_WAITING_FOR_HOST and "host-power" in message:
                    note("metal3-remediation waits: host-power has not seen its key withdrawn")
                elif reason == names.REASON_WAITING_FOR_HOST:
                    note("metal3-remediation waits: another remediation holds the host")
            case policy.RequestPowerOff():
                if ctx.host is None:
                    raise Conflict("host vanished")
                self.patch_map(
                    self.hosts, ctx.host, "annotations", {key: HARD}, require_version=True
                )
            case policy.ReleasePower():
                if ctx.host is None:
                    raise Conflict("host vanished")
                self.patch_map(self.hosts, ctx.host, "annotations", {key: None})
            case policy.DeleteNode(name=name, uid=node_uid):
                node = self.nodes.get(name)
                if node is not None and node.metadata.uid == node_uid:
                    self.check_fence(ctx.host, key, self.created_at[uid], f"deleted Node {name}")
                    self.nodes.delete(name)
                    debt = self.debts.get(uid)
                    if debt is None:
                        labels, kept = dict(node.metadata.labels), dict(node.metadata.annotations)
                        self.debts[uid] = Debt(labels, kept)
                    else:
                        debt.outstanding = True
                    note("metal3-remediation deleted a Node")
            case policy.TaintNode(name=name) | policy.UntaintNode(name=name):
                node = self.nodes.get(name)
                if node is None:
                    return
                taint = isinstance(action, policy.TaintNode)
                if taint and not node.out_of_service:
                    self.check_fence(ctx.host, key, self.created_at[uid], f"tainted Node {name}")
                    note("metal3-remediation tainted a Node")

                def set_taint(n: Any) -> None:
                    n.out_of_service = taint

                self.changed(self.nodes, node, set_taint)
            case policy.RestoreNode(name=name, labels=labels, annotations=annotations):
                node = self.nodes.get(name)
                if node is not None:
                    node = self.patch_map(self.nodes, node, "labels", dict(labels)) or node
                    self.patch_map(self.nodes, node, "annotations", dict(annotations))
            case policy.DeleteMachine():
                machine = self.m3.machine_of(ctx.obj)
                if machine is not None:
                    self.machines.delete(object_key(machine))
                    note("escalation deleted a Machine")
            case policy.DeletePods():
                pass  # no pods in this model

    def metal3_finalizer(self, ctx: Reconcile, add: bool) -> None:
        live = self.rems.get(object_key(ctx.obj))
        if live is None:
            if add:
                raise Conflict("404")
            return
        if live.metadata.resourceVersion != ctx.obj.metadata.resourceVersion:
            raise Conflict("409")
        wanted = [f for f in live.metadata.finalizers if f != names.REMEDIATION_FINALIZER]
        if add:
            wanted.append(names.REMEDIATION_FINALIZER)
        if not add and not wanted and live.metadata.deletionTimestamp is not None:
            self.rems.delete(object_key(live))
            self.check_gone(ctx)
            return

        def set_finalizers(obj: Any) -> None:
            obj.metadata.finalizers = wanted

        ctx.obj = self.changed(self.rems, live, set_finalizers)

    # ---- annotation-based flow: controllers/machineremediation.py -------------------------------------------

    def plan_seed001(self, h: str) -> list[Step]:
        key = f"{NS}/{h}"
        host = self.hosts.get(key)
        if host is None:
            return []
        quiet = logging.getLogger(mr_controller.__name__)
        quiet.disabled = True  # "several Machines name one host": that is the point here
        try:
            machine = self.mr.machine_for(key)
        finally:
            quiet.disabled = False
        annotations = host.metadata.annotations or {}
        node_ref = mr_controller._node_ref(machine)
        observed = mr_policy.Observed(
            node_ref=node_ref is not None,
            needs_remediation=machine is not None
            and names.EXTERNAL_REMEDIATION in (machine.metadata.annotations or {}),
            powered_on=mr_controller.host_is_on(host),
            reboot_annotation=MR_KEY in annotations,
        )
        action = mr_policy.decide(observed)
        ctx = Reconcile(obj=host, host_name=h)
        if action is mr_policy.Action.ADD_REBOOT_ANNOTATION:
            if other_remediation(annotations, MR_KEY):
                note("machine-remediation waits: another remediation holds the host")
                return []  # an Event: the host is busy
            if mr_controller.withdrawal_pending(host):
                note("machine-remediation waits: host-power has not seen its key withdrawn")
                return []  # an Event; host-power's status write wakes it
            return [
                functools.partial(
                    self.patch_map,
                    self.hosts,
                    host,
                    "annotations",
                    {MR_KEY: HARD},
                    require_version=True,
                )
            ]
        if action is mr_policy.Action.DELETE_NODE:
            return [functools.partial(self.seed001_fence, ctx, node_ref or {})]
        if action is mr_policy.Action.REMOVE_NEEDS_REMEDIATION:
            removal: dict[str, str | None] = {names.EXTERNAL_REMEDIATION: None}
            return [
                functools.partial(self.patch_map, self.machines, machine, "annotations", removal)
            ]
        if action is mr_policy.Action.REMOVE_REBOOT_ANNOTATION:
            return [
                functools.partial(self.patch_map, self.hosts, host, "annotations", {MR_KEY: None})
            ]
        return []

    def seed001_fence(self, ctx: Reconcile, node_ref: dict[str, Any]) -> None:
        name = node_ref.get("name", "")
        node = self.nodes.get(name)
        uid = node_ref.get("uid") or (node.metadata.uid if node is not None else None)
        if uid and node is not None and node.metadata.uid == uid:
            # The annotation-based flow is keyed by host: its request is its reboot key (a Machine
            # asking while the key is held joins that request).
            since = self.key_added_at[(ctx.host_name, MR_KEY)]
            self.check_fence(ctx.obj, MR_KEY, since, f"deleted Node {name}")
            self.nodes.delete(name)
            note("machine-remediation deleted a Node")

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
            self.mhc_withdraws_seed001(m)
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
    max_examples=500,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_remediation_state_machine = RemediationWorld.TestCase


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


def test_fixed_bug_a_a_power_on_in_flight_is_not_forgotten() -> None:
    """Found by this model, fixed: policy.hostpower cleared lastPowerCommand "on" as soon as it reads the power it now
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


def test_fixed_bug_b_a_retry_remembers_the_deleted_node_and_deletion_keeps_its_labels() -> None:
    """Found by this model, fixed: a new attempt reset status.fencedNodeUID; _release decides whether to wait for the
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
    """Found by this model, fixed (it was "bug C"): "reported off" meant pendingRebootSince
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
    world = strict_world(first="seed-001", start="on")  # m1 asks by annotation
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
