"""Replicas of ``metalmend run --shard`` sharing the hosts (docs/sharding.md), as an operator
runs them: real processes against the real API server, and real Redfish BMCs (the scale
lab's BMC server, ``metalmend_lab.scalebmc``: TLS, basic authentication, one port per
system, every reset journalled per host).

What is proven: every host is owned by one live replica; a reboot is served exactly once
(one power-off and one power-on at the BMC, whoever served it) while replicas are added,
killed with SIGKILL, or cut off from the API server; a killed replica's hosts are taken over
once its Lease expired, and a reboot requested meanwhile is served; a replica that cannot
renew its Lease stops and exits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Secret
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.resources import BareMetalHost
from metalmend.bmc.credentials import HOSTS_ANNOTATION, SECRET_LABEL
from metalmend.kube.shards import lease_name
from metalmend.policy.sharding import Ring, placement
from metalmend_lab.controlplane import LOOPBACK, ControlPlane, free_port
from metalmend_lab.pki import CertificateAuthority
from metalmend_lab.proxies import TcpProxy
from tests.support import started

HOSTS = 24  # enough that every replica holds some whatever the namespace's name
REBOOT = "reboot.metal3.io"
HARD = '{"mode":"hard"}'
# A Lease's duration (15 s) and the time to notice, assign and serve, on a busy machine.
TAKEOVER = 120.0


@dataclass
class Bmcs:
    ports: dict[str, Any]
    ca: Path
    journal: Path
    process: subprocess.Popen[bytes]

    def commands(self, host: str) -> list[str]:
        """The host's resets as its BMC journalled them: "hard off", "on", ..."""
        return [word for _, word in self.entries(host)]

    def entries(self, host: str) -> list[tuple[float, str]]:
        """The host's resets with the BMC's time of each (unix seconds)."""
        path = self.journal / f"{host}.commands"
        if not path.exists():
            return []
        split = (line.split(" ", 1) for line in path.read_text().splitlines())
        return [(float(at), word) for at, word in split]


