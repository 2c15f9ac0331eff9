"""Fence-first remediations while replicas of ``metalmend run --shard`` come and go
(docs/sharding.md, docs/remediation.md): real processes against the real API server and the
scale lab's Redfish BMCs (every reset journalled per host, with its time), as
tests/integration/test_sharding.py runs them.

With sharding, host-power is sharded and is the only sender of power commands; the
remediation controllers run on the leader and act through the reboot key. Each test
remediates by a FenceRemediation as Cluster API's MachineHealthCheck creates it (named after
its Machine, owned by it), fencing by the out-of-service taint: the host is powered off,
confirmed off by the leader's own BMC reads, the Node tainted, and the host held off while a
pod is left on the Node. The test keeps one pod there with a finalizer of its own, so the
host must stay off from the taint until the test lets the pod go: whatever the test reads
at the BMC meanwhile is what the BMC said while the Node was fenced.

What is proven, while the host's owner is killed with SIGKILL, the leader is killed with
SIGKILL, or a replica joins and hosts move to it mid-remediation: the Node is tainted only
once the BMC journalled the power-off and never while the BMC reads on; each host sees
exactly one power-off and one power-on (no command sent twice, by one replica or two); the
power-on comes only after the remediation let the host go (its pod gone); the remediation
ends Succeeded and its deletion releases everything.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from lightkube import ApiError, Client, KubeConfig
from lightkube.models.core_v1 import Container, NodeSpec, PodSpec
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.resources import BareMetalHost, FenceRemediation, Machine
from metalmend.policy.sharding import placement
from metalmend_lab.controlplane import LOOPBACK, ControlPlane
from tests.integration.test_sharding import (
    TAKEOVER,
    Bmcs,
    Fleet,
    bmcs,
    fleet,
    leader_of,
    metrics_of,
    owners,
    register,
    settled_on,
)
from tests.support import started, wait

__all__ = ["bmcs", "fleet"]  # the fixtures, shared with test_sharding

# Every replica runs host-power (sharded) and fence-remediation (on the leader); fencing by
# the taint, so that the leader reads the BMCs itself before it fences (3 reads over 2 s
# instead of 10 s, and the Node's pods looked at every second instead of 5: a shorter test).
CONTROLLERS = "host-power,fence-remediation"
ENVIRONMENT = {
    "METALMEND_REMEDIATION_FENCE": "out-of-service-taint",
    "METALMEND_REMEDIATION_CONFIRM_WINDOW": "2",
    "METALMEND_REMEDIATION_EVACUATION_POLL": "1",
}
HOLD = "tests.metalmend.dev/hold"  # the test's finalizer on the pod that holds the host off
# Long enough that no attempt times out while a Lease expires on a busy machine: a failed
# attempt releases the host (powers it on) and starts again, a second power-off.
SPEC = {"strategy": "reboot", "powerOffTimeoutSeconds": 900, "powerOnTimeoutSeconds": 900}


@dataclass
class Target:
    """One remediation: a Machine on a host, its Node and a pod held on that Node."""

    namespace: str
    index: int
    key: str = ""  # the remediation's reboot key, once it exists
    released: bool = False  # the test let the pod go (set before the pod's finalizer goes)
    released_at: float = 0.0

    @property
    def host(self) -> str:
        return f"host-{self.index}"

    @property
    def machine(self) -> str:
        return f"m-{self.index}"

    @property
    def node(self) -> str:
        return f"{self.namespace}-m-{self.index}"

    @property
    def pod(self) -> str:
        return f"held-{self.index}"


def prepare(kube: Client, namespace: str, index: int) -> Target:
    """The Machine, host link, Node and held pod a MachineHealthCheck would remediate, linked
    as Cluster API Provider Metal3 links them (tests/integration/test_remediation.py's
    World: the host's consumerRef, the Machine's host annotation and nodeRef, the Node's
    providerID naming the host)."""
    target = Target(namespace, index)
    provider = f"metal3://{namespace}/{target.host}/{target.machine}"
    machine: Any = kube.create(
        Machine(
            metadata=ObjectMeta(
                name=target.machine,
                annotations={names.MACHINE_HOST: f"{namespace}/{target.host}"},
            ),
            spec={"clusterName": "c", "providerID": provider},
        ),
        namespace=namespace,
    )
    consumer = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
                "name": target.machine, "namespace": namespace, "uid": machine.metadata.uid}  # fmt: skip
    kube.patch(
        BareMetalHost, target.host, {"spec": {"consumerRef": consumer}},
        namespace=namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip
    node: Any = kube.create(
        Node(metadata=ObjectMeta(name=target.node), spec=NodeSpec(providerID=provider))
    )
    _ready(kube, target.node, "Unknown", dt.datetime.now(dt.UTC))  # the hung server's Node
    kube.patch(
        Machine.Status, target.machine,
        {"status": {"nodeRef": {"kind": "Node", "name": target.node, "uid": node.metadata.uid}}},
        namespace=namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip
    kube.create(
        Pod(
            metadata=ObjectMeta(name=target.pod, finalizers=[HOLD]),
            spec=PodSpec(nodeName=target.node, containers=[Container(name="c", image="i")]),
        ),
        namespace=namespace,
    )
    return target


def _ready(kube: Client, node: str, status: str, since: dt.datetime) -> None:
    at = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {"type": "Ready", "status": status, "reason": "Test",
                 "lastHeartbeatTime": at, "lastTransitionTime": at}  # fmt: skip
    kube.patch(Node.Status, node, {"status": {"conditions": [condition]}})


def remediate(kube: Client, target: Target) -> None:
    """What Cluster API's MachineHealthCheck creates for an unhealthy Machine."""
    machine: Any = kube.get(Machine, target.machine, namespace=target.namespace)
    owner = OwnerReference(
        apiVersion="cluster.x-k8s.io/v1beta1", kind="Machine",
        name=target.machine, uid=machine.metadata.uid,
    )  # fmt: skip
    made: Any = kube.create(
        FenceRemediation(
            metadata=ObjectMeta(name=target.machine, ownerReferences=[owner]), spec=dict(SPEC)
        ),
        namespace=target.namespace,
    )
    target.key = f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}{made.metadata.uid}"


