"""metalmend at scale: N BareMetalHosts, Machines and Nodes in one lab, every controller of
`metalmend run` on, against 1 host of the same lab shape, side by side in one run.

The lab for it (not ``lab up``, whose per-host kubelet simulators and BMC processes stop at
tens of hosts):

- the upstream control plane (lab.controlplane), with an audit log of metalmend's requests
  alone (user ``metalmend``, system:masters; Metadata level, as benchmarks/at_rest.py);
- Nodes kept Ready by kwok (tools/kwok/build.sh, pinned, cached): each Node is created with
  annotation ``kwok.x-k8s.io/node: fake`` and the host's providerID; kwok renews its Lease
  (``--node-lease-duration-seconds`` LEASE) and answers for it as a kubelet would;
- BMCs: lab.scalebmc, one process serving every host's ComputerSystem over real Redfish
  (TLS from the lab CA, basic auth with each host's own Secret), one 127.0.0.1 port per
  host as a site has one BMC per server; metalmend's Redfish driver drives it unchanged;
- per host, as ``lab up`` registers them (metalmend_lab.hosts.register_host): a labelled, bound BMC
  Secret, a BareMetalHost (online, provisioned) and its Machine; one MachineHealthCheck
  over every Machine with the lab's remediation template.

`metalmend run` runs every controller the lab runs, as the lab runs it
(lab.controller_argv), except the power poll: the production default (POLL s) instead of
the lab's 5 s. Printed, per lab size:

- start to every host reconciled: from `metalmend run` started until every host has
  ``lastPoweredOn`` (host-power read its BMC and wrote it) and every Machine its
  ``nodeRef`` (node-link) and the check's verdict (``HealthCheckSucceeded``, the health
  check: its first verdicts are writes of the start, not of the steady state);
- settled: metalmend's last write before it was quiet for QUIET s, after the last host
  reconciled (target: within SETTLE_WITHIN s; "not within" when it still writes then);
- steady state, a WINDOW s window (at least one status heartbeat of every Node: kwok's
  stage at a kubelet's cadence, HEARTBEAT) once metalmend has settled, or SETTLE_WITHIN s
  after the last host reconciled when it has not: metalmend's
  API requests and writes per second (audit log; target 0 writes), every identity's
  requests per second (``apiserver_request_total``: kwok's Leases are most of them), BMC
  calls per second (the server's counters), the controller's CPU (utime+stime from /proc)
  and RSS (VmRSS at the end of the window, VmHWM the peak since start);
- reboot latency: REBOOTS hard reboots of one host in turn (benchmarks.shared.one_reboot:
  annotation written -> lastPoweredOn newer seen by a watcher), p50/p99;
- health-check verdict latency: VERDICTS Nodes given a KernelDeadlock=True condition at
  staggered moments; from the condition's timeout expiring to the Metal3Remediation
  created, seen by a watcher (as benchmarks/detection_latency.py), p50/p99; and the
  health check's evaluations over that phase and the seconds they took (its reconciles,
  from metalmend's /metrics): the work behind the latency, which the machine's load does
  not change the way it changes a latency.

metalmend's Kubernetes client (lightkube) has no client-side rate limiter: no QPS, no burst
(client-go's defaults would be 5 QPS, burst 10). Its requests are bounded by the
controllers' workers (host-power: bmc.max_in_flight + 4 = 20) and the API server's own
flow control; the start-up QPS printed is what that gives.

Run: ``python -m benchmarks.scale [--hosts N]`` (default HOSTS, or
``METALMEND_BENCH_SCALE_HOSTS``; `make bench` runs the default;
``METALMEND_BENCH_SCALE_BUDGET``: another ``power.poll_budget`` for `metalmend run`). Needs
kwok (``make kwok``). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node
from lightkube.types import PatchType
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.at_rest import AUDIT_POLICY, AUDIT_WRITES, USER, audit_events, last_write
from benchmarks.shared import WRITES, apiserver_requests, one_reboot
from metalmend.api.resources import (
    BareMetalHost,
    Machine,
    MachineHealthCheck,
    Metal3Remediation,
    Metal3RemediationTemplate,
)
from metalmend.kube.crds import install_crds
from metalmend_lab import lab
from metalmend_lab.assets import REPO_ROOT
from metalmend_lab.controlplane import (
    LOOPBACK,
    Component,
    ControlPlane,
    ControlPlaneConfig,
    free_port,
    start_component,
)
from metalmend_lab.hosts import NAMESPACE, register_host
from metalmend_lab.inventory import HostSpec

HOSTS = int(os.environ.get("METALMEND_BENCH_SCALE_HOSTS", "1000"))
# Another power.poll_budget than the default (reads a second per process), to measure it.
BUDGET = os.environ.get("METALMEND_BENCH_SCALE_BUDGET", "")
POLL = 20.0  # host-power's poll interval: the production default (PowerSettings)
QUIET = 10.0
SETTLE_WITHIN = 120.0  # the target: settled within this of the last host reconciled
# kwok's Node status heartbeat at a kubelet's cadence: a kubelet reports an unchanged Node
# status every nodeStatusReportFrequency (5 minutes by default; "Node heartbeats",
# https://kubernetes.io/docs/concepts/architecture/nodes/#node-heartbeats), kwok's own
# stage every 10-10.2 minutes. Each Node's next heartbeat is HEARTBEAT to
# HEARTBEAT + HEARTBEAT_JITTER ms after its last.
# (METALMEND_BENCH_SCALE_HEARTBEAT, seconds: a shorter cadence for a quicker run)
HEARTBEAT = int(float(os.environ.get("METALMEND_BENCH_SCALE_HEARTBEAT", "300")) * 1000)
HEARTBEAT_JITTER = 10_000
# kwok starts a Node's stage delay again whenever the Node changes, so a Node written by
# anyone else every few minutes never gets its heartbeat. kube-controller-manager does that
# after 5,000 Nodes register: its TTL controller annotates every Node again each time the
# cluster's size crosses one of its boundaries (100, 500, 1,000, 2,000 Nodes), and with
# the node lifecycle controller's taint removals that is over 10,000 PATCHes of Nodes at
# its default 20 requests a second: minutes of them, through the steady window (one run
# saw 17 a second there and a heartbeat from 1,270 of 5,000 Nodes). A kubelet heartbeats
# on its own clock whatever else writes its Node, so the lab removes the cause: no TTL
# controller (its annotation only tunes kubelets' caches, and kwok runs no kubelet) and a
# client limit of a large cluster's controller manager, so the taint removals are done
# before metalmend has reconciled every host. "Nodes with a status heartbeat in it" shows
# whether the window holds one of every Node, read from the Nodes.
CONTROLLER_MANAGER_ARGS = ("--controllers=*,-ttl-controller", "--kube-api-qps=200",
                           "--kube-api-burst=400")  # fmt: skip
# The steady window covers at least one status heartbeat of every Node (its longest gap)
WINDOW = (HEARTBEAT + HEARTBEAT_JITTER) / 1000 + 10.0
REBOOTS = int(os.environ.get("METALMEND_BENCH_SCALE_REBOOTS", "50"))
VERDICTS = 20
VERDICT_TIMEOUT = 5  # seconds of KernelDeadlock=True before a Machine is unhealthy
LEASE = 600  # kwok's Node Lease duration (s): renewed every quarter of it
GRACE = 1800.0  # the node lifecycle controller's grace: longer than a renewal
REGISTER_THREADS = 16
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
CLIENT_LIMITS = (
    "lightkube AsyncClient: no client-side QPS or burst limit (client-go default: QPS 5,"
    " burst 10); concurrency bounded by workers (host-power 20)"
)


@dataclass
class Measurement:
    hosts: int
    reconciled_after: float
    startup: Counter[tuple[str, str]]  # metalmend's requests until reconciled (audit)
    settled_after: float | None
    seconds: float = 0.0
    ours: Counter[tuple[str, str]] = field(default_factory=Counter)  # audit, in the window
    every: Counter[tuple[str, str]] = field(default_factory=Counter)  # apiserver_request_total
    bmc_calls: int = 0
    cpu_seconds: float = 0.0
    rss_mib: float = 0.0
    peak_rss_mib: float = 0.0
    reboots: list[float] = field(default_factory=list)  # request -> status seen, ms
    reboots_off: list[float] = field(default_factory=list)  # request -> off at the BMC, ms
    verdicts: list[float] = field(default_factory=list)  # ms
    verdict_work: tuple[float, float] = (0.0, 0.0)  # the check's reconciles, their seconds
    nodes_beat: int = 0  # Nodes whose status heartbeat (lastHeartbeatTime) fell in the window

    def per_second(self, count: float) -> float:
        return count / self.seconds if self.seconds else 0.0


# ---- the controller process, from /proc ------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (fields 14 and 15 of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


# ---- the lab: BMCs, hosts, Nodes, kwok -------------------------------------------------------


def system_id(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.metalmend.scale"))


def start_bmcs(
    plane: ControlPlane,
    workdir: Path,
    names: list[str],
    journal: list[str] | None = None,
    journal_peers: bool = False,
) -> tuple[Component, dict[str, Any], list[HostSpec]]:
    """lab.scalebmc for ``names``; the host specs name each host's own port. ``journal``:
    the hosts whose resets are journalled (the first by default); ``journal_peers``: each
    journalled reset names the process that sent it."""
    serving = plane.ca.issue("scale-bmc", "scale-bmc", ip_addresses=(LOOPBACK,), server=True)
    credentials = {name: (f"admin-{name}", uuid.uuid4().hex[:16]) for name in names}
    ports_file = workdir / "bmc-ports.json"
    config = {
        "cert": str(serving.cert), "key": str(serving.key), "ports_file": str(ports_file),
        "journal_dir": str(workdir),
        "journal": names[:1] if journal is None else journal, "journal_peers": journal_peers,
        "systems": [{"id": system_id(n), "host": n, "username": credentials[n][0],
                     "password": credentials[n][1]} for n in names],
    }  # fmt: skip
    (workdir / "bmc.json").write_text(json.dumps(config))
    argv = [sys.executable, "-m", "metalmend_lab.scalebmc", str(workdir / "bmc.json")]
    component = start_component("scale-bmc", argv, workdir, ports_file.exists, timeout=300)
    ports = json.loads(ports_file.read_text())
    specs = [
        HostSpec(
            name=n,
            namespace=NAMESPACE,
            bmc="redfish",
            bmc_port=ports["systems"][system_id(n)],
            internal_port=0,
            username=credentials[n][0],
            password=credentials[n][1],
            provider_id=f"metal3://{NAMESPACE}/{n}",
            kubeconfig="",
            system_id=system_id(n),
        )
        for n in names
    ]
    return component, ports, specs


def register(kubeconfig: Path, specs: list[HostSpec]) -> None:
    """Per host, as ``lab up`` registers it (Secret, Machine, BareMetalHost), and its Node
    for kwok; on REGISTER_THREADS threads (one lightkube client each)."""
    local = threading.local()

    def client() -> Client:
        if not hasattr(local, "client"):
            local.client = Client(KubeConfig.from_file(kubeconfig))
        found: Client = local.client
        return found

    def one(spec: HostSpec) -> None:
        register_host(client(), spec)
        client().create(
            Node(
                metadata=ObjectMeta(
                    name=spec.name,
                    labels={"kubernetes.io/hostname": spec.name, "type": "kwok"},
                    annotations={KWOK_ANNOTATION: "fake"},
                ),
                spec=NodeSpec(providerID=spec.provider_id),
            )
        )

    Client(KubeConfig.from_file(kubeconfig)).create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    # The first host alone: lightkube's decoders (msgspec) are built at the first answer of
    # each kind, and building them on 16 threads at once crashed the interpreter
    # (SIGSEGV in msgspec's get_class_annotations, twice in a row on a busy machine).
    one(specs[0])
    with ThreadPoolExecutor(REGISTER_THREADS) as pool:
        list(pool.map(one, specs[1:]))


def health_check(client: Client) -> None:
    """The lab's remediation template, and one check over every Machine: Ready=Unknown for
    5 minutes (never, with kwok) or KernelDeadlock=True for VERDICT_TIMEOUT s."""
    template = {"strategy": "reboot", "powerOffTimeoutSeconds": 60, "powerOnTimeoutSeconds": 120}
    client.create(
        Metal3RemediationTemplate(
            metadata=ObjectMeta(name="fence"), spec={"template": {"spec": template}}
        ),
        namespace=NAMESPACE,
    )
    spec = {
        "clusterName": "lab", "selector": {"matchLabels": {"role": "worker"}},
        "unhealthyConditions": [
            {"type": "Ready", "status": "Unknown", "timeout": "300s"},
            {"type": "KernelDeadlock", "status": "True", "timeout": f"{VERDICT_TIMEOUT}s"},
        ],
        "remediationTemplate": {"apiVersion": "remediation.metal3.io/v1alpha1",
                                "kind": "Metal3RemediationTemplate", "name": "fence"},
    }  # fmt: skip
    client.create(
        MachineHealthCheck(metadata=ObjectMeta(name="workers"), spec=spec), namespace=NAMESPACE
    )


def kwok_binary() -> tuple[Path, list[Path]]:
    """kwok, and the Node stages tools/kwok/build.sh put next to it."""
    out = subprocess.run(
        ["bash", str(REPO_ROOT / "tools" / "kwok" / "build.sh")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    binary = Path(out.stdout.strip().splitlines()[-1])
    return binary, sorted((binary.parent / "stages").glob("*.yaml"))


def kubelet_cadence(stages: list[Path], workdir: Path, spread: bool = False) -> list[Path]:
    """kwok's stages, its Node status heartbeat at a kubelet's cadence (HEARTBEAT): copies
    in ``workdir``, the cached ones unchanged.

    ``spread``: each gap drawn from HEARTBEAT/2 to 3 HEARTBEAT/2 instead of HEARTBEAT to
    HEARTBEAT + HEARTBEAT_JITTER. The Nodes are initialised together, so with the narrow
    jitter they heartbeat in waves (every Node within a minute or so, then none for
    minutes); kubelets started at different times heartbeat at every moment. With the wide
    one the mean stays HEARTBEAT and the first gaps already spread the heartbeats over the
    whole cycle, as a fleet's are, while each Node's longest gap grows to 3 HEARTBEAT/2."""
    written = []
    for path in stages:
        stage = yaml.safe_load(path.read_text())
        if stage["metadata"]["name"] == "node-heartbeat-with-lease":
            shortest, longest = (
                (HEARTBEAT // 2, HEARTBEAT * 3 // 2)
                if spread
                else (HEARTBEAT, HEARTBEAT + HEARTBEAT_JITTER)
            )
            delay = {"durationMilliseconds": shortest, "jitterDurationMilliseconds": longest}
            stage["spec"]["delay"] = delay
        copy = workdir / f"stage-{path.name}"
        copy.write_text(yaml.safe_dump(stage))
        written.append(copy)
    return written


def start_kwok(plane: ControlPlane, workdir: Path, spread: bool = False) -> Component:
    """kwok, managing only the Nodes annotated for it, as its own identity (in
    system:masters: the Node authorizer lets one identity write one Node only)."""
    kubeconfig = plane.user_kubeconfig("kwok", ("system:masters",))
    config = workdir / "kwok.yaml"
    # kwok's own defaults, written out: this kwok does not default them from a file
    options = {"nodeLeaseDurationSeconds": LEASE, "nodeLeaseParallelism": 4,
               "nodePlayStageParallelism": 4, "podPlayStageParallelism": 4,
               "podsOnNodeSyncParallelism": 1}  # fmt: skip
    kind = {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration"}
    config.write_text(yaml.safe_dump({**kind, "options": options}))
    binary, stages = kwok_binary()
    stages = kubelet_cadence(stages, workdir, spread)
    argv = [
        str(binary), f"--kubeconfig={kubeconfig}",
        *(f"--config={path}" for path in (config, *stages)),
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
        f"--node-lease-duration-seconds={LEASE}", f"--server-address={LOOPBACK}:{free_port()}",
        f"--node-ip={LOOPBACK}",
    ]  # fmt: skip
    return start_component("kwok", argv, workdir, lambda: True)


def listing(plane: ControlPlane, path: str) -> list[dict[str, Any]]:
    """A list from the API server's watch cache (resourceVersion=0): cheap to repeat."""
    with plane.admin_http(timeout=60.0) as http:
        items: list[dict[str, Any]] = http.get(path, params={"resourceVersion": "0"}).json()[
            "items"
        ]
        return items