@pytest.fixture
def bmcs(tmp_path: Path) -> Iterator[Bmcs]:
    ca = CertificateAuthority(tmp_path / "pki")
    serving = ca.issue("bmc", "scale-bmc", ip_addresses=(LOOPBACK,), server=True)
    config = {
        "cert": str(serving.cert), "key": str(serving.key),
        "ports_file": str(tmp_path / "ports.json"), "journal_dir": str(tmp_path),
        "journal": [f"host-{i}" for i in range(HOSTS)],
        "systems": [{"id": f"sys-{i}", "host": f"host-{i}", "username": f"u{i}",
                     "password": f"p{i}"} for i in range(HOSTS)],
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    argv = [sys.executable, "-m", "metalmend_lab.scalebmc", str(tmp_path / "config.json")]
    process = subprocess.Popen(argv)
    try:
        ports = tmp_path / "ports.json"
        started(ports.exists, f"the lab BMCs to listen ({ports})", process)
        yield Bmcs(json.loads(ports.read_text()), ca.pair.cert, tmp_path, process)
    finally:
        process.terminate()
        process.wait(10)


def register(kube: Client, namespace: str, bmcs: Bmcs) -> list[str]:
    hosts = [f"host-{i}" for i in range(HOSTS)]
    for i, name in enumerate(hosts):
        kube.create(
            Secret(
                metadata=ObjectMeta(
                    name=f"{name}-bmc",
                    labels={SECRET_LABEL: "true"},
                    annotations={HOSTS_ANNOTATION: name},
                ),
                stringData={"username": f"u{i}", "password": f"p{i}"},
            ),
            namespace=namespace,
        )
        port = bmcs.ports["systems"][f"sys-{i}"]
        address = f"redfish+https://{LOOPBACK}:{port}/redfish/v1/Systems/sys-{i}"
        spec = {
            "online": True,
            "externallyProvisioned": True,
            "bmc": {"address": address, "credentialsName": f"{name}-bmc"},
        }
        kube.create(BareMetalHost(metadata=ObjectMeta(name=name), spec=spec), namespace=namespace)
    return hosts


@dataclass
class Replica:
    name: str
    port: int
    log: Path
    process: subprocess.Popen[bytes]
    proxy: TcpProxy | None = None
    _out: Any = field(default=None, repr=False)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Fleet:
    """The replicas of one test, each a ``metalmend run`` process with its log in a file
    (a pipe nobody reads would stop it once full)."""

    def __init__(self, control_plane: ControlPlane, namespace: str, bmcs: Bmcs, tmp: Path):
        self.control_plane, self.namespace, self.bmcs, self.tmp = (
            control_plane, namespace, bmcs, tmp,
        )  # fmt: skip
        self.replicas: dict[str, Replica] = {}
        # What every replica runs, and its settings by environment (METALMEND_<SECTION>_<NAME>,
        # settings.py); the fence tests (test_sharding_fences.py) add the remediation.
        self.controllers = "host-power"
        self.environment: dict[str, str] = {}

    def start(self, name: str, kubeconfig: Path | None = None) -> Replica:
        port = free_port()
        log = self.tmp / f"{name}.log"
        out = log.open("wb")
        argv = [
            sys.executable, "-m", "metalmend", "run",
            "--kubeconfig", str(kubeconfig or self.control_plane.kubeconfig),
            "--controllers", self.controllers, "--namespace", self.namespace,
            "--leader-elect", "--leader-election-namespace", self.namespace,
            "--shard", "--shard-id", name,
            "--bmc-ca-bundle", str(self.bmcs.ca), "--health-bind", f"127.0.0.1:{port}",
        ]  # fmt: skip
        env = {**os.environ, **self.environment}
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        replica = Replica(name, port, log, process, _out=out)
        self.replicas[name] = replica
        return replica

    def wait_ready(self, replica: Replica) -> None:
        def ready() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{replica.port}/readyz", timeout=2).is_success
            except httpx.HTTPError:
                return False

        started(ready, f"replica {replica.name} to hold its shard Lease (/readyz)", replica.process)

    def stop_all(self) -> None:
        for replica in self.replicas.values():
            if replica.process.poll() is None:
                replica.process.send_signal(signal.SIGTERM)
        for replica in self.replicas.values():
            try:
                replica.process.wait(30)
            except subprocess.TimeoutExpired:
                replica.process.kill()
                replica.process.wait(10)
            replica._out.close()


@pytest.fixture
def fleet(
    control_plane: ControlPlane, namespace: str, bmcs: Bmcs, tmp_path: Path
) -> Iterator[Fleet]:
    made = Fleet(control_plane, namespace, bmcs, tmp_path)
    try:
        yield made
    finally:
        made.stop_all()
        for replica in made.replicas.values():
            assert "Traceback" not in replica.output(), replica.output()


def owners(kube: Client, namespace: str, hosts: list[str]) -> dict[str, str | None]:
    found = {}
    for host in kube.list(BareMetalHost, namespace=namespace):
        labels = host.metadata.labels or {}
        if host.metadata.name in hosts:
            owner = labels.get(names.SHARD_REPLICA_LABEL)
            found[str(host.metadata.name)] = None if names.SHARD_DRAIN_LABEL in labels else owner
    return found


def metrics_of(fleet: Fleet, name: str) -> str:
    """The replica's /metrics text ("" when it does not answer)."""
    replica = fleet.replicas[name]
    try:
        return httpx.get(f"http://127.0.0.1:{replica.port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return ""


def leader_of(fleet: Fleet, among: set[str]) -> str | None:
    """The replica that counts the shares for /metrics: the leader (its sharder)."""
    for name in sorted(among):
        if 'metalmend_shard_hosts{replica="none"}' in metrics_of(fleet, name):
            return name
    return None


def ring_of(fleet: Fleet, live: set[str]) -> Ring | None:
    """The ring the leader among ``live`` assigns by (itself lighter: policy.sharding's
    placement); None while none of them leads."""
    leader = leader_of(fleet, live)
    return None if leader is None else placement(sorted(live), leader)


def settled_on(
    fleet: Fleet, kube: Client, namespace: str, hosts: list[str], live: set[str]
) -> Callable[[], bool]:
    """Every host owned as the leader among ``live`` assigns it, by the ring over ``live``
    with itself lighter (so each of ``live`` that the ring gives hosts holds them: on a
    busy machine a replica can answer /readyz before the leader has seen its Lease, and
    "owned by one of them" then held with every host still on the first), none draining,
    and host-power has read each (status.poweredOn written)."""

    def check() -> bool:
        ring = ring_of(fleet, live)
        if ring is None:
            return False
        found = owners(kube, namespace, hosts)
        if any(found.get(h) != ring.owner(f"{namespace}/{h}") for h in hosts):
            return False
        for host in kube.list(BareMetalHost, namespace=namespace):
            if (host.get("status") or {}).get("poweredOn") is not True:
                return False
        return True

    return check


def ask_reboot(kube: Client, namespace: str, host: str) -> None:
    kube.patch(
        BareMetalHost, host, {"metadata": {"annotations": {REBOOT: HARD}}},
        namespace=namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip


def served(kube: Client, namespace: str, bmcs: Bmcs, hosts: list[str], count: int) -> bool:
    """Every host's BMC saw ``count`` reboots (off, on), its annotation is gone and it is on."""
    for host in kube.list(BareMetalHost, namespace=namespace):
        name = str(host.metadata.name)
        if name not in hosts:
            continue
        if REBOOT in (host.metadata.annotations or {}):
            return False
        if (host.get("status") or {}).get("poweredOn") is not True:
            return False
        if bmcs.commands(name).count("on") < count:
            return False
    return True


def assert_each_reboot_once(bmcs: Bmcs, hosts: list[str], count: int) -> None:
    for host in hosts:
        assert bmcs.commands(host) == ["hard off", "on"] * count, (
            f"{host}: {count} reboot(s) asked, the BMC saw {bmcs.commands(host)}"
        )


def test_three_replicas_share_the_hosts_and_each_reboot_is_served_once(
    fleet: Fleet, kube: Client, namespace: str, bmcs: Bmcs
) -> None:
    hosts = register(kube, namespace, bmcs)
    replicas = [fleet.start(f"r{i}") for i in range(3)]
    for replica in replicas:
        fleet.wait_ready(replica)
    live = {r.name for r in replicas}
    started(settled_on(fleet, kube, namespace, hosts, live), "every host owned by a live replica")
    shares = owners(kube, namespace, hosts)
    assert set(shares.values()) == live, f"every replica holds some of {HOSTS} hosts: {shares}"
    for name in live:  # one Lease per replica, labelled with its ring and name
        lease = kube.get(Lease, lease_name("metalmend", name), namespace=namespace)
        assert lease.metadata is not None
        assert lease.metadata.labels is not None
        assert lease.metadata.labels[names.SHARD_REPLICA_LABEL] == name
    for host in hosts:
        ask_reboot(kube, namespace, host)
    started(lambda: served(kube, namespace, bmcs, hosts, 1), "every host rebooted")
    assert_each_reboot_once(bmcs, hosts, 1)
    # The leader counts the shares for /metrics.
    texts = [httpx.get(f"http://127.0.0.1:{r.port}/metrics").text for r in replicas]
    counted = [t for t in texts if 'metalmend_shard_hosts{replica="none"} 0.0' in t]
    assert len(counted) == 1, "one replica (the leader) counts the shares"


def test_a_replica_added_takes_its_hosts_by_drain_and_no_reboot_is_served_twice(
    fleet: Fleet, kube: Client, namespace: str, bmcs: Bmcs
) -> None:
    hosts = register(kube, namespace, bmcs)
    first = [fleet.start(f"r{i}") for i in range(2)]
    for replica in first:
        fleet.wait_ready(replica)
    started(settled_on(fleet, kube, namespace, hosts, {"r0", "r1"}), "every host owned by r0 or r1")
    before = owners(kube, namespace, hosts)
    for host in hosts:
        ask_reboot(kube, namespace, host)
    third = fleet.start("r2")  # joins while the reboots are being served
    fleet.wait_ready(third)
    started(lambda: served(kube, namespace, bmcs, hosts, 1), "every host rebooted")
    started(
        settled_on(fleet, kube, namespace, hosts, {"r0", "r1", "r2"}),
        "every host owned by a live replica once r2 joined",
    )
    after = owners(kube, namespace, hosts)
    moved = {h for h in hosts if before[h] != after[h]}
    assert moved, f"r2 took some hosts: {after}"
    assert {after[h] for h in moved} == {"r2"}, "hosts move only to the newcomer"
    # Exactly those the ring moves (about a quarter: policy.sharding's bounds are unit-tested),
    # with the same leader lighter on both rings.
    leader = leader_of(fleet, {"r0", "r1"})
    assert leader is not None
    two, three = placement(["r0", "r1"], leader), placement(["r0", "r1", "r2"], leader)
    assert moved == {
        h for h in hosts if two.owner(f"{namespace}/{h}") != three.owner(f"{namespace}/{h}")
    }
    assert_each_reboot_once(bmcs, hosts, 1)
    # Each move was a drain the old owner acknowledged.
    for host in moved:
        assert f"host handed over host={namespace}/{host}" in _text(fleet, str(before[host]))
    for host in hosts:  # and the next reboot is served by the new owner, once
        ask_reboot(kube, namespace, host)
    started(lambda: served(kube, namespace, bmcs, hosts, 2), "every host rebooted again")
    assert_each_reboot_once(bmcs, hosts, 2)


def _text(fleet: Fleet, name: str) -> str:
    return " ".join(fleet.replicas[name].output().split())


def test_a_killed_replicas_hosts_are_taken_over_after_its_lease_and_their_reboots_served(
    fleet: Fleet, kube: Client, namespace: str, bmcs: Bmcs
) -> None:
    hosts = register(kube, namespace, bmcs)
    replicas = [fleet.start(f"r{i}") for i in range(3)]
    for replica in replicas:
        fleet.wait_ready(replica)
    started(settled_on(fleet, kube, namespace, hosts, {"r0", "r1", "r2"}), "every host owned")
    victim = fleet.replicas["r1"]
    theirs = [h for h, owner in owners(kube, namespace, hosts).items() if owner == "r1"]
    assert theirs
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(10)
    for host in theirs:  # asked while nobody serves them
        ask_reboot(kube, namespace, host)
    started(
        settled_on(fleet, kube, namespace, hosts, {"r0", "r2"}),
        f"r1's hosts {theirs} taken over by r0 or r2 after r1's Lease expired",
        within=TAKEOVER,
    )
    started(lambda: served(kube, namespace, bmcs, theirs, 1), f"{theirs} rebooted")
    assert_each_reboot_once(bmcs, theirs, 1)
    assert_each_reboot_once(bmcs, [h for h in hosts if h not in theirs], 0)
    lease = kube.get(Lease, lease_name("metalmend", "r1"), namespace=namespace)
    assert lease.spec is not None
    assert lease.spec.holderIdentity, "killed: never released"


def test_the_leader_killed_during_reboots_a_new_leader_takes_a_lighter_share_and_none_is_served_twice(
    fleet: Fleet, kube: Client, namespace: str, bmcs: Bmcs
) -> None:
    """The leader holds fewer hosts than the others (its weight on the ring). Killed with
    SIGKILL while every host's reboot is being served: its hosts go to the others once its
    Lease expired, and the new leader, now lighter, drains some of its own to the third
    replica. Each reboot is served once through both kinds of move."""
    hosts = register(kube, namespace, bmcs)
    replicas = [fleet.start(f"r{i}") for i in range(3)]
    for replica in replicas:
        fleet.wait_ready(replica)
    live = {r.name for r in replicas}
    started(settled_on(fleet, kube, namespace, hosts, live), "every host owned")
    leader = leader_of(fleet, live)
    assert leader is not None
    before = owners(kube, namespace, hosts)
    for host in hosts:
        ask_reboot(kube, namespace, host)
    fleet.replicas[leader].process.send_signal(signal.SIGKILL)
    fleet.replicas[leader].process.wait(10)
    live -= {leader}
    started(
        settled_on(fleet, kube, namespace, hosts, live),
        f"{leader}'s hosts taken over and the new leader among {sorted(live)} lighter",
        within=TAKEOVER,
    )
    successor = leader_of(fleet, live)
    assert successor is not None
    after = owners(kube, namespace, hosts)
    assert {after[h] for h in hosts if before[h] == leader} <= live
    given_up = [h for h in hosts if before[h] == successor and after[h] != successor]
    for host in given_up:  # drained by the new leader's own host-power, not taken
        assert f"host handed over host={namespace}/{host}" in _text(fleet, successor)
    started(lambda: served(kube, namespace, bmcs, hosts, 1), "every host rebooted")
    assert_each_reboot_once(bmcs, hosts, 1)


def test_a_replica_stopped_during_reboots_hands_its_hosts_over_at_once_and_none_is_served_twice(
    fleet: Fleet, kube: Client, namespace: str, bmcs: Bmcs
) -> None:
    """Scaling down (SIGTERM, as a StatefulSet's Pod is stopped): the replica cancels its
    work, then releases its Lease, and the leader gives its hosts away without waiting for
    an expiry."""
    hosts = register(kube, namespace, bmcs)
    replicas = [fleet.start(f"r{i}") for i in range(3)]
    for replica in replicas:
        fleet.wait_ready(replica)
    started(settled_on(fleet, kube, namespace, hosts, {"r0", "r1", "r2"}), "every host owned")
    theirs = [h for h, owner in owners(kube, namespace, hosts).items() if owner == "r2"]
    assert theirs
    for host in hosts:
        ask_reboot(kube, namespace, host)
    leaving = fleet.replicas["r2"]
    leaving.process.send_signal(signal.SIGTERM)  # while the reboots are being served
    assert leaving.process.wait(60) == 0, leaving.output()
    lease = kube.get(Lease, lease_name("metalmend", "r2"), namespace=namespace)
    assert lease.spec is not None
    assert not lease.spec.holderIdentity, "a graceful stop releases the shard Lease"
    started(settled_on(fleet, kube, namespace, hosts, {"r0", "r1"}), "r2's hosts taken by r0 or r1")
    started(lambda: served(kube, namespace, bmcs, hosts, 1), "every host rebooted")
    assert_each_reboot_once(bmcs, hosts, 1)


def test_a_replica_cut_off_from_the_api_server_stops_and_its_hosts_move(
    fleet: Fleet, kube: Client, namespace: str, bmcs: Bmcs, control_plane: ControlPlane,
    tmp_path: Path,
) -> None:  # fmt: skip
    import asyncio

    hosts = register(kube, namespace, bmcs)
    leader = fleet.start("r0")
    fleet.wait_ready(leader)
    # r1 reaches the API server through a proxy the test cuts.
    loop = asyncio.new_event_loop()
    proxy = TcpProxy("127.0.0.1", control_plane.ports.apiserver)
    port = loop.run_until_complete(proxy.start())
    runner = _run_loop_in_thread(loop)
    try:
        via = control_plane.kubeconfig_via(f"https://127.0.0.1:{port}", tmp_path / "via-proxy")
        cut = fleet.start("r1", kubeconfig=via)
        fleet.wait_ready(cut)
        started(settled_on(fleet, kube, namespace, hosts, {"r0", "r1"}), "every host owned")
        theirs = [h for h, owner in owners(kube, namespace, hosts).items() if owner == "r1"]
        assert theirs, "r1 holds some hosts"
        # The link goes silent: connections stay open, nothing answers (a partition that
        # drops packets, the harder case: no error ends a request). It cannot renew: it
        # stops acting at its renew deadline and exits, so that a fresh process (kubelet's
        # restart) stands again.
        proxy.delay = 3600.0
        started(lambda: cut.process.poll() is not None, "r1 to exit once it cannot renew")
        assert cut.process.returncode == 1
        assert "could not renew lease" in cut.output()
        for host in theirs:
            ask_reboot(kube, namespace, host)
        started(
            settled_on(fleet, kube, namespace, hosts, {"r0"}),
            "r1's hosts taken over by r0",
            within=TAKEOVER,
        )
        started(lambda: served(kube, namespace, bmcs, theirs, 1), f"{theirs} rebooted")
        assert_each_reboot_once(bmcs, theirs, 1)
    finally:
        loop.call_soon_threadsafe(proxy.restore)
        asyncio.run_coroutine_threadsafe(proxy.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)


def _run_loop_in_thread(loop: Any) -> Any:
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    return thread


def test_sharding_needs_leader_election(control_plane: ControlPlane) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "metalmend", "run", "--kubeconfig",
         str(control_plane.kubeconfig), "--shard"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--shard needs runtime.leader_elect" in result.stderr


async def test_a_lease_holder_behind_a_silent_api_server_stops_before_another_takes_it(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """The renewal is bounded by the renew deadline (as client-go's context): an API server
    that keeps the connection and never answers must not keep the work running until the
    Lease has expired for others. Before, one renewal waited for the HTTP client's own
    timeout while the work went on."""
    import asyncio

    from lightkube import AsyncClient, KubeConfig

    from metalmend.kube.leader import LeaderElector, LeadershipLost, LeaseTiming

    proxy = TcpProxy("127.0.0.1", control_plane.ports.apiserver)
    port = await proxy.start()
    via = control_plane.kubeconfig_via(f"https://127.0.0.1:{port}", tmp_path / "silent")
    silent, direct = (
        AsyncClient(KubeConfig.from_file(via)),
        AsyncClient(KubeConfig.from_file(control_plane.kubeconfig)),
    )
    timing = LeaseTiming(lease_duration=6, renew_deadline=4, retry_period=1)
    first = LeaderElector(silent, "silent", namespace, "first", timing)
    second = LeaderElector(direct, "silent", namespace, "second", timing)
    working, stopped, taken = asyncio.Event(), asyncio.Event(), asyncio.Event()
    stopped_when_taken: list[bool] = []

    async def lead_first() -> None:
        working.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    async def lead_second() -> None:
        stopped_when_taken.append(stopped.is_set())
        taken.set()
        await asyncio.Event().wait()

    one = asyncio.create_task(first.run(lead_first))
    two: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(working.wait(), 60)
        two = asyncio.create_task(second.run(lead_second))
        proxy.delay = 3600.0  # silent from now on
        with pytest.raises(LeadershipLost):
            await asyncio.wait_for(one, 120)
        await asyncio.wait_for(taken.wait(), 120)
        assert stopped_when_taken == [True], "the first stopped before the second took over"
    finally:
        for task in (one, two):
            if task is not None:
                task.cancel()
        await asyncio.gather(one, *([two] if two else []), return_exceptions=True)
        proxy.delay = 0.0
        await proxy.stop()
        await silent.close()
        await direct.close()