def _get(kube: Client, resource: Any, name: str, namespace: str | None = None) -> Any | None:
    try:
        return kube.get(resource, name, namespace=namespace)
    except ApiError as error:
        if error.status.code == 404:
            return None
        raise


def status_of(kube: Client, target: Target) -> dict[str, Any]:
    found = _get(kube, FenceRemediation, target.machine, target.namespace)
    return dict((found.get("status") or {}) if found is not None else {})


def host_of(kube: Client, target: Target) -> Any:
    return kube.get(BareMetalHost, target.host, namespace=target.namespace)


def holds_key(kube: Client, target: Target) -> bool:
    return target.key in (host_of(kube, target).metadata.annotations or {})


def tainted(node: Any) -> bool:
    return any(t.key == names.OUT_OF_SERVICE_TAINT for t in (node.spec.taints or []))


def bmc_power(bmcs: Bmcs, index: int) -> str:
    """The system's PowerState, read at its BMC by the test itself."""
    port = bmcs.ports["systems"][f"sys-{index}"]
    url = f"https://{LOOPBACK}:{port}/redfish/v1/Systems/sys-{index}"
    trust = ssl.create_default_context(cafile=str(bmcs.ca))
    reply = httpx.get(url, auth=(f"u{index}", f"p{index}"), verify=trust, timeout=30)
    reply.raise_for_status()
    return str(reply.json()["PowerState"])


@dataclass
class FenceWatch:
    """A thread looking at each target's Node, then its BMC, again and again: in that order,
    a Node seen tainted and then a BMC reading On, while the test still held the pod that
    keeps the host off, is a fence while the server was on."""

    kube: Client
    bmcs: Bmcs
    targets: list[Target]
    fenced_at: dict[str, float] = field(default_factory=dict)  # first seen tainted (time.time)
    power_at_fence: dict[str, str] = field(default_factory=dict)  # the BMC read just after
    violations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> FenceWatch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for target in self.targets:
                try:
                    self._look(target)
                except (ApiError, httpx.HTTPError, KeyError) as error:  # looked at again
                    self.errors.append(f"{target.host}: {type(error).__name__}: {error}")

    def _look(self, target: Target) -> None:
        node = _get(self.kube, Node, target.node)
        if node is None or not tainted(node):
            return
        seen = time.time()
        power = bmc_power(self.bmcs, target.index)
        if target.host not in self.fenced_at:
            self.fenced_at[target.host] = seen
            self.power_at_fence[target.host] = power
        # Still held after the read: the pod's finalizer was there all along, so nothing may
        # have powered the host on yet.
        if power != "Off" and not target.released:
            self.violations.append(f"{target.node} tainted while {target.host}'s BMC read {power}")