def nodes_beat_since(plane: ControlPlane, since: float) -> int:
    """Nodes whose Ready condition's lastHeartbeatTime is ``since`` or later, read from the
    Nodes themselves: a count of Node writes does not say which Nodes were written."""
    beat = 0
    for node in listing(plane, "/api/v1/nodes"):
        for condition in node.get("status", {}).get("conditions") or []:
            stamp = condition.get("lastHeartbeatTime")
            if condition["type"] == "Ready" and stamp:
                when = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
                beat += when.timestamp() >= since
    return beat


def nodes_ready(plane: ControlPlane) -> int:
    return sum(
        any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in n.get("status", {}).get("conditions") or []
        )
        for n in listing(plane, "/api/v1/nodes")
    )


class Progress:
    """When each host was first seen reconciled, from two watches started before
    `metalmend run` (a list of every host every few seconds cost the API server more than
    metalmend did at 5,000 hosts): its BareMetalHost has ``lastPoweredOn``, its Machine a
    ``nodeRef`` and a ``HealthCheckSucceeded`` condition. Daemon threads: they end with the
    benchmark."""

    def __init__(self, kubeconfig: Path, hosts: int) -> None:
        self.hosts = hosts
        self.powered: dict[str, float] = {}
        self.linked: dict[str, float] = {}
        for resource, seen, done in (
            (BareMetalHost, self.powered, has_powered_on),
            (Machine, self.linked, linked_and_checked),
        ):
            args = (kubeconfig, resource, seen, done)
            threading.Thread(target=self._watch, args=args, daemon=True).start()

    @staticmethod
    def _watch(
        kubeconfig: Path, resource: Any, seen: dict[str, float], done: Callable[[Any], bool]
    ) -> None:
        with contextlib.suppress(Exception):  # the lab stopped
            for _, obj in Client(KubeConfig.from_file(kubeconfig)).watch(
                resource, namespace=NAMESPACE
            ):
                if done(obj):
                    seen.setdefault(obj.metadata.name, time.time())

    def finished_at(self) -> float | None:
        """When the last host was reconciled; None while some are not."""
        if len(self.powered) < self.hosts or len(self.linked) < self.hosts:
            return None
        return max(max(self.powered.values()), max(self.linked.values()))