def release(kube: Client, target: Target) -> None:
    """The pod leaves the fenced Node (its volumes detached, say): the remediation may now
    power the host on."""
    target.released, target.released_at = True, time.time()
    kube.patch(
        Pod, target.pod, {"metadata": {"finalizers": None}},
        namespace=target.namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip


def in_phase(kube: Client, target: Target, *phases: str) -> Callable[[], bool]:
    def check() -> bool:
        return status_of(kube, target).get("phase") in phases

    return check


def come_back(kube: Client, bmcs: Bmcs, target: Target) -> None:
    """Play the kubelet of the server powered on again: its Node turns Ready, in a later
    second than the power-on began (condition times have whole seconds)."""
    started(
        lambda: (
            in_phase(kube, target, "power-on")()
            and "on" in bmcs.commands(target.host)
            and (host_of(kube, target).get("status") or {}).get("poweredOn") is True
        ),
        f"{target.host} powered on again by its owner ({target.machine} in power-on)",
        within=TAKEOVER,
    )
    began = dt.datetime.fromisoformat(str(status_of(kube, target)["phaseSince"]))
    wait(
        lambda: dt.datetime.now(dt.UTC).replace(microsecond=0) > began.replace(microsecond=0),
        5,
        f"the second after {target.machine}'s power-on began ({began})",
    )
    _ready(kube, target.node, "True", dt.datetime.now(dt.UTC))


def succeeded(kube: Client, target: Target) -> bool:
    status = status_of(kube, target)
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    node = kube.get(Node, target.node)
    return (
        status.get("phase") == "waiting"
        and conditions.get("Succeeded") == "True"
        and not tainted(node)
        and not holds_key(kube, target)
    )


def finish(kube: Client, bmcs: Bmcs, target: Target) -> None:
    """The Node is back: the remediation succeeds; the health checker then deletes it and the
    leader releases it (its finalizer)."""
    come_back(kube, bmcs, target)
    started(lambda: succeeded(kube, target), f"{target.machine} Succeeded, its Node untainted")
    kube.delete(FenceRemediation, target.machine, namespace=target.namespace)
    started(
        lambda: _get(kube, FenceRemediation, target.machine, target.namespace) is None,
        f"{target.machine} deleted (the leader removed its finalizer)",
    )


def release_and_finish(kube: Client, bmcs: Bmcs, watch: FenceWatch, targets: list[Target]) -> None:
    """Let every held pod go, then see each remediation to its end and its host fenced once."""
    for target in targets:
        release(kube, target)
    for target in targets:
        finish(kube, bmcs, target)
        assert_fenced_once(watch, bmcs, target)


def assert_fenced_once(watch: FenceWatch, bmcs: Bmcs, target: Target) -> None:
    entries = bmcs.entries(target.host)
    assert [word for _, word in entries] == ["hard off", "on"], (
        f"{target.host}: one power-off and one power-on, the BMC saw {entries}"
    )
    (off, _), (on, _) = entries
    assert target.host in watch.fenced_at, (
        f"{target.node} was never seen tainted (the watch's errors: {watch.errors[-3:]})"
    )
    assert off < watch.fenced_at[target.host], (
        f"{target.node} tainted (seen at {watch.fenced_at[target.host]:.6f}) before its BMC"
        f" journalled the power-off ({off:.6f})"
    )
    assert watch.power_at_fence[target.host] == "Off", (
        f"{target.node} tainted while its BMC read {watch.power_at_fence[target.host]}"
    )
    assert on > target.released_at, (
        f"{target.host} powered on ({on:.6f}) before its pod left the fenced Node"
        f" ({target.released_at:.6f})"
    )
    assert not [v for v in watch.violations if target.node in v], watch.violations


@pytest.fixture
def watcher(control_plane: ControlPlane) -> Iterator[Callable[[Bmcs, list[Target]], FenceWatch]]:
    """A FenceWatch on its own client (a thread beside the test's)."""
    made: list[FenceWatch] = []

    def watch(bmcs: Bmcs, targets: list[Target]) -> FenceWatch:
        client = Client(KubeConfig.from_file(control_plane.kubeconfig))
        made.append(FenceWatch(client, bmcs, targets).__enter__())
        return made[-1]

    yield watch
    for one in made:
        one.__exit__()


@pytest.fixture
def cleanup(kube: Client) -> Iterator[list[Target]]:
    """Lets the held pods go and deletes the Nodes (cluster-scoped) whatever the outcome."""
    targets: list[Target] = []
    yield targets
    for target in targets:
        with contextlib.suppress(ApiError):
            kube.patch(
                Pod, target.pod, {"metadata": {"finalizers": None}},
                namespace=target.namespace, patch_type=PatchType.MERGE,
            )  # fmt: skip
        with contextlib.suppress(ApiError):
            kube.delete(Node, target.node)


def lists_nodes(fleet: Fleet, name: str) -> bool:
    """Whether the replica has listed the Nodes (a cache only the leader's controllers
    read: filled when a replica leads, kube/manager.py)."""
    return 'metalmend_informer_lists_total{resource="nodes"}' in metrics_of(fleet, name)


def start(fleet: Fleet, kube: Client, namespace: str, bmcs: Bmcs, count: int) -> list[str]:
    """``count`` replicas running host-power and fence-remediation, every host owned."""
    fleet.controllers, fleet.environment = CONTROLLERS, dict(ENVIRONMENT)
    hosts = register(kube, namespace, bmcs)
    replicas = [fleet.start(f"r{i}") for i in range(count)]
    for replica in replicas:
        fleet.wait_ready(replica)
    live = {r.name for r in replicas}
    started(settled_on(fleet, kube, namespace, hosts, live), "every host owned by a live replica")
    started(lambda: leader_of(fleet, live) is not None, "a leader among the replicas")
    leader = leader_of(fleet, live)
    assert leader is not None
    started(lambda: lists_nodes(fleet, leader), f"the leader {leader} listing the Nodes")
    others = [r for r in sorted(live - {leader}) if lists_nodes(fleet, r)]
    assert others == [], f"only the leader keeps the Nodes, not {others}"
    return hosts


def owned_by(kube: Client, namespace: str, host: str, live: set[str]) -> Callable[[], bool]:
    def check() -> bool:
        return owners(kube, namespace, [host]).get(host) in live

    return check


def test_the_owner_killed_mid_power_off_and_the_leader_killed_mid_fence_each_host_fenced_once(
    fleet: Fleet, kube: Client, namespace: str, bmcs: Bmcs,
    watcher: Callable[[Bmcs, list[Target]], FenceWatch], cleanup: list[Target],
) -> None:  # fmt: skip
    """(a) the replica owning the host is killed with SIGKILL as soon as the remediation
    put its key on the host (its power-off sent or not); (b) then the leader, which runs the
    remediation, is killed with SIGKILL while the Node is fenced and the host held off.
    The new owner (after the Lease) and the new leader carry the remediation to its end."""
    hosts = start(fleet, kube, namespace, bmcs, 3)
    live = {"r0", "r1", "r2"}
    leader = leader_of(fleet, live)
    assert leader is not None
    shares = owners(kube, namespace, hosts)
    victim = sorted(live - {leader})[0]  # a replica that does not lead: only the owner dies
    index = next(i for i, h in enumerate(hosts) if shares[h] == victim)
    target = prepare(kube, namespace, index)
    cleanup.append(target)
    watch = watcher(bmcs, [target])
    remediate(kube, target)
    started(lambda: holds_key(kube, target), f"{target.machine}'s key on {target.host}")
    fleet.replicas[victim].process.send_signal(signal.SIGKILL)  # mid power-off
    fleet.replicas[victim].process.wait(10)
    live -= {victim}
    started(
        owned_by(kube, namespace, target.host, live),
        f"{target.host} taken over from {victim} once its Lease expired",
        within=TAKEOVER,
    )
    started(
        in_phase(kube, target, "evacuating"),
        f"{target.node} tainted and {target.host} held off for its pod",
        within=TAKEOVER,
    )
    # (b) the leader dies while the Node is fenced: the host stays off until a new leader
    # sees the pod gone.
    fleet.replicas[leader].process.send_signal(signal.SIGKILL)
    fleet.replicas[leader].process.wait(10)
    live -= {leader}
    started(
        lambda: (
            leader_of(fleet, live) is not None and owned_by(kube, namespace, target.host, live)()
        ),
        f"{live} leading and owning {target.host} once {leader}'s Leases expired",
        within=TAKEOVER,
    )
    successor = leader_of(fleet, live)
    assert successor is not None
    started(lambda: lists_nodes(fleet, successor), f"the new leader {successor} listing the Nodes")
    assert bmc_power(bmcs, index) == "Off", "held off across both kills"
    release_and_finish(kube, bmcs, watch, [target])
    others = [h for h in hosts if h != target.host]
    assert all(bmcs.commands(h) == [] for h in others), "no other host was power-cycled"


def test_the_leader_killed_mid_remediation_of_its_own_host_and_anothers_each_fenced_once(
    fleet: Fleet, kube: Client, namespace: str, bmcs: Bmcs,
    watcher: Callable[[Bmcs, list[Target]], FenceWatch], cleanup: list[Target],
) -> None:  # fmt: skip
    """The leader killed with SIGKILL as soon as two remediations hold their hosts' keys:
    one of its own hosts (its shard Lease and the leader Lease expire together) and one of
    another replica's. The new leader picks both up where they stand."""
    hosts = start(fleet, kube, namespace, bmcs, 3)
    live = {"r0", "r1", "r2"}
    leader = leader_of(fleet, live)
    assert leader is not None
    shares = owners(kube, namespace, hosts)
    own = next(i for i, h in enumerate(hosts) if shares[h] == leader)
    other = next(i for i, h in enumerate(hosts) if shares[h] not in (leader, None))
    targets = [prepare(kube, namespace, i) for i in (own, other)]
    cleanup.extend(targets)
    watch = watcher(bmcs, targets)
    for target in targets:
        remediate(kube, target)
    started(
        lambda: all(holds_key(kube, t) for t in targets),
        f"the keys on {[t.host for t in targets]}",
    )
    fleet.replicas[leader].process.send_signal(signal.SIGKILL)
    fleet.replicas[leader].process.wait(10)
    live -= {leader}
    started(
        lambda: leader_of(fleet, live) is not None,
        f"a new leader among {live} once {leader}'s Lease expired",
        within=TAKEOVER,
    )
    for target in targets:
        started(
            owned_by(kube, namespace, target.host, live),
            f"{target.host} owned by one of {live}",
            within=TAKEOVER,
        )
        started(
            in_phase(kube, target, "evacuating"),
            f"{target.node} tainted and {target.host} held off for its pod",
            within=TAKEOVER,
        )
    release_and_finish(kube, bmcs, watch, targets)


def test_a_replica_added_during_fences_takes_its_hosts_mid_remediation_and_each_is_fenced_once(
    fleet: Fleet, kube: Client, namespace: str, bmcs: Bmcs,
    watcher: Callable[[Bmcs, list[Target]], FenceWatch], cleanup: list[Target],
) -> None:  # fmt: skip
    """Two replicas; three remediations start (two where the ring has that many), on hosts
    the ring gives to a third replica, which joins while they run, and one it does not:
    the moving hosts are drained from their owners and taken mid-remediation. Every host is fenced once, off, and powered
    on once by whoever owns it then."""
    hosts = start(fleet, kube, namespace, bmcs, 2)
    leader = leader_of(fleet, {"r0", "r1"})  # lighter on both rings
    assert leader is not None
    two, three = placement(["r0", "r1"], leader), placement(["r0", "r1", "r2"], leader)
    moving = [i for i, h in enumerate(hosts)
              if two.owner(f"{namespace}/{h}") != three.owner(f"{namespace}/{h}")]  # fmt: skip
    staying = [i for i, h in enumerate(hosts) if i not in moving]
    assert moving, f"the ring moves some of {len(hosts)} hosts to r2"
    assert staying, f"the ring leaves some of {len(hosts)} hosts where they are"
    targets = [prepare(kube, namespace, i) for i in (*moving[:2], staying[0])]
    moved = targets[:-1]
    cleanup.extend(targets)
    before = owners(kube, namespace, hosts)
    watch = watcher(bmcs, targets)
    for target in targets:
        remediate(kube, target)
    started(
        lambda: all(holds_key(kube, t) for t in targets),
        f"the keys on {[t.host for t in targets]}",
    )
    joining = fleet.start("r2")  # while the remediations run
    fleet.wait_ready(joining)
    for target in targets:
        want = three.owner(f"{namespace}/{target.host}")
        started(
            owned_by(kube, namespace, target.host, {want}),
            f"{target.host} owned by {want}, the ring's choice once r2 joined",
            within=TAKEOVER,
        )
        started(
            in_phase(kube, target, "evacuating"),
            f"{target.node} tainted and {target.host} held off for its pod",
            within=TAKEOVER,
        )
    release_and_finish(kube, bmcs, watch, targets)
    for target in moved:  # each move a drain its old owner acknowledged
        said = " ".join(fleet.replicas[str(before[target.host])].output().split())
        assert f"host handed over host={namespace}/{target.host}" in said