def has_powered_on(host: Any) -> bool:
    return bool(((host.get("status") or {}).get("provisioning") or {}).get("lastPoweredOn"))


def linked_and_checked(machine: Any) -> bool:
    """node-link gave the Machine its ``nodeRef`` and the health check its verdict."""
    status = machine.get("status") or {}
    checked = any(c.get("type") == "HealthCheckSucceeded" for c in status.get("conditions") or [])
    return bool(status.get("nodeRef")) and checked


def wait_for(
    check: Callable[[], bool], within: float, every: float, what: str, alive: Callable[[], bool]
) -> None:
    """Wait for ``check``; fail at once when ``alive`` says a process it needs has died."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        if not alive():
            raise RuntimeError(f"{what}: a process it needs has exited (see its log)")
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {within:.0f}s")


def bmc_calls(ports: dict[str, Any]) -> int:
    counters = httpx.get(f"http://{LOOPBACK}:{ports['control']}/counters", timeout=10).json()
    total: int = counters["requests"]
    return total


# ---- the measured phases ---------------------------------------------------------------------


def settle(audit: Path, since: float) -> float | None:
    """Seconds after ``since`` (the last host reconciled) until metalmend's last write
    before a quiet stretch of QUIET s; None when it still writes SETTLE_WITHIN s after
    ``since`` (the target; the steady window is measured either way)."""
    while (now := time.time()) - since < SETTLE_WITHIN + QUIET:
        last = max(last_write(audit) or since, since)
        if now - last >= QUIET:
            return last - since if last - since <= SETTLE_WITHIN else None
        time.sleep(1.0)
    return None


def steady_window(
    m: Measurement, plane: ControlPlane, audit: Path, pid: int, ports: dict[str, Any]
) -> None:
    every_before, calls_before, cpu_before = (
        apiserver_requests(plane),
        bmc_calls(ports),
        cpu_seconds(pid),
    )
    since = time.time()
    time.sleep(WINDOW)
    until = time.time()
    m.every = apiserver_requests(plane) - every_before
    m.bmc_calls = bmc_calls(ports) - calls_before
    m.cpu_seconds = cpu_seconds(pid) - cpu_before
    m.rss_mib, m.peak_rss_mib = memory_mib(pid)
    m.seconds = until - since
    m.nodes_beat = nodes_beat_since(plane, math.floor(since))  # the stamps have whole seconds
    time.sleep(1.0)  # the audit log has the window's last requests
    m.ours = by_verb_and_resource(audit_events(audit, since, until))


def by_verb_and_resource(events: Iterator[dict[str, Any]]) -> Counter[tuple[str, str]]:
    found: Counter[tuple[str, str]] = Counter()
    for event in events:
        ref = event.get("objectRef") or {}
        resource = (ref.get("resource") or "?") + (
            f"/{ref['subresource']}" if ref.get("subresource") else ""
        )
        found[event["verb"], resource] += 1
    return found


async def reboots(kubeconfig: Path, name: str, commands: Path) -> tuple[list[float], list[float]]:
    client = AsyncClient(KubeConfig.from_file(kubeconfig))
    to_status, to_off = [], []
    try:
        for _ in range(REBOOTS):
            off_ms, _, total_ms = await one_reboot(client, name, commands)
            to_status.append(total_ms)
            to_off.append(off_ms)
    finally:
        await client.close()
    return to_status, to_off


async def verdicts(kubeconfig: Path, names: list[str]) -> list[float]:
    """KernelDeadlock=True on each Node in turn (a strategic merge: kwok's conditions
    stay); expiry -> Metal3Remediation created, ms."""
    client = AsyncClient(KubeConfig.from_file(kubeconfig))
    created: dict[str, float] = {}

    async def watch() -> None:
        async for kind, obj in client.watch(Metal3Remediation, namespace=NAMESPACE):
            if kind == "ADDED":
                created.setdefault(obj.metadata.name, time.time())
            if set(names) <= set(created):
                return

    watcher = asyncio.create_task(watch())
    expiries: dict[str, float] = {}
    try:
        for name in names:
            now = dt.datetime.now(dt.UTC).isoformat()
            condition = {"type": "KernelDeadlock", "status": "True", "reason": "Bench",
                         "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
            node: Any = await client.patch(
                Node.Status, name, {"status": {"conditions": [condition]}},
                patch_type=PatchType.STRATEGIC,
            )  # fmt: skip
            since = next(
                c.lastTransitionTime for c in node.status.conditions if c.type == "KernelDeadlock"
            )
            expiries[name] = since.timestamp() + VERDICT_TIMEOUT  # as stored: whole seconds
            await asyncio.sleep(0.5)
        await asyncio.wait_for(watcher, 120)
    finally:
        watcher.cancel()
        await client.close()
    return [(created[n] - expiries[n]) * 1000 for n in names]


@dataclass
class ScaleLab:
    """The lab of ``hosts`` hosts, every Node Ready (kwok), no metalmend yet."""

    plane: ControlPlane
    audit: Path  # the API server's audit log of metalmend's requests (user USER)
    bmcs: Component
    ports: dict[str, Any]  # lab.scalebmc's ports file: control port, system id -> port
    names: list[str]  # the hosts
    kubeconfig: Path  # metalmend's identity (USER, system:masters)


@contextlib.contextmanager
def scale_lab(
    hosts: int,
    workdir: Path,
    *,
    journal: list[str] | None = None,
    journal_peers: bool = False,
    heartbeats_spread: bool = False,
) -> Iterator[ScaleLab]:
    """The control plane with its audit log, the BMCs (``journal``: the hosts whose resets
    they journal, the first by default; ``journal_peers``: naming the sender), every host
    registered with its Node, the health check, kwok (``heartbeats_spread``: the Nodes'
    heartbeats spread over the cycle, ``kubelet_cadence``); stopped on leaving."""
    workdir.mkdir(parents=True, exist_ok=True)
    policy, audit = workdir / "audit-policy.yaml", workdir / "audit.log"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    config = ControlPlaneConfig(
        workdir=workdir / "controlplane", node_monitor_grace_period=GRACE,
        apiserver_args=(f"--audit-policy-file={policy}", f"--audit-log-path={audit}"),
        controller_manager_args=CONTROLLER_MANAGER_ARGS,
    )  # fmt: skip
    names = [f"worker-{i}" for i in range(hosts)]
    with contextlib.ExitStack() as stack:
        plane = ControlPlane(config)
        plane.start()
        stack.callback(plane.stop)
        admin = Client(KubeConfig.from_file(plane.kubeconfig))
        install_crds(admin)
        journalled = names[:1] if journal is None else journal
        bmcs, ports, specs = start_bmcs(plane, workdir, names, journalled, journal_peers)
        stack.callback(bmcs.stop)
        began = time.monotonic()
        register(plane.kubeconfig, specs)
        health_check(admin)
        print(f"  {hosts} hosts registered in {time.monotonic() - began:.0f}s", flush=True)
        kwok = start_kwok(plane, workdir, heartbeats_spread)
        stack.callback(kwok.stop)
        wait_for(lambda: nodes_ready(plane) >= hosts, 600, 3.0, "Nodes Ready (kwok)", kwok.running)
        kubeconfig = plane.user_kubeconfig(USER, ("system:masters",))
        yield ScaleLab(plane, audit, bmcs, ports, names, kubeconfig)


def measure(hosts: int, workdir: Path) -> Measurement:
    """One lab of ``hosts`` hosts, from nothing to every phase measured."""
    with contextlib.ExitStack() as stack:
        scale = stack.enter_context(scale_lab(hosts, workdir))
        plane, audit, bmcs, ports, names = (
            scale.plane, scale.audit, scale.bmcs, scale.ports, scale.names,
        )  # fmt: skip
        health_port = free_port()
        argv = lab.controller_argv(
            scale.kubeconfig, plane.ca.pair.cert, lab.DEFAULT_CONTROLLERS, health_port, 30.0
        )
        argv += ["--power-poll-interval", f"{POLL:g}"]  # the last flag wins
        if BUDGET:
            argv += ["--power-poll-budget", BUDGET]
        progress = Progress(plane.kubeconfig, hosts)
        time.sleep(2.0)  # the watches are open
        started = time.time()
        process = stack.enter_context(running(argv, workdir / "metalmend.log"))
        alive = lambda: process.poll() is None and bmcs.running()  # noqa: E731
        finished = progress.finished_at
        wait_for(lambda: finished() is not None, 1800, 1.0, "every host reconciled", alive)
        m = Measurement(hosts, (finished() or 0.0) - started, Counter(), None)
        until = started + m.reconciled_after
        m.startup = by_verb_and_resource(audit_events(audit, started, until))
        print(f"  {hosts} hosts reconciled {m.reconciled_after:.0f}s after start", flush=True)
        m.settled_after = settle(audit, finished() or time.time())
        steady_window(m, plane, audit, process.pid, ports)
        for row, value in list(rows(m).items())[:12]:  # kept even if a later phase fails
            print(f"  {row:50} {value:>22}", flush=True)
        m.reboots, m.reboots_off = asyncio.run(
            reboots(plane.kubeconfig, names[0], workdir / f"{names[0]}.commands")
        )
        sick = names[1 : 1 + VERDICTS] if hosts > 1 else names[:1]
        before = health_check_work(health_port)
        m.verdicts = asyncio.run(verdicts(plane.kubeconfig, sick))
        after = health_check_work(health_port)
        m.verdict_work = (after[0] - before[0], after[1] - before[1])
        return m


def health_check_work(port: int) -> tuple[float, float]:
    """The health check's reconciles so far (each an evaluation of a whole check) and the
    seconds they took, from metalmend's /metrics."""
    text = httpx.get(f"http://{LOOPBACK}:{port}/metrics", timeout=30).text
    count = seconds = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("controller") != "machine-health-check":
                continue
            if sample.name == "metalmend_reconcile_duration_seconds_count":
                count += sample.value
            elif sample.name == "metalmend_reconcile_duration_seconds_sum":
                seconds += sample.value
    return count, seconds


@contextlib.contextmanager
def running(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.terminate()
        process.wait(timeout=30)


# ---- the report ------------------------------------------------------------------------------


def quantiles(values: list[float]) -> str:
    if len(values) < 2:  # the 1-host lab has one Node to make unhealthy
        return f"{values[0]:.1f} (1 sample)" if values else "-"
    q = statistics.quantiles(values, n=100)
    return f"p50 {q[49]:7.1f}  p99 {q[98]:7.1f}"


def rows(m: Measurement) -> dict[str, str]:
    ours_total = sum(m.ours.values())
    ours_writes = sum(n for (v, _), n in m.ours.items() if v in AUDIT_WRITES)
    every_total = sum(m.every.values())
    every_writes = sum(n for (v, _), n in m.every.items() if v in WRITES)
    startup = sum(m.startup.values())
    return {
        "start -> every host reconciled (s)": f"{m.reconciled_after:.1f}",
        "  metalmend API requests/s meanwhile": f"{startup / m.reconciled_after:.1f}",
        f"settled: last write before {QUIET:g} s quiet, after reconciled (s)": settled(m),
        "steady window (s)": f"{m.seconds:.0f}",
        "  Nodes with a status heartbeat in it": f"{m.nodes_beat} of {m.hosts}",
        "  Node writes in it (kwok's heartbeats)": f"{heartbeats(m)}",
        "steady: metalmend API requests/s": f"{m.per_second(ours_total):.2f}",
        "steady: metalmend API writes/s": f"{m.per_second(ours_writes):.2f}",
        "steady: all identities' requests/s": f"{m.per_second(every_total):.1f}",
        "steady: all identities' writes/s": f"{m.per_second(every_writes):.1f}",
        "steady: BMC calls/s": f"{m.per_second(m.bmc_calls):.2f}",
        "steady: controller CPU (% of one core)": f"{100 * m.per_second(m.cpu_seconds):.1f}",
        "controller RSS at rest / peak (MiB)": f"{m.rss_mib:.0f} / {m.peak_rss_mib:.0f}",
        f"reboot, request -> status seen, {REBOOTS}x (ms)": quantiles(m.reboots),
        "reboot, request -> off at the BMC (ms)": quantiles(m.reboots_off),
        "health-check verdict, expiry -> remediation (ms)": quantiles(m.verdicts),
        "verdict phase: the check's evaluations / their s": (
            f"{m.verdict_work[0]:.0f} / {m.verdict_work[1]:.1f}"
        ),
    }


def settled(m: Measurement) -> str:
    if m.settled_after is None:
        return f"not within {SETTLE_WITHIN:g}"
    return f"{m.settled_after:.0f}"


def heartbeats(m: Measurement) -> int:
    """Node writes in the window, of the Node or its status (kwok's heartbeats: metalmend
    writes no Node)."""
    return sum(n for (verb, resource), n in m.every.items() if verb in WRITES
               and resource in ("nodes", "nodes/status"))  # fmt: skip


def report(small: Measurement, large: Measurement) -> None:
    print(f"metalmend at scale: {small.hosts} vs {large.hosts} hosts (Machines, kwok Nodes,"
          f" Redfish BMCs), every lab controller, poll {POLL:g}s, {WINDOW:g}s steady window")  # fmt: skip
    print(f"  client: {CLIENT_LIMITS}")
    a, b = rows(small), rows(large)
    print(f"  {'':50} {str(small.hosts) + ' host(s)':>22} {str(large.hosts) + ' hosts':>22}")
    for row in a:
        print(f"  {row:50} {a[row]:>22} {b[row]:>22}")
    for label, values in (("1", small.reboots), (str(large.hosts), large.reboots)):
        if len(values) >= 2:
            print(
                f"  reboot p99 at {label} host(s): {statistics.quantiles(values, n=100)[98]:.1f} ms"
            )
    if len(small.reboots) >= 2 and len(large.reboots) >= 2:
        ratio = (
            statistics.quantiles(large.reboots, n=100)[98]
            / statistics.quantiles(small.reboots, n=100)[98]
        )
        print(f"  reboot p99, {large.hosts} hosts / 1 host: {ratio:.2f}x (target <= 2x)")
    print(f"  metalmend's steady-state requests at {large.hosts} hosts, verb x resource (per s):")
    for (verb, resource), n in sorted(large.ours.items()):
        print(f"    {verb:>7} {resource:40} {large.per_second(n):8.2f}")
    print(f"  every identity's steady-state requests at {large.hosts} hosts, top 8 (per s):")
    for (verb, resource), n in large.every.most_common(8):
        print(f"    {verb:>7} {resource:40} {large.per_second(n):8.2f}")


def main(hosts: int = HOSTS) -> None:
    with tempfile.TemporaryDirectory(prefix="metalmend-bench-scale-") as tmp:
        print(f"scale benchmark: 1 host, then {hosts} hosts", flush=True)
        small = measure(1, Path(tmp) / "one")
        large = measure(hosts, Path(tmp) / "many")
    report(small, large)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=HOSTS)
    args = parser.parse_args()
    main(args.hosts)
